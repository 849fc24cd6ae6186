"""``outbox purge`` as a real process against a broker server over TCP: pending and parked
transactions keep their rows, a dry run deletes nothing, a broker that is down leaves
transaction_log alone and fails the run unless only consumed_message was asked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, insert, select

from broker_embedded import BrokerClient, Message, Resolution, TransactionState
from outbox.integrations.sqlalchemy.tables import consumed_message, metadata, transaction_log
from outbox.schema import COMMITTED

from ..server.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
OLD = datetime.now(UTC) - timedelta(days=30)


def _purge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox.cli", "purge", "--pause", "0", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_purge_command_keeps_open_transactions_and_fails_without_a_broker(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(transaction_log), [
            {"transaction_id": tx, "producer_group": "shop", "state": COMMITTED, "created_at": OLD}
            for tx in ("parked", "pending", "done-1", "done-2")])
        conn.execute(insert(consumed_message), [
            {"consumer_group": "points", "message_id": f"m{n}", "topic": "order.paid", "consumed_at": OLD}
            for n in range(3)])

    def ids() -> set[str]:
        with engine.connect() as conn:
            return set(conn.execute(select(transaction_log.c.transaction_id)).scalars())

    def consumed() -> int:
        with engine.connect() as conn:
            return len(conn.execute(select(consumed_message.c.id)).all())

    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "0.2", "--check-interval", "0.2",
                           "--check-max", "1").start()
    try:
        with BrokerClient(server.url) as client:
            client.register_producer("shop", lambda request: None)  # takes checks, never answers
            client.send_half(Message("orders", b"p"), producer_group="shop", transaction_id="parked")
            client.send_half(Message("orders", b"q", transaction_timeout_s=3600), producer_group="shop",
                             transaction_id="pending")
            deadline = time.monotonic() + 30
            while client.transaction_state("parked") is not TransactionState.PARKED:
                assert time.monotonic() < deadline
                time.sleep(0.05)

            dry = _purge("--database-url", db_url, "--broker-url", server.url, "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert "outbox_transaction_log: 2 rows would be deleted, 2 kept (open at the broker)" in dry.stdout
            assert "outbox_consumed_message: 3 rows would be deleted" in dry.stdout
            assert len(ids()) == 4 and consumed() == 3

            done = _purge("--broker-url", server.url, "--batch-size", "1", env={"OUTBOX_DATABASE_URL": db_url})
            assert done.returncode == 0, done.stderr
            assert ids() == {"parked", "pending"} and consumed() == 0
            assert "outbox_transaction_log: 2 rows deleted in 2 batches" in done.stdout
            assert "outbox_consumed_message: 3 rows deleted in 3 batches" in done.stdout
            assert "  outbox_transaction_log: 1 rows deleted in 1 batches" in done.stdout  # progress
            client.resolve_parked("parked", force=Resolution.COMMIT)
    finally:
        server.stop()

    with engine.begin() as conn:
        conn.execute(insert(consumed_message), {"consumer_group": "points", "message_id": "late", "topic": "t",
                                                "consumed_at": OLD})
    down = _purge("--database-url", db_url, "--broker-url", server.url)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "outbox_transaction_log: skipped (the broker cannot say which transactions are open" in down.stdout
    assert ids() == {"parked", "pending"} and consumed() == 0
    only_consumed = _purge("--database-url", db_url, "--broker-url", server.url, "--table", "consumed_message")
    assert only_consumed.returncode == 0, only_consumed.stdout + only_consumed.stderr
    assert "outbox_transaction_log" not in only_consumed.stdout

    bad = _purge("--database-url", db_url, "--batch-size", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("outbox purge: batch size must be 1..10000")
    too_young = _purge("--database-url", db_url, "--transaction-log-older-than", "80s")  # the horizon: 81 s
    assert too_young.returncode == 2 and "may still be checked by the broker" in too_young.stderr
    assert ids() == {"parked", "pending"}
    engine.dispose()
