"""``parked resolve`` against a real transaction_log, a broker server process and a
connected producer that answers check-backs by the fencing rule.

Each transaction is the phantom of issue 10: its local transaction held its
transaction_log row past every check (the checks answered UNKNOWN on the lock timeout, so
the broker parked it), then rolled back, and the producer never sent ROLLBACK. A resolve
that goes through the check rolls it back; ``--force commit`` commits it, with a warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from broker_embedded import BrokerClient, Message, Resolution, TransactionState
from outbox import Producer, check_transaction
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import ROLLED_BACK, transaction_log
from outbox.producer import TRANSACTION_ID_PROPERTY

from ..broker.crashcut import wait_until
from ..server.conftest import ServerProcess

GROUP = "shop"
TOPIC = "order.paid"


class FencedChecker:
    """The producer's check listener: the fenced transaction_log answers (UNKNOWN while
    the local transaction still holds its row)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
        raise AssertionError("not used here")

    def check_local_transaction(self, message: Message) -> Resolution:
        return check_transaction(self.engine, message.properties[TRANSACTION_ID_PROPERTY], GROUP,
                                 lock_timeout_ms=200)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "0.3", "--check-interval", "0.3",
                           "--check-max", "2").start()
    yield server
    server.stop()


@pytest.fixture
def producer(server: ServerProcess, engine: Engine) -> Iterator[Producer]:
    producer = Producer(BrokerClient(server.url), GROUP)
    producer.register_check_listener(FencedChecker(engine))
    yield producer
    producer.close()


def parked_after_rollback(engine: Engine, producer: Producer) -> str:
    """A transaction parked while its local transaction ran, which then rolled back with no
    ROLLBACK sent (the producer died)."""
    transaction_id = uuid.uuid4().hex
    producer.send_half(Message(TOPIC, transaction_id.encode()), transaction_id)
    with engine.connect() as conn:
        local = conn.begin()
        record_committed(conn, transaction_id, GROUP)
        wait_until(lambda: transaction_id in [p.transaction_id for p in producer.broker.list_parked()], 30)
        local.rollback()
    return transaction_id


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker_embedded", "parked", *args, "--url", server.url],
                          capture_output=True, text=True, timeout=60)


def test_resolve_asks_the_fenced_transaction_log_and_force_commits_with_a_warning(
    engine: Engine, server: ServerProcess, producer: Producer
) -> None:
    rolled_back = parked_after_rollback(engine, producer)
    forced = parked_after_rollback(engine, producer)
    broker = producer.broker

    refused = cli(server, "resolve", rolled_back, "commit")  # the old command no longer forces
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert broker.transaction_state(rolled_back) is TransactionState.PARKED

    resolved = cli(server, "resolve", rolled_back)
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout)["state"] == "rolled_back"
    with engine.connect() as conn:  # the check fenced the id: that transaction can never commit
        assert conn.execute(select(transaction_log.c.state)
                            .where(transaction_log.c.transaction_id == rolled_back)).scalar() == ROLLED_BACK

    forced_out = cli(server, "resolve", forced, "commit", "--force")
    assert forced_out.returncode == 0, forced_out.stderr
    assert json.loads(forced_out.stdout)["state"] == "committed"
    assert "WARNING" in forced_out.stderr and "phantom" in forced_out.stderr

    received = broker.receive("points", TOPIC, max_messages=10, wait_s=2)
    assert [r.message.body.decode() for r in received] == [forced], "only the forced one is delivered"
    assert broker.list_parked() == []


def test_resolve_without_a_checker_says_so_and_changes_nothing(
    engine: Engine, server: ServerProcess, producer: Producer
) -> None:
    transaction_id = parked_after_rollback(engine, producer)
    producer.close()  # the only producer of the group disconnects
    out = cli(server, "resolve", transaction_id, "--wait", "1")
    assert out.returncode == 2
    assert "CheckUnansweredError" in out.stderr and "nothing changed" in out.stderr
    with BrokerClient(server.url) as broker:
        assert broker.transaction_state(transaction_id) is TransactionState.PARKED
        assert broker.receive("points", TOPIC, wait_s=0.5) == []
