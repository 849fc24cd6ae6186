"""The transaction-log recorder's contract, one test set run over each ORM's recorder
(SQLAlchemy and Django, on SQLite files): the same calls give the same answers and the
same errors whichever driver records."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from broker_embedded import Resolution
from outbox import TransactionFencedError
from outbox.idempotency import AlreadyConsumed, ConsumedRow
from outbox.integrations.django.recorder import RECORDER as DJANGO_RECORDER
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import RECORDER as SQLALCHEMY_RECORDER
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.transaction_log import TransactionLogRecorder


@dataclass
class Driver:
    """One ORM's recorder with what the contract needs around it."""

    recorder: TransactionLogRecorder[Any, Any]
    #: ``with transaction() as db:`` a caller's transaction, ``db`` what the recorder writes in
    transaction: Callable[[], AbstractContextManager[Any]]
    #: what the recorder's checks run on
    database: Any
    #: the same, for a database that cannot be opened
    unreachable: Any


@pytest.fixture(params=["sqlalchemy", "django"])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    missing = str(tmp_path / "missing" / "db.sqlite3")
    if request.param == "sqlalchemy":
        engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
        metadata.create_all(engine)
        gone = create_engine(f"sqlite:///{missing}")
        yield Driver(SQLALCHEMY_RECORDER, engine.begin, engine, gone)
        engine.dispose()
        return
    connections.settings["unreachable"] = {**connections.settings["default"], "NAME": missing}

    @contextmanager
    def atomic() -> Iterator[str]:
        with transaction.atomic(using="default"):
            yield "default"

    try:
        yield Driver(DJANGO_RECORDER, atomic, "default", "unreachable")
    finally:
        connections["unreachable"].close()
        del connections.settings["unreachable"]


def _id() -> str:
    return f"tx-{uuid.uuid4().hex[:12]}"


def test_a_committed_transaction_is_answered_commit(driver: Driver) -> None:
    tx = _id()
    with driver.transaction() as db:
        driver.recorder.record_committed(db, tx, "shop")
    assert driver.recorder.fence_and_read(driver.database, tx, "shop") is Resolution.COMMIT


def test_an_absent_transaction_is_fenced_and_can_no_longer_commit(driver: Driver) -> None:
    tx = _id()
    assert driver.recorder.fence_and_read(driver.database, tx, "shop") is Resolution.ROLLBACK
    with pytest.raises(TransactionFencedError), driver.transaction() as db:
        driver.recorder.record_committed(db, tx, "shop")
    assert driver.recorder.fence_and_read(driver.database, tx, "shop") is Resolution.ROLLBACK  # final


def test_a_running_transaction_is_answered_unknown_after_the_lock_timeout(driver: Driver) -> None:
    tx = _id()
    recorded, answered = threading.Event(), threading.Event()
    answers: list[Resolution] = []

    def producer() -> None:
        with driver.transaction() as db:
            driver.recorder.record_committed(db, tx, "shop")
            recorded.set()
            answered.wait(10)

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert recorded.wait(10)
        answers.append(driver.recorder.fence_and_read(driver.database, tx, "shop", lock_timeout_ms=100))
    finally:
        answered.set()
        thread.join(10)
    assert answers == [Resolution.UNKNOWN]
    assert driver.recorder.fence_and_read(driver.database, tx, "shop") is Resolution.COMMIT


def test_a_consumed_message_is_recorded_once(driver: Driver) -> None:
    row = ConsumedRow("points", f"msg-{uuid.uuid4().hex[:12]}", "order.paid", None)
    with driver.transaction() as db:
        driver.recorder.record_consumed(db, row)
    with pytest.raises(AlreadyConsumed), driver.transaction() as db:
        driver.recorder.record_consumed(db, row)


def test_an_unreachable_database_raises_the_orms_error_family(driver: Driver) -> None:
    with pytest.raises(driver.recorder.database_errors):
        driver.recorder.fence_and_read(driver.unreachable, _id(), "shop")
