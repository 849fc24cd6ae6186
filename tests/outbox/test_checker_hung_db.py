"""The Celery checker against a database that hangs (issue 10, finding 10).

A check-back's database work is bounded: connecting gives up after
``OUTBOX_CHECK_CONNECT_TIMEOUT_S``, each statement after ``OUTBOX_CHECK_STATEMENT_TIMEOUT_MS``;
the check then answers UNKNOWN (the broker asks again later), and a worker whose threads
were all stuck in the database still stops on SIGTERM. Real ``celery worker`` processes
on Redis, a real TCP listener that never answers, a real PostgreSQL with a lock held.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from broker_embedded import CheckRequest, Message, Resolution
from outbox.integrations.celery import check_queue
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.checker import CeleryChecker
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import check_transaction, record_committed
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.settings import OutboxSettings
from tests.ports import free_port

from .celery_workers import CeleryWorker, wait_until

THREADS = 4


class SilentDatabase:
    """A TCP listener that accepts connections and never sends a byte."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.connections.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()


class Worker(CeleryWorker):
    """The standalone checker app's worker on one producer group's check queue."""

    def __init__(self, tmp_path: Path, redis_url: str, group: str, database_url: str, **env: str) -> None:
        self.settings = OutboxSettings(celery_broker_url=redis_url)
        super().__init__(tmp_path / f"worker-{group}.log", "outbox.integrations.celery.worker",
                         [check_queue(group)], {
                             "OUTBOX_CELERY_BROKER_URL": redis_url,
                             "OUTBOX_GROUP_DATABASES": json.dumps({group: database_url}),
                             "OUTBOX_BROKER_URL": f"tcp://127.0.0.1:{free_port()}",  # UNKNOWN sends nothing
                             **env,
                         }, threads=THREADS)

    def unknown_answers(self) -> int:
        """Checks the worker finished with UNKNOWN, as Celery logs each task's result."""
        return self.count(r"succeeded in [0-9.]+s: 'unknown'")


@pytest.fixture
def worker_factory(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(group: str, database_url: str, **env: str) -> Worker:
        worker = Worker(tmp_path, redis_url, group, database_url, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def _request_checks(worker: Worker, group: str, transaction_ids: list[str]) -> None:
    """Enqueue check-backs the way the broker's Celery checker does."""
    checker = CeleryChecker(make_app(worker.settings))
    for transaction_id in transaction_ids:
        assert checker.request_check(CheckRequest(group, transaction_id, Message("order.paid", b"{}"), 1))


@pytest.mark.slow
@pytest.mark.redis
def test_a_database_that_never_answers_times_out_and_the_worker_still_stops(worker_factory) -> None:
    database = SilentDatabase()
    group = f"hung-{uuid.uuid4().hex[:8]}"
    try:
        worker = worker_factory(group, f"postgresql+psycopg://postgres@127.0.0.1:{database.port}/shop",
                                OUTBOX_CHECK_CONNECT_TIMEOUT_S="3")
        _request_checks(worker, group, [f"tx-{n}" for n in range(THREADS)])
        wait_until(lambda: len(database.connections) >= THREADS, 60,
              f"all {THREADS} worker threads to be stuck in the silent database")
        assert worker.stop() == 0
        assert worker.unknown_answers() == THREADS, "every stuck check answered UNKNOWN"
    finally:
        database.close()


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
def test_a_check_blocked_by_a_lock_answers_unknown_at_the_statement_timeout(worker_factory,
                                                                           postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    metadata.create_all(engine)
    group = f"locked-{uuid.uuid4().hex[:8]}"
    try:
        with engine.connect() as holder, holder.begin():  # a local transaction that never ends
            for n in range(THREADS):
                record_committed(holder, f"tx-{n}", group)
            # The lock timeout is no bound here: the statement timeout must be.
            worker = worker_factory(group, postgres_url, OUTBOX_CHECK_LOCK_TIMEOUT_MS="600000",
                                    OUTBOX_CHECK_STATEMENT_TIMEOUT_MS="1000")
            _request_checks(worker, group, [f"tx-{n}" for n in range(THREADS)])
            wait_until(lambda: worker.unknown_answers() == THREADS, 60,
                  f"the blocked checks to answer UNKNOWN (see {worker.log})")
            assert worker.stop() == 0
        # The fence was not broken: the local transaction's commit still wins the next check.
        assert check_transaction(engine, "tx-0", group) is Resolution.COMMIT
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_check_transaction_gives_up_at_the_statement_timeout(postgres_url: str) -> None:
    engine: Engine = create_engine(postgres_url)
    metadata.create_all(engine)
    try:
        with engine.connect() as holder, holder.begin():
            record_committed(holder, "tx-held", "shop")
            answer = check_transaction(engine, "tx-held", "shop", lock_timeout_ms=600_000,
                                       statement_timeout_ms=500)
            assert answer is Resolution.UNKNOWN
    finally:
        engine.dispose()
