"""``python -m tests.outbox.django_migrate DATABASE_JSON``: Django's ``migrate`` of the
outbox app alone on one database (a Django ``DATABASES`` entry as JSON).

A process of its own: Django's settings are configured once per process, and the
Django test project (tests/django) configures them differently.
"""

from __future__ import annotations

import json
import sys

import django
from django.conf import settings
from django.core.management import call_command


def main(database_json: str) -> None:
    settings.configure(
        DATABASES={"default": json.loads(database_json)},
        INSTALLED_APPS=["outbox.integrations.django"],
        USE_TZ=True,
    )
    django.setup()
    call_command("migrate", "halfmoon_outbox", verbosity=0)


if __name__ == "__main__":
    main(sys.argv[1])
