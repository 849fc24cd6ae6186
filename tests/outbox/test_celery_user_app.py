"""The check task in the user's own Celery app (``register(app)``), run by a real
``celery worker`` on Redis, answering real check-backs of a real broker server; and the
checks' expiry: a worker that starts late runs the fresh checks only."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, select

from broker_embedded import BrokerClient, CheckRequest, Message, TransactionState
from outbox.integrations.celery import check_queue
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.checker import CeleryChecker
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import metadata, transaction_log
from outbox.settings import OutboxSettings

from ..server.conftest import ServerProcess
from .celery_workers import CeleryWorker, wait_until

#: The user's Celery app: their own configuration and tasks, plus the outbox's check task.
USER_APP = '''
import os
from celery import Celery
from outbox.integrations.celery import register

app = Celery("shop", broker=os.environ["SHOP_CELERY_URL"])
app.conf.broker_connection_retry_on_startup = True

@app.task(name="shop.ping")
def ping():
    return "pong"

check_transaction = register(app)
'''

FINAL = (TransactionState.COMMITTED, TransactionState.ROLLED_BACK)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def user_worker(tmp_path: Path, celery_url: str, database: Engine) -> Iterator[Callable[[str, str], CeleryWorker]]:
    """Starts ``celery -A userapp worker`` on the default queue and a group's check queue."""
    (tmp_path / "userapp.py").write_text(USER_APP)
    started: list[CeleryWorker] = []

    def start(group: str, broker_url: str) -> CeleryWorker:
        worker = CeleryWorker(tmp_path / "worker.log", "userapp", ["celery", check_queue(group)], {
            "SHOP_CELERY_URL": celery_url,
            "OUTBOX_BROKER_URL": broker_url,
            "OUTBOX_DATABASE_URL": database.url.render_as_string(hide_password=False),
        }, cwd=tmp_path)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def server(tmp_path: Path, celery_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    """A broker server whose check-backs go out as Celery tasks on ``celery_url``."""
    monkeypatch.setenv("OUTBOX_CELERY_BROKER_URL", celery_url)  # the server inherits it
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "1", "--check-interval", "1",
                           "--checker", "outbox.integrations.celery.checker:make_checker").start()
    yield server
    server.kill()


def _check(group: str, transaction_id: str) -> CheckRequest:
    return CheckRequest(group, transaction_id, Message("order.paid", b"{}"), 1)


def _logged_states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(transaction_log.c.transaction_id, transaction_log.c.state)).all())


@pytest.mark.slow
@pytest.mark.redis
def test_the_users_app_answers_check_backs_of_crashed_transactions(server, user_worker, database,
                                                                   celery_url: str) -> None:
    group = f"shop-{uuid.uuid4().hex[:8]}"
    with BrokerClient(server.url) as client:
        # Two producers crashed without ending their transactions: one after its DB commit,
        # one before.
        for transaction_id in ("tx-committed", "tx-lost"):
            client.send_half(Message("order.paid", transaction_id.encode()), producer_group=group,
                             transaction_id=transaction_id)
        with database.begin() as conn:
            record_committed(conn, "tx-committed", group)
        worker = user_worker(group, server.url)
        Celery("client", broker=celery_url).send_task("shop.ping")  # the app's own task, same worker
        wait_until(lambda: all(client.transaction_state(t) in FINAL for t in ("tx-committed", "tx-lost")),
                   90, f"the check-backs (see {worker.log})")
        assert client.transaction_state("tx-committed") is TransactionState.COMMITTED
        assert client.transaction_state("tx-lost") is TransactionState.ROLLED_BACK
        received = client.receive("points", "order.paid", max_messages=10, wait_s=2)
        assert [item.message.body for item in received] == [b"tx-committed"]
    assert _logged_states(database) == {"tx-committed": "COMMITTED", "tx-lost": "ROLLED_BACK"}  # the fence
    wait_until(lambda: worker.count(r"shop\.ping\[[^\]]+\] succeeded") == 1, 30, "the app's own task")


@pytest.mark.slow
@pytest.mark.redis
def test_a_worker_that_starts_late_runs_only_the_checks_that_have_not_expired(tmp_path: Path, user_worker,
                                                                              database, celery_url: str) -> None:
    group = f"late-{uuid.uuid4().hex[:8]}"
    stale = [f"tx-stale-{n}" for n in range(5)]
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()  # no checks of its own
    try:
        with BrokerClient(server.url) as client:
            for transaction_id in [*stale, "tx-fresh"]:
                client.send_half(Message("order.paid", b"{}"), producer_group=group, transaction_id=transaction_id)
            app = make_app(OutboxSettings(celery_broker_url=celery_url))
            for transaction_id in stale:  # no worker yet: they wait in Redis, then expire
                assert CeleryChecker(app, expires_s=1).request_check(_check(group, transaction_id))
            time.sleep(1.5)
            assert CeleryChecker(app, expires_s=60).request_check(_check(group, "tx-fresh"))
            worker = user_worker(group, server.url)
            wait_until(lambda: client.transaction_state("tx-fresh") is TransactionState.ROLLED_BACK, 60,
                       f"the fresh check (see {worker.log})")
            wait_until(lambda: worker.count(r"Discarding revoked task: outbox\.check_transaction") == len(stale),
                       30, f"the stale checks to be discarded (see {worker.log})")
            assert {client.transaction_state(t) for t in stale} == {TransactionState.PENDING}
        assert _logged_states(database) == {"tx-fresh": "ROLLED_BACK"}, "the fence ran for the fresh check only"
    finally:
        server.kill()
