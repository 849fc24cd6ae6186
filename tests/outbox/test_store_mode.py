"""Store mode on SQLAlchemy: calls commit with their messages in outbox_stored_message
while the broker is down (never started here), and raise mode still fails them.

Each database (SQLite, PostgreSQL) gets the framework tables and an ``orders`` table; the
broker URL names a free port nothing listens on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import Message
from outbox import (
    AsyncProducer,
    BrokerUnavailable,
    Producer,
    asend,
    cli,
    json_message,
    message_json,
    send,
    transactional_message,
)
from outbox.integrations.sqlalchemy.tables import stored_message, transaction_log
from outbox.stored import BrokerDown, decode
from tests.ports import free_port

from ..server.conftest import ServerProcess
from .async_support import run_with_sessions

GROUP = "shop"
TOPIC = "order.paid"

shop = MetaData()
orders = Table("orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    shop.create_all(engine)
    return sessionmaker(engine)


@pytest.fixture
def down_url() -> str:
    """A broker URL nothing listens on (the broker was never started)."""
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "broker").start()
    yield server
    server.kill()


def stored_rows(factory: sessionmaker[Session]) -> list[tuple[str, Message]]:
    """(transaction id, message) of each stored row, in the order stored."""
    with factory() as session:
        rows = session.execute(select(stored_message.c.transaction_id, stored_message.c.message)
                               .order_by(stored_message.c.seq)).all()
    return [(transaction_id, decode(data)) for transaction_id, data in rows]


def committed(factory: sessionmaker[Session]) -> dict[str, str]:
    with factory() as session:
        return dict(session.execute(select(transaction_log.c.transaction_id, transaction_log.c.state)).all())


def paying(producer: Producer, factory: sessionmaker[Session], **options: object):  # type: ignore[no-untyped-def]
    """``pay(order_id, amount, extra=0)``: an order row, its message, and ``extra`` more
    messages sent with ``outbox.send``; raises for a negative amount (after writing)."""

    @transactional_message(producer, factory, topic=TOPIC, **options)  # type: ignore[arg-type]
    def pay(session: Session, order_id: str, amount: int, extra: int = 0) -> str:
        session.execute(orders.insert().values(id=order_id, amount=amount))
        for n in range(extra):
            send(session, json_message(TOPIC, {"order_id": order_id, "extra": n}))
        if amount < 0:
            raise ValueError("negative amount")
        return order_id

    return pay


@pytest.mark.parametrize("overlap", [True, False])
def test_store_mode_commits_every_message_of_a_call_while_the_broker_is_down(
        factory: sessionmaker[Session], down_url: str, overlap: bool) -> None:
    producer = Producer(down_url, GROUP, on_broker_down="store")
    pay = paying(producer, factory, overlap=overlap)

    assert pay("o1", 100, extra=2) == "o1"
    assert pay("o2", 5) == "o2"  # within the back-off: held without asking the broker

    rows = stored_rows(factory)
    assert [message_json(message) for _, message in rows] == [
        {"order_id": "o1", "amount": 100, "extra": 2}, {"order_id": "o1", "extra": 0},
        {"order_id": "o1", "extra": 1}, {"order_id": "o2", "amount": 5, "extra": 0}]
    transactions = [transaction_id for transaction_id, _ in rows]
    assert transactions[0] == transactions[1] == transactions[2] != transactions[3]
    assert committed(factory) == dict.fromkeys(dict.fromkeys(transactions), "COMMITTED")
    with factory() as session:
        assert session.execute(select(orders.c.id).order_by(orders.c.id)).scalars().all() == ["o1", "o2"]
    producer.close()


def test_a_rolled_back_call_stores_nothing(factory: sessionmaker[Session], down_url: str) -> None:
    producer = Producer(down_url, GROUP, on_broker_down="store")
    pay = paying(producer, factory)
    with pytest.raises(ValueError, match="negative"):
        pay("o1", -1, extra=1)
    assert stored_rows(factory) == []
    assert committed(factory) == {}
    producer.close()


def test_raise_mode_fails_the_call_and_commits_nothing(factory: sessionmaker[Session], down_url: str) -> None:
    producer = Producer(down_url, GROUP)
    pay = paying(producer, factory)
    with pytest.raises(BrokerUnavailable):
        pay("o1", 100, extra=1)
    assert stored_rows(factory) == []
    assert committed(factory) == {}
    with factory() as session:
        assert session.execute(select(orders)).all() == []
    producer.close()


def test_a_message_group_with_stored_messages_waiting_stores_its_new_ones(
        factory: sessionmaker[Session], down_url: str, server: ServerProcess) -> None:
    """Stored while the broker was down, group g's messages wait for the relay: once the
    broker is back, a new message of g is stored behind them, one of group h is sent."""
    down = Producer(down_url, GROUP, on_broker_down="store")
    paying(down, factory, message_group=lambda order_id, amount, extra=0: "g")("o1", 1)
    down.close()

    producer = Producer(server.url, GROUP, on_broker_down="store")
    grouped = paying(producer, factory, message_group=lambda order_id, amount, extra=0: order_id[0])
    grouped("g2", 2)
    grouped("h1", 3)

    assert [message_json(message)["order_id"] for _, message in stored_rows(factory)] == ["o1", "g2"]
    assert len(committed(factory)) == 3
    producer.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_async_decorator_and_asend_store_while_the_broker_is_down(
        factory: sessionmaker[Session], db_url: str, down_url: str, overlap: bool) -> None:
    async def main(sessions: async_sessionmaker[AsyncSession]) -> list[str]:
        producer = AsyncProducer(down_url, GROUP, on_broker_down="store")

        @transactional_message(producer, sessions, topic=TOPIC, overlap=overlap)
        async def pay(session: AsyncSession, order_id: str, fails: bool = False) -> str:
            await session.execute(orders.insert().values(id=order_id, amount=1))
            await asend(session, json_message(TOPIC, {"order_id": order_id, "extra": 0}))
            if fails:
                raise ValueError("failed order")
            return order_id

        paid = [await pay("o1"), await pay("o2")]
        with pytest.raises(ValueError, match="failed order"):
            await pay("o3", fails=True)
        await producer.aclose()
        return paid

    assert run_with_sessions(db_url, main) == ["o1", "o2"]
    rows = stored_rows(factory)
    assert [message_json(message) for _, message in rows] == [
        {"order_id": "o1", "fails": False}, {"order_id": "o1", "extra": 0},
        {"order_id": "o2", "fails": False}, {"order_id": "o2", "extra": 0}]
    assert committed(factory) == dict.fromkeys(dict.fromkeys(tx for tx, _ in rows), "COMMITTED")


def test_outbox_status_shows_what_waits_for_the_relay(factory: sessionmaker[Session], db_url: str, down_url: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--database-url", db_url]) == 0
    assert capsys.readouterr().out.endswith(": no stored messages wait for the relay\n")
    producer = Producer(down_url, GROUP, on_broker_down="store")
    paying(producer, factory)("o1", 1, extra=2)
    producer.close()

    assert cli.main(["status", "--database-url", db_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  producer group shop: 3 stored message(s) not relayed, oldest ")
    assert 0 <= float(lines[1].rpartition(" oldest ")[2].removesuffix("s ago")) < 60


def _ends_without_a_call(down: BrokerDown, seconds: float = 6.0) -> None:
    """Wait until ``down``'s outage ends (only its probe can end it: no call is made)."""
    deadline = time.monotonic() + seconds
    while down.down:
        assert time.monotonic() < deadline, f"the outage did not end within {seconds}s of the broker's return"
        time.sleep(0.05)


