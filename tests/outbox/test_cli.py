"""The ``outbox`` command as a real process: consume (with SIGTERM), check, migrate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select, text

from broker_embedded import BrokerClient, Message
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import consumed_message, metadata, transaction_log

from ..server.conftest import ServerProcess

HANDLER = '''
from outbox import message_json
from sqlalchemy import text

def award(session, received):
    body = message_json(received.message)
    session.execute(text("INSERT INTO points (order_id, points) VALUES (:o, :p)"),
                    {"o": body["order"], "p": body["amount"]})
'''


def _outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.slow
def test_consume_is_idempotent_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'member.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE points (order_id VARCHAR(32), points INTEGER)"))
    (tmp_path / "member_handlers.py").write_text(HANDLER)
    server = ServerProcess(tmp_path / "broker").start()
    consumer = None
    try:
        with BrokerClient(server.url) as client:
            client.send(Message("order.paid", b'{"order": "o1", "amount": 100}', message_id="m1", tag="card"))
            # The same message id again: a redelivery from the consumer's point of view.
            client.send(Message("order.paid", b'{"order": "o1", "amount": 100}', message_id="m1", tag="card"))
            client.send(Message("order.paid", b'{"order": "o2", "amount": 7}', message_id="m2", tag="voucher"))
            # not the group's tags (--filter): consumed for the group without the handler
            client.send(Message("order.paid", b'{"order": "o3", "amount": 1}', message_id="m3", tag="test"))
        env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        log = (tmp_path / "consumer.log").open("w")
        consumer = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "consume", "--group", "points", "--topic", "order.paid",
             "--handler", "member_handlers:award", "--database-url", db_url, "--broker-url", server.url,
             "--filter", "card || voucher"],
            env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + 60
        with engine.connect() as conn:
            while time.monotonic() < deadline:
                if conn.execute(select(consumed_message.c.message_id)).scalars().all() == ["m1", "m2"]:
                    break
                time.sleep(0.2)
        with BrokerClient(server.url) as client:  # everything acked: nothing comes back
            deadline = time.monotonic() + 60
            while client.stats().consumer_lag.get("points", {}).get("order.paid", 0) and time.monotonic() < deadline:
                time.sleep(0.2)
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(30) == 0
        output = (tmp_path / "consumer.log").read_text()
        assert "already consumed" in output and "stopped after" in output
        with engine.connect() as conn:
            assert sorted(conn.execute(text("SELECT order_id, points FROM points")).all()) == [("o1", 100), ("o2", 7)]
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        server.kill()
        engine.dispose()


def test_check_answers_by_the_fence_and_migrate_creates_the_tables(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    result = _outbox("migrate", "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    engine = create_engine(db_url)
    assert {"outbox_transaction_log", "outbox_consumed_message"} <= set(inspect(engine).get_table_names())
    with engine.begin() as conn:
        record_committed(conn, "tx-done", "shop")
    assert _outbox("check", "tx-done", "--group", "shop", "--database-url", db_url).stdout.strip() == "COMMIT"
    assert _outbox("check", "tx-never", "--group", "shop", "--database-url", db_url).stdout.strip() == "ROLLBACK"
    with engine.connect() as conn:
        assert dict(conn.execute(select(transaction_log.c.transaction_id, transaction_log.c.state)).all()) == {
            "tx-done": "COMMITTED", "tx-never": "ROLLED_BACK"}
    engine.dispose()


def test_check_send_tells_the_broker(tmp_path: Path) -> None:
    from broker_embedded import EmbeddedBroker, TransactionState

    db_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        record_committed(conn, "tx-sent", "shop")
    broker = EmbeddedBroker(tmp_path / "broker")
    broker.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id="tx-sent")
    broker.close()
    result = _outbox("check", "tx-sent", "--group", "shop", "--database-url", db_url, "--send",
                     "--broker-url", f"embedded://{tmp_path / 'broker'}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "COMMIT"
    broker = EmbeddedBroker(tmp_path / "broker")
    try:
        assert broker.transaction_state("tx-sent") is TransactionState.COMMITTED
    finally:
        broker.close()
        engine.dispose()


def test_a_malformed_filter_is_a_usage_error() -> None:
    result = _outbox("consume", "--group", "points", "--topic", "order.paid", "--handler", "h:award",
                     "--filter", "card ||")
    assert result.returncode == 2
    assert "not a TAG expression" in result.stderr and "Traceback" not in result.stderr
    sql = _outbox("consume", "--group", "points", "--topic", "order.paid", "--handler", "h:award",
                  "--filter", "amount >", "--filter-type", "SQL92")
    assert sql.returncode == 2
    assert "--filter: InvalidMessageError" in sql.stderr and "Traceback" not in sql.stderr


def test_bad_settings_are_a_clear_error_not_a_traceback() -> None:
    result = _outbox("check", "tx", "--group", "shop",
                     env={**os.environ, "OUTBOX_CHECK_LOCK_TIMEOUT_MS": "soon"})
    assert result.returncode == 2
    assert "bad outbox setting" in result.stderr and "Traceback" not in result.stderr
