"""Retention against a live broker whose producers' clocks are wrong (issue 21, finding 1).

Processes: ``halfmoon-broker serve`` with short transaction timeouts, a check-back path
(``answer_check_backs`` on a producer connection of the test's own, the fence on the
database), producers in processes of their own whose wall clock is off
(``tests.outbox.skewed_producer``) and that are SIGKILLed, and the purge: ``outbox purge``
as a process, or ``purge_engine`` in a loop. Whatever the clocks say, no row of a
transaction the broker may still check is deleted: every committed order's message is
delivered and no rolled-back one's.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, MetaData, String, Table, func, insert, select

from broker_embedded import BrokerClient, TransactionState
from outbox import Producer
from outbox.integrations.sqlalchemy.check_back import answer_check_backs
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import metadata, transaction_log
from outbox.retention import PurgeOptions, RetentionPolicy
from outbox.schema import COMMITTED, TRANSACTION_LOG
from outbox.settings import OutboxSettings

from ..server.conftest import ServerProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ORDERS = Table("orders", MetaData(), Column("order_id", String(64), primary_key=True))


def _wait(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Shop:
    """The database (framework tables and ``orders``), the broker server with the given
    check timings, and a check-back path answering group ``shop`` by the fence."""

    def __init__(self, tmp_path: Path, db_url: str, timeout_s: float, interval_s: float, check_max: int) -> None:
        self.tmp_path, self.db_url = tmp_path, db_url
        self.engine = create_engine(db_url)
        metadata.create_all(self.engine)
        ORDERS.create(self.engine)
        self.policy = RetentionPolicy(transaction_timeout_s=timeout_s, check_interval_s=interval_s,
                                      check_max=check_max)
        self.server = ServerProcess(tmp_path / "broker", "--transaction-timeout", str(timeout_s),
                                    "--check-interval", str(interval_s), "--check-max", str(check_max)).start()
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OUTBOX_DATABASE_URL": db_url,
                    "OUTBOX_BROKER_URL": self.server.url,
                    "OUTBOX_BROKER_TRANSACTION_TIMEOUT_S": str(timeout_s),
                    "OUTBOX_BROKER_CHECK_INTERVAL_S": str(interval_s), "OUTBOX_BROKER_CHECK_MAX": str(check_max)}
        self.checker = Producer(self.server.url, "shop")
        answer_check_backs(self.checker, settings=OutboxSettings(broker_url=self.server.url, database_url=db_url))
        self.client = BrokerClient(self.server.url)
        self.processes: list[subprocess.Popen[str]] = []

    def producer(self, skew_s: float, **env: str) -> subprocess.Popen[str]:
        """A producer process (``tests.outbox.skewed_producer``) whose clock is ``skew_s`` off."""
        process = subprocess.Popen([sys.executable, "-m", "tests.outbox.skewed_producer"], text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env={**self.env, "CLOCK_SKEW_S": str(skew_s), **env})
        self.processes.append(process)
        return process

    def settled(self) -> bool:
        """Nothing of group ``shop`` is open at the broker any more."""
        return not self.client.open_transactions("shop")

    def delivered(self) -> list[str]:
        """The order ids of every message on ``order.paid`` (a fresh consumer group)."""
        ids: list[str] = []
        while received := self.client.receive("audit", "order.paid", max_messages=100, wait_s=0.5):
            for message in received:
                ids.append(json.loads(message.message.body)["order_id"])
                self.client.ack("audit", message.receipt_handle)
        return ids

    def committed_orders(self) -> set[str]:
        with self.engine.connect() as conn:
            return set(conn.execute(select(ORDERS.c.order_id)).scalars())

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        self.client.close()
        self.checker.close()
        self.server.kill()
        self.engine.dispose()


@contextmanager
def shop(tmp_path: Path, db_url: str, timeout_s: float, interval_s: float, check_max: int) -> Iterator[Shop]:
    opened = Shop(tmp_path, db_url, timeout_s, interval_s, check_max)
    try:
        yield opened
    finally:
        opened.close()


def _history(engine: Engine, count: int, age: timedelta) -> None:
    """``count`` rows of long resolved transactions, about ``age`` old."""
    old = datetime.now(UTC) - age
    with engine.begin() as conn:
        conn.execute(insert(transaction_log), [
            {"transaction_id": f"old-{n}", "producer_group": "shop", "state": COMMITTED,
             "created_at": old + timedelta(milliseconds=n)} for n in range(count)])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def live_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))


def test_a_purge_never_deletes_the_row_of_a_transaction_committed_by_a_producer_whose_clock_is_behind(
        tmp_path: Path, live_db: str) -> None:
    """The issue's repro: 400 rows two minutes old, ``outbox purge
    --transaction-log-older-than 60s --batch-size 10``; once it deletes, a producer whose
    clock is 10 minutes behind commits an order and is SIGKILLed before END. Its row stays
    and the check-back commits the message."""
    with shop(tmp_path, live_db, timeout_s=2, interval_s=1, check_max=3) as live:
        _history(live.engine, 400, timedelta(minutes=2))
        producer = live.producer(-600, WAIT_FOR_GO="1", ORDERS="1", KILL_AT="1")
        assert producer.stdout is not None and producer.stdin is not None
        assert producer.stdout.readline().strip() == "ready"

        purge = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "purge", "--database-url", live_db, "--broker-url", live.server.url,
             "--table", "transaction_log", "--transaction-log-older-than", "60s", "--batch-size", "10",
             "--pause", "0.1"], env=live.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        live.processes.append(purge)

        def rows() -> int:
            with live.engine.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(transaction_log)).scalar_one())

        _wait(lambda: rows() < 400, 30, "the purge's first batch")
        producer.stdin.write("go\n")
        producer.stdin.flush()
        transaction_id = producer.stdout.readline().strip()
        assert producer.wait(30) == -9 and transaction_id
        output, _ = purge.communicate(timeout=60)
        assert purge.returncode == 0, output

        _wait(lambda: live.client.transaction_state(transaction_id) is not TransactionState.PENDING, 30,
              f"the check-back of {transaction_id}")
        assert live.client.transaction_state(transaction_id) is TransactionState.COMMITTED
        with live.engine.connect() as conn:
            left = dict(conn.execute(select(transaction_log.c.transaction_id, transaction_log.c.state)).all())
        assert left == {transaction_id: COMMITTED}  # every old row went, the new one stayed
        with live.engine.connect() as conn:
            stamped = conn.execute(select(transaction_log.c.created_at)).scalar_one()
        stamped = stamped if stamped.tzinfo else stamped.replace(tzinfo=UTC)
        assert abs(stamped - datetime.now(UTC)) < timedelta(minutes=1)  # the database's clock, not the producer's
        assert live.delivered() == ["o-1"] and live.committed_orders() == {"o-1"}


@pytest.mark.postgres
def test_producers_an_hour_off_purged_at_the_smallest_age_lose_nothing_and_deliver_no_phantom(
        tmp_path: Path, postgres_url: str) -> None:
    """Producers an hour ahead and an hour behind, SIGKILLed at random points (in their
    transaction, or after the commit before END), while purges run back to back at the
    smallest age allowed: every committed order's message is delivered, none other."""
    rng = random.Random(21)
    with shop(tmp_path, postgres_url, timeout_s=1, interval_s=0.5, check_max=2) as live:
        _history(live.engine, 3000, timedelta(minutes=10))  # the purges work through it as producers run
        options = PurgeOptions(tables=[TRANSACTION_LOG], batch_size=5, pause_s=0.01,
                               transaction_log_older_than_s=live.policy.transaction_timeout_s
                               + live.policy.check_interval_s * live.policy.check_max)
        stop, purged, failures = threading.Event(), [0], list[BaseException]()

        def purge_forever() -> None:
            try:
                while not stop.is_set():
                    purged[0] += purge_engine(live.engine, live.policy, live.client.open_transactions,
                                              options).rows()[TRANSACTION_LOG]
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        purger = threading.Thread(target=purge_forever)
        purger.start()
        try:
            for round_ in range(2):
                producers = [live.producer(skew, PREFIX=f"r{round_}p{n}", PAUSE_S="0.02",
                                           KILL_AT=str(rng.randint(20, 60)) if n < 2 else "0")
                             for n, skew in enumerate((-3600, 3600, -3600, 3600))]
                # the two that never kill themselves have done some work (a loaded machine
                # starts processes slowly), then everyone dies at a random point
                survivors = (f"r{round_}p2-", f"r{round_}p3-")

                def survivors_busy(prefixes: tuple[str, ...] = survivors) -> bool:
                    orders = live.committed_orders()
                    return all(sum(order.startswith(prefix) for order in orders) >= 20 for prefix in prefixes)

                _wait(survivors_busy, 120, "each surviving producer's first 20 orders")
                time.sleep(rng.uniform(0, 1))
                for process in producers:
                    process.kill()
                    process.wait()
            _wait(live.settled, 30, "the check-backs of the killed producers' transactions")
            time.sleep(2 * options.transaction_log_older_than_s)  # purges past the last rows' horizon
        finally:
            stop.set()
            purger.join(60)
        assert failures == [] and purged[0] > 0
        committed, delivered = live.committed_orders(), live.delivered()
        assert len(committed) > 50
        assert set(delivered) - committed == set()  # no phantom
        assert committed - set(delivered) == set()  # no loss
