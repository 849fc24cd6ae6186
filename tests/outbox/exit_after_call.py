"""``python -m tests.outbox.exit_after_call sqlalchemy|django BROKER_URL DATABASE``: one
``@transactional_message`` call with the default producer (oneway END), its transaction id
printed, then the process exits at once: no ``close()``, no ``flush()``.

``DATABASE`` is a SQLAlchemy URL, or for Django the path of a SQLite file (migrated here).
"""

from __future__ import annotations

import sys


def sqlalchemy_call(broker_url: str, database_url: str) -> str:
    from sqlalchemy.orm import Session, sessionmaker

    from outbox import Producer, transactional_message
    from outbox.integrations.sqlalchemy.engine import create_engine
    from outbox.integrations.sqlalchemy.session import current_transaction_id
    from outbox.integrations.sqlalchemy.tables import metadata

    engine = create_engine(database_url)
    metadata.create_all(engine)

    @transactional_message(Producer(broker_url, "shop"), sessionmaker(engine), topic="order.paid")
    def pay(session: Session, order_id: str) -> str:
        return current_transaction_id(session) or ""

    return pay("o1")


def django_call(broker_url: str, sqlite_path: str) -> str:
    import django
    from django.conf import settings
    from django.core.management import call_command

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path}},
        INSTALLED_APPS=["outbox.integrations.django"], USE_TZ=True,
        OUTBOX={"BROKER_URL": broker_url, "PRODUCER_GROUP": "shop"},
    )
    django.setup()
    call_command("migrate", "halfmoon_outbox", verbosity=0)
    from outbox.integrations.django.transactional import (
        current_transaction_id,
        transactional_message,
    )

    @transactional_message(topic="order.paid")
    def pay(order_id: str) -> str:
        return current_transaction_id() or ""

    return pay("o1")


if __name__ == "__main__":
    kind, broker_url, database = sys.argv[1:]
    print((sqlalchemy_call if kind == "sqlalchemy" else django_call)(broker_url, database), flush=True)
