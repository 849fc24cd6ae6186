"""SIGKILL the producer at the dangerous points; a real Celery worker's check-back settles it.

Processes: the broker server (``python -m broker_embedded serve`` with the Celery
checker), ``celery worker`` on the group's check queue, and a producer that kills itself
(SIGKILL) either after the DB commit and before COMMIT reaches the broker, or after the
half message and before the DB commit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from broker_embedded import BrokerClient, TransactionState
from outbox.integrations.sqlalchemy.tables import metadata, transaction_log

from ..server.conftest import ServerProcess
from .async_support import async_url

PRODUCER = r"""
import os, signal
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker
from outbox import Producer, transactional_message
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.session import current_transaction_id

crash = os.environ["CRASH"]
factory = sessionmaker(create_engine(os.environ["OUTBOX_DATABASE_URL"]))

producer = Producer(os.environ["OUTBOX_BROKER_URL"], "shop")

def die(session):
    print(current_transaction_id(session), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if crash == "after_commit":
    # Registered before the outbox's own listener, so it runs first: the DB has
    # committed and COMMIT has not been sent.
    event.listen(Session, "after_commit", die)

@transactional_message(producer, factory, topic="order.paid")
def pay(session, order_id):
    if crash == "before_commit":
        # The half message leaves before BEGIN and overlaps the body: wait for the broker to
        # hold it, so the kill falls between the half message and the DB commit.
        producer.await_halves(current_transaction_id(session))
        die(session)

pay("o1")
"""


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def crash_and_recover(tmp_path: Path, db_url: str, celery_url: str, crash: str,
                      producer_script: str = PRODUCER) -> tuple[TransactionState, list[bytes], list[str]]:
    """Run the scenario with ``producer_script`` (it finds the database's async driver in
    ``OUTBOX_ASYNC_DATABASE_URL``); returns the broker's final state, the bodies consumed, DB states."""
    engine = create_engine(db_url)
    metadata.create_all(engine)
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": db_url,
        "OUTBOX_ASYNC_DATABASE_URL": async_url(db_url),
        "OUTBOX_CELERY_BROKER_URL": celery_url,
        "OUTBOX_CELERY_DATA_DIR": str(tmp_path / "celery"),
        "PYTHONUNBUFFERED": "1",
    }
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "1", "--check-interval", "1",
                           "--checker", "outbox.integrations.celery.checker:make_checker")
    worker = None
    saved_env = dict(os.environ)
    os.environ.update(env)  # the server process inherits the Celery settings
    try:
        server.start()
        env["OUTBOX_BROKER_URL"] = server.url
        with (tmp_path / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "outbox.integrations.celery.worker", "worker",
                 "-Q", "outbox.check.shop", "--pool", "threads", "-c", "2", "--loglevel", "INFO"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        producer = subprocess.run([sys.executable, "-c", producer_script], env={**env, "CRASH": crash},
                                  capture_output=True, text=True, timeout=120)
        assert producer.returncode == -9, producer.stderr
        transaction_id = producer.stdout.strip()
        with BrokerClient(server.url) as client:
            _wait(lambda: client.transaction_state(transaction_id) is not TransactionState.PENDING, 90,
                  f"the check-back of {transaction_id} (see {tmp_path / 'worker.log'})")
            bodies: list[bytes] = []
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                for received in client.receive("points", "order.paid", max_messages=10, wait_s=0.5):
                    bodies.append(received.message.body)
                    client.ack("points", received.receipt_handle)
            state = client.transaction_state(transaction_id)
        with engine.connect() as conn:
            states = list(conn.execute(select(transaction_log.c.state)).scalars())
        return state, bodies, states
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        if worker is not None:
            worker.kill()
            worker.wait()
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait()
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.slow
def test_killed_after_db_commit_is_delivered_exactly_once_via_check_back(tmp_path, durable_db) -> None:
    state, bodies, db_states = crash_and_recover(tmp_path, durable_db, "filesystem://", "after_commit")
    assert db_states == ["COMMITTED"]
    assert state is TransactionState.COMMITTED
    assert bodies == [b'{"order_id":"o1"}']


@pytest.mark.slow
def test_killed_before_db_commit_is_never_delivered(tmp_path, durable_db) -> None:
    state, bodies, db_states = crash_and_recover(tmp_path, durable_db, "filesystem://", "before_commit")
    assert db_states == ["ROLLED_BACK"]  # the checker's fence
    assert state is TransactionState.ROLLED_BACK
    assert bodies == []


@pytest.mark.slow
@pytest.mark.redis
def test_check_back_over_redis_transport(tmp_path, redis_url) -> None:
    db = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    state, bodies, _ = crash_and_recover(tmp_path, db, redis_url, "after_commit")
    assert state is TransactionState.COMMITTED and len(bodies) == 1
