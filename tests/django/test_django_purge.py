"""``manage.py outbox_purge`` and the Django purge task on SQLite and PostgreSQL: pending
and parked transactions keep their rows, a dry run deletes nothing, a broker that is down
leaves transaction_log alone and fails the command."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker_embedded import Message
from outbox.idempotency import ConsumedRow
from outbox.integrations.celery.purge import purge_summary
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import ConsumedMessage, TransactionLog
from outbox.integrations.django.recorder import alias_sql, run
from outbox.integrations.django.retention import purge_project
from outbox.retention import PurgeOptions
from outbox.schema import COMMITTED
from outbox.transaction_log import row_params
from tests.django.support import park
from tests.ports import free_port


@pytest.fixture
def rows(tmp_path: Path, alias: str) -> Iterator[dict[str, str]]:
    """On ``alias``: month-old rows of a parked, a pending and a committed transaction, a
    young one, and consumed messages of 8 days and of now; group ``shop`` owned there."""
    ids = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in ("parked", "pending", "committed", "young")}
    park(tmp_path / "broker", {ids["parked"]: "shop"})
    now, month = timezone.now(), timedelta(days=30)
    TransactionLog.objects.using(alias).bulk_create([
        TransactionLog(transaction_id=tx, producer_group="shop", state=TransactionLog.COMMITTED,
                       created_at=now if name == "young" else now - month)
        for name, tx in ids.items()])
    ConsumedMessage.objects.using(alias).bulk_create([
        ConsumedMessage(consumer_group="points", message_id=message_id, topic="order.paid", consumed_at=now - age)
        for message_id, age in (("old", timedelta(days=8)), ("new", timedelta(0)))])
    outbox = {"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop",
              "PRODUCER_GROUPS": {"shop": alias}}
    with override_settings(OUTBOX=outbox):
        producer().broker.send_half(Message("order.paid", b"{}", transaction_timeout_s=3600),
                                    producer_group="shop", transaction_id=ids["pending"])
        yield ids


def _left(alias: str) -> tuple[set[str], set[str]]:
    return (set(TransactionLog.objects.using(alias).values_list("transaction_id", flat=True)),
            set(ConsumedMessage.objects.using(alias).values_list("message_id", flat=True)))


def test_outbox_purge_keeps_open_transactions(rows: dict[str, str], alias: str) -> None:
    out = io.StringIO()
    call_command("outbox_purge", "--database", alias, "--dry-run", stdout=out)
    assert "outbox_transaction_log: 1 rows would be deleted, 2 kept (open at the broker)" in out.getvalue()
    assert "outbox_consumed_message: 1 rows would be deleted" in out.getvalue()
    assert len(_left(alias)[0]) == 4

    out = io.StringIO()
    call_command("outbox_purge", "--database", alias, "--batch-size", "1", "--pause", "0", stdout=out)
    assert _left(alias) == ({rows["parked"], rows["pending"], rows["young"]}, {"new"})
    assert f"database {alias!r}:" in out.getvalue()
    assert "outbox_transaction_log: 1 rows deleted in 1 batches" in out.getvalue()

    # what the Celery beat task runs (the task itself runs in a real worker in
    # tests/outbox/test_purge_celery.py; importing its module here would register its shared
    # tasks in every Celery app this test process makes later): the project's purge by
    # OUTBOX["RETENTION"]
    retention = {"TRANSACTION_TIMEOUT_S": 0, "CHECK_INTERVAL_S": 0, "MARGIN_S": 0, "DEDUP_WINDOW_S": 0}
    with override_settings(OUTBOX={**settings.OUTBOX, "RETENTION": retention}):
        summary = purge_summary(purge_project(PurgeOptions(pause_s=0)))
    assert summary["rows"][f"database {alias!r}"] == {"outbox_transaction_log": 1, "outbox_consumed_message": 1,
                                                          "outbox_stored_message": 0}
    assert _left(alias) == ({rows["parked"], rows["pending"]}, set())


def test_outbox_purge_without_the_broker_fails_and_keeps_the_transaction_log(rows: dict[str, str],
                                                                          alias: str) -> None:
    down = {"BROKER_URL": f"tcp://127.0.0.1:{free_port()}", "PRODUCER_GROUP": "shop",
            "PRODUCER_GROUPS": {"shop": alias}}
    with override_settings(OUTBOX=down):
        out = io.StringIO()
        with pytest.raises(CommandError, match="not purged: outbox_transaction_log"):
            call_command("outbox_purge", "--database", alias, "--pause", "0", stdout=out)
        assert "skipped (the broker cannot say which transactions are open" in out.getvalue()
        assert _left(alias) == (set(rows.values()), {"new"})
        call_command("outbox_purge", "--database", alias, "--table", "consumed_message", stdout=io.StringIO())


def test_rows_are_stamped_by_the_databases_clock_even_through_the_debug_cursor(alias: str) -> None:
    """The framework's inserts carry the database's clock (no host timestamp), and their
    SQL survives Django's debug cursor, which formats each statement with ``%``."""
    connection = connections[alias]
    sql = alias_sql(connection)
    with CaptureQueriesContext(connection) as queries, transaction.atomic(using=alias):
        run(connection, sql.record_transaction, row_params("stamped", "shop", COMMITTED))
        run(connection, sql.record_consumed, ConsumedRow("points", "m-stamped", "order.paid", "stamped").params())
    assert len(queries.captured_queries) >= 2
    stamps = [TransactionLog.objects.using(alias).get(transaction_id="stamped").created_at,
              ConsumedMessage.objects.using(alias).get(message_id="m-stamped").consumed_at]
    assert all(abs(stamp - timezone.now()) < timedelta(minutes=1) for stamp in stamps), stamps
