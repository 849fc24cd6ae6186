"""A Django project's check-back meets its own database's errors: the Celery task answers
UNKNOWN (the broker asks again) for Django's ``DatabaseError`` family, as the producer
does, instead of failing the task.

The task runs in a process of its own: importing ``outbox.integrations.django.tasks``
registers a shared task named ``outbox.check_transaction`` in every Celery app of the
process, which would shadow the tasks other tests register in theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker_embedded import Resolution

ROOT = Path(__file__).resolve().parents[2]

TASK = """
import sys
import django
from django.conf import settings

folder = sys.argv[1]
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "outbox.integrations.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": folder + "/db.sqlite3"},
               "unreachable": {"ENGINE": "django.db.backends.sqlite3", "NAME": folder + "/missing/db.sqlite3"}},
    OUTBOX={"BROKER_URL": "embedded://" + folder + "/broker", "PRODUCER_GROUP": "shop",
            "PRODUCER_GROUPS": {"far": "unreachable"}, "ANSWER_CHECK_BACKS": False},
    USE_TZ=True,
)
django.setup()
from outbox.integrations.django.tasks import check_transaction_task

print(check_transaction_task("far", "tx-1", "msg-1"))
"""


def test_the_check_task_answers_unknown_when_the_groups_database_is_unreachable(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run([sys.executable, "-c", TASK, str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == Resolution.UNKNOWN.value