def test_the_probe_ends_an_outage_within_seconds_of_the_brokers_return_without_a_call(
        factory: sessionmaker[Session], tmp_path: Path) -> None:
    """The back-off after an outage's failures grows to 30 s; the producer's probe asks the
    broker every second meanwhile, so the next call goes to the broker again."""
    server = ServerProcess(tmp_path / "broker").start()
    producer = Producer(server.url, GROUP, on_broker_down="store")
    pay = paying(producer, factory)
    try:
        server.kill()
        pay("down", 1)
        assert producer.broker_down.down and producer.broker_down.skipping()
        time.sleep(2.5)  # the probe fails meanwhile: the outage goes on
        assert producer.broker_down.down
        server.start()
        _ends_without_a_call(producer.broker_down)
        pay("back", 1)
    finally:
        producer.close()
        server.kill()
    assert [message_json(message)["order_id"] for _, message in stored_rows(factory)] == ["down"]


def test_an_async_producer_probes_the_broker_too(factory: sessionmaker[Session], db_url: str,
                                                  tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker").start()

    async def main(sessions: async_sessionmaker[AsyncSession]) -> None:
        producer = AsyncProducer(server.url, GROUP, on_broker_down="store")

        @transactional_message(producer, sessions, topic=TOPIC)
        async def pay(session: AsyncSession, order_id: str) -> None:
            await session.execute(orders.insert().values(id=order_id, amount=1))

        try:
            server.kill()
            await pay("down")
            assert producer.broker_down.down
            server.start()
            await asyncio.to_thread(_ends_without_a_call, producer.broker_down)
            await pay("back")
        finally:
            await producer.aclose()

    try:
        run_with_sessions(db_url, main)
    finally:
        server.kill()
    assert [message_json(message)["order_id"] for _, message in stored_rows(factory)] == ["down"]
