"""The purge on PostgreSQL with a million rows per table: each batch goes through the new
indexes (no Seq Scan in its plan), and producers writing transaction_log and
consumed_message rows all through the purge, each transaction with ``SET LOCAL
lock_timeout = '50ms'``, never wait that long on it (no timing is asserted: a wait past
50 ms would fail their statement). Their latencies are measured in benchmarks/purge.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from broker_embedded import EmbeddedBroker, Message
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import record_committed, run, sql_for
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.retention import PurgeOptions, PurgeSQL, RetentionPolicy
from outbox.schema import (
    CONSUMED_MESSAGE,
    CONSUMED_MESSAGE_CONSUMED_AT_INDEX,
    STORED_MESSAGE,
    TRANSACTION_LOG,
    TRANSACTION_LOG_CREATED_AT_INDEX,
)

pytestmark = pytest.mark.postgres

ROWS = 1_000_000
#: The oldest tenth of each table is past retention (a month old); the rest is an hour old.
OLD = ROWS // 10
FILL = {
    TRANSACTION_LOG: f"""INSERT INTO {TRANSACTION_LOG} (transaction_id, producer_group, state, created_at)
        SELECT 'tx-' || g, 'shop', 'COMMITTED',
               CASE WHEN g <= {OLD} THEN now() - interval '30 days' ELSE now() - interval '1 hour' END
               + g * interval '1 microsecond'
        FROM generate_series(1, {ROWS}) AS g""",
    CONSUMED_MESSAGE: f"""INSERT INTO {CONSUMED_MESSAGE} (consumer_group, message_id, topic, consumed_at)
        SELECT 'points', 'm-' || g, 'order.paid',
               CASE WHEN g <= {OLD} THEN now() - interval '30 days' ELSE now() - interval '1 hour' END
               + g * interval '1 microsecond'
        FROM generate_series(1, {ROWS}) AS g""",
}


@pytest.fixture
def big(postgres_url: str) -> Iterator[Engine]:
    """A fresh database with a million rows in each framework table."""
    engine = create_engine(postgres_url, pool_size=8)
    metadata.create_all(engine)
    indexes = [index for table in metadata.tables.values() for index in table.indexes]
    with engine.begin() as conn:  # the retention indexes built once after the rows, not row by row
        for index in indexes:
            index.drop(conn)
        for fill in FILL.values():
            conn.execute(text(fill))
        for index in indexes:
            index.create(conn)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"ANALYZE {TRANSACTION_LOG}"))
        conn.execute(text(f"ANALYZE {CONSUMED_MESSAGE}"))
    yield engine
    engine.dispose()


def _plan(engine: Engine, statement: str, params: list[object]) -> str:
    with engine.begin() as conn:
        return "\n".join(row[0] for row in run(conn, f"EXPLAIN {statement}", params))


def test_batches_use_the_indexes_and_never_hold_up_producers(big: Engine, broker: EmbeddedBroker) -> None:
    statements = PurgeSQL(sql_for(big))
    with big.connect() as conn:
        moment = conn.execute(text("SELECT now() - interval '7 days'")).scalar_one()
        cursor = conn.execute(text(f"SELECT created_at FROM {TRANSACTION_LOG} WHERE transaction_id = 'tx-50000'")
                              ).scalar_one()
    plans = {
        "old transactions": _plan(big, statements.old_transactions([]), [moment, 1000]),
        "old transactions after": _plan(big, statements.old_transactions([], after=True),
                                        [moment, cursor, cursor, "tx-50000", 1000]),
        "delete transactions": _plan(big, statements.delete_transactions(1000),
                                     [moment, *(f"tx-{n}" for n in range(1, 1001))]),
        "delete consumed": _plan(big, statements.delete_consumed, [moment, 1000]),
    }
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"
    assert TRANSACTION_LOG_CREATED_AT_INDEX in plans["old transactions"]
    assert TRANSACTION_LOG_CREATED_AT_INDEX in plans["old transactions after"]
    assert CONSUMED_MESSAGE_CONSUMED_AT_INDEX in plans["delete consumed"]

    # one of the old rows belongs to a transaction still pending at the broker
    broker.send_half(Message("orders", b"x"), producer_group="shop", transaction_id="tx-7")

    stop = threading.Event()
    committed = [0, 0]
    failures: list[BaseException] = []

    def produce(slot: int) -> None:
        """Like the real producer: the transaction_log row first, then its writes; and a
        consumer's consumed_message row; each transaction waits at most 50 ms on a lock."""
        sql = sql_for(big)
        while not stop.is_set():
            transaction_id = uuid.uuid4().hex
            try:
                with big.begin() as conn:
                    run(conn, "SET LOCAL lock_timeout = '50ms'", [])
                    record_committed(conn, transaction_id, "shop")
                    run(conn, sql.record_consumed, ["points", transaction_id, "order.paid", transaction_id])
                committed[slot] += 1
            except Exception as exc:  # any failure, a lock timeout above all, fails the test
                failures.append(exc)
                return

    producers = [threading.Thread(target=produce, args=(slot,)) for slot in range(2)]
    for thread in producers:
        thread.start()
    try:
        report = purge_engine(big, RetentionPolicy(), broker.open_transactions, PurgeOptions(pause_s=0))
        during = sum(committed)
    finally:
        stop.set()
        for thread in producers:
            thread.join(30)
    assert failures == []
    assert during > 0  # the producers did run through the purge
    assert report.rows() == {TRANSACTION_LOG: OLD - 1, CONSUMED_MESSAGE: OLD, STORED_MESSAGE: 0}
    assert report.tables[0].kept_open == 1 and report.tables[0].batches >= OLD // 1000
    with big.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {TRANSACTION_LOG} WHERE transaction_id = 'tx-7'")).scalar() == 1
        left = conn.execute(text(f"SELECT count(*) FROM {CONSUMED_MESSAGE}")).scalar_one()
    assert left == ROWS - OLD + sum(committed)
