"""Configure the Django test project once per run and migrate its databases."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator

import django
import pytest

from broker_embedded import EmbeddedBroker, Resolution
from tests.conftest import POSTGRES_ADMIN_URL, unavailable

PG_NAME = f"hm_django_{uuid.uuid4().hex[:10]}"


def _postgres_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


# Settings are read once per process, so Django is set up when this conftest is imported
# (before the test modules import models); the databases are made in the fixture.
HAS_POSTGRES = _postgres_answers()
# A directory of this process's own (an xdist worker's, when the controller made one too),
# which the settings and the run's subprocesses (Celery workers, manage.py) read.
os.environ["HALFMOON_DJANGO_TEST_DIR"] = tempfile.mkdtemp(
    prefix="hm-django-", dir=os.environ.get("HALFMOON_DJANGO_TEST_DIR"))
if HAS_POSTGRES:
    os.environ["HALFMOON_DJANGO_PG_NAME"] = PG_NAME
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.settings"
django.setup()
# The settings are loaded now. Left in the environment, the variable would reach every
# subprocess of the run: the Celery workers' Django fixup and the users' manage.py
# (``setdefault``) would take this project's settings for their own.
del os.environ["DJANGO_SETTINGS_MODULE"]


@pytest.fixture(scope="session", autouse=True)
def django_project() -> Iterator[bool]:
    """Migrated databases: a fresh SQLite file, and a fresh PostgreSQL database as ``pg``."""
    from django.core.management import call_command

    has_pg = HAS_POSTGRES
    if has_pg:
        import psycopg

        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{PG_NAME}"')
    call_command("migrate", verbosity=0)
    if has_pg:
        call_command("migrate", database="pg", verbosity=0)
    yield has_pg
    from django.db import connections

    from outbox.integrations.django.conf import producer

    producer().broker.close()
    connections.close_all()
    if has_pg:
        import psycopg

        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')


@pytest.fixture(params=["default", pytest.param("pg", marks=pytest.mark.postgres)])
def alias(request: pytest.FixtureRequest, django_project: bool) -> Iterator[str]:
    """Each database alias, emptied before the test."""
    if request.param == "pg" and not django_project:
        unavailable("PostgreSQL is not answering on 127.0.0.1:5432")
    from outbox.integrations.django.models import ConsumedMessage, TransactionLog
    from tests.django.shop.models import Account, Points

    for model in (TransactionLog, ConsumedMessage, Account, Points):
        model.objects.using(request.param).all().delete()
    Account.objects.using(request.param).create(name="alice", balance=500)
    yield request.param


@pytest.fixture(autouse=True)
def no_transaction_left_open() -> Iterator[None]:
    """A test leaves no transaction open in the project's broker (``OUTBOX`` as the settings
    module has it, shared by the worker's tests): its check-back would come due during a later
    test and write a fence into that test's database."""
    yield
    from outbox.integrations.django.conf import _producer

    if _producer.cache_info().currsize == 0:
        return
    broker = _producer().broker
    if isinstance(broker, EmbeddedBroker) and not broker.closed:
        left = broker.open_transactions()
        for transaction_id in left:  # rolled back here, so that only the test that left them fails
            opened = broker.open_transaction(transaction_id)
            if opened is not None:
                broker.end_transaction(transaction_id, Resolution.ROLLBACK, producer_group=opened.producer_group)
        assert not left, f"transactions left open in the project's broker (end them): {left}"
