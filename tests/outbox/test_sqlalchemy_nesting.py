"""``@transactional_message`` called inside a transaction the caller already has: given
the session, the call joins its transaction (its messages share the transaction id and
follow the outer COMMIT or ROLLBACK); not given it, the call is refused at once instead
of opening a second session that waits for the first one's lock (SQLite) or commits
apart from it (PostgreSQL). Sync and async, SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.broker.export import transaction_states
from outbox import (
    AsyncProducer,
    NestedTransactionError,
    Producer,
    check_transaction,
    current_transaction_id,
    idempotent_consumer,
    install,
    message_json,
    transactional_message,
)
from outbox.integrations.sqlalchemy.engine import create_engine
from tests.server.conftest import ThreadServer

from .async_support import bodies, run_with_sessions, states, tcp_broker

shop = MetaData()
orders = Table("nested_orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))


class Base(DeclarativeBase):
    pass


class Order(Base):
    __table__ = orders


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    shop.create_all(engine)
    return sessionmaker(engine)


def broker_states(broker: Any) -> dict[str, TransactionState]:
    return {tx: state for tx, (state, _) in transaction_states(broker).items()}


def order_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(orders.c.id)).scalars())


def pay_function(producer: Producer, factory: sessionmaker[Session], fail: bool = False) -> Any:
    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str, amount: int) -> str | None:
        session.execute(orders.insert().values(id=order_id, amount=amount))
        if fail:
            raise ValueError("insufficient balance")
        return current_transaction_id()

    return pay


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_calls_given_the_session_join_its_transaction(factory, engine, broker, outcome) -> None:
    """Positional and keyword session; the caller's statements ran first, so the row is
    inserted at the join and from then on a check-back waits for the outer outcome."""
    pay = pay_function(Producer(broker, "shop"), factory)
    answers: list[Resolution] = []
    with factory() as session:
        session.begin()
        session.execute(orders.insert().values(id="before", amount=1))
        first = pay(session, "o1", 100)
        assert pay("o2", amount=5, session=session) == first
        assert broker_states(broker) == {first: TransactionState.PENDING}
        checker = threading.Thread(target=lambda: answers.append(check_transaction(engine, first, "shop", 20_000)))
        checker.start()
        time.sleep(0.3)
        assert not answers, "the check must wait for the outer transaction"
        session.execute(orders.insert().values(id="after", amount=1))
        session.commit() if outcome == "commit" else session.rollback()
    checker.join(30)
    if outcome == "commit":
        assert answers == [Resolution.COMMIT]
        assert broker_states(broker) == {first: TransactionState.COMMITTED}
        received = broker.receive("points", "order.paid", max_messages=10, wait_s=2)
        assert sorted(message_json(r.message)["order_id"] for r in received) == ["o1", "o2"]
        assert {r.transaction_id for r in received} == {first}
        assert order_ids(engine) == ["after", "before", "o1", "o2"] and states(engine) == {first: "COMMITTED"}
    else:
        assert answers == [Resolution.ROLLBACK]
        assert broker_states(broker) == {first: TransactionState.ROLLED_BACK}
        assert broker.receive("points", "order.paid", wait_s=0.3) == []
        assert order_ids(engine) == [] and states(engine) == {first: "ROLLED_BACK"}  # the fence's row


def test_a_call_inside_a_call_shares_its_transaction_id(factory, engine, broker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, factory, topic="points.added", body=lambda order_id: {"points": order_id})
    def add_points(session: Session, order_id: str) -> str | None:
        return current_transaction_id()

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> tuple[str | None, str | None]:
        session.execute(orders.insert().values(id=order_id, amount=1))
        return current_transaction_id(), add_points(order_id, session=session)

    outer, inner = pay("o1")
    assert outer == inner
    paid = broker.receive("g", "order.paid", wait_s=2)
    points = broker.receive("g", "points.added", wait_s=2)
    assert [r.transaction_id for r in paid + points] == [outer, outer]
    assert broker_states(broker) == {outer: TransactionState.COMMITTED} and states(engine) == {outer: "COMMITTED"}


def test_a_call_not_given_the_open_session_is_refused_at_once(factory, engine, broker) -> None:
    producer = Producer(broker, "shop")
    pay = pay_function(producer, factory)

    @transactional_message(producer, factory, topic="order.paid")
    def outer(session: Session) -> None:
        pay("inner", 1)

    with factory() as session, session.begin():
        session.execute(orders.insert().values(id="mine", amount=1))
        started = time.monotonic()
        with pytest.raises(NestedTransactionError, match=r"pay\(session=session, \.\.\.\)"):
            pay("o1", 1)
        assert time.monotonic() - started < 2, "refused at once, not after a lock wait"
    with pytest.raises(NestedTransactionError):
        outer()
    assert order_ids(engine) == ["mine"]
    assert list(broker_states(broker).values()) == [TransactionState.ROLLED_BACK]  # outer()'s own
    assert states(engine) == {}


def test_a_joined_call_that_raises_makes_the_outer_commit_roll_back(factory, engine, broker) -> None:
    pay = pay_function(Producer(broker, "shop"), factory, fail=True)
    with factory() as session:
        session.begin()
        with pytest.raises(ValueError, match="insufficient"):
            pay(session, "o1", 1)
        with pytest.raises(NestedTransactionError, match="must roll back"):
            session.commit()
    assert list(broker_states(broker).values()) == [TransactionState.ROLLED_BACK]
    assert order_ids(engine) == [] and states(engine) == {}


def test_a_given_session_without_a_transaction_gets_one_of_the_call(factory, engine, broker) -> None:
    pay = pay_function(Producer(broker, "shop"), factory)
    with factory() as session:
        transaction_id = pay(session, "o1", 1)
        assert not session.in_transaction()
        assert session.execute(select(orders.c.id)).scalars().all() == ["o1"]
    assert broker_states(broker) == {transaction_id: TransactionState.COMMITTED}


def test_sessions_that_cannot_be_joined_are_refused(factory, engine, broker, tmp_path: Path) -> None:
    producer = Producer(broker, "shop")
    pay = pay_function(producer, factory)
    elsewhere = create_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        with Session(elsewhere) as session, session.begin():
            with pytest.raises(NestedTransactionError, match="session factory's database"):
                pay(session, "o1", 1)
    finally:
        elsewhere.dispose()
    other = Producer(broker, "other")
    with factory() as session:
        install(session, other)
        with pytest.raises(NestedTransactionError, match="sends with another producer"):
            pay(session, "o1", 1)
    with factory() as session, session.begin():
        with pytest.raises(TypeError, match="takes a Session"):
            pay("o1", 1, session="not a session")
        session.add(Order(id="dup", amount=1))
        session.add(Order(id="dup", amount=2))
        with pytest.raises(IntegrityError):
            session.flush()
        with pytest.raises(NestedTransactionError, match="roll it back first"):
            pay(session, "o1", 1)
        session.rollback()
    assert broker_states(broker) == {} and order_ids(engine) == []


def test_a_consumer_that_gives_its_session_commits_the_message_with_its_record(factory, engine, broker) -> None:
    pay = pay_function(Producer(broker, "shop"), factory)

    @idempotent_consumer("billing", factory)
    def bill(session: Session, received: Any) -> None:
        pay(session, message_json(received.message)["order"], 1)

    broker.send(Message("order.placed", b'{"order": "o1"}', message_id="m1"))
    assert bill(broker.receive("billing", "order.placed", wait_s=2)[0]) is True
    [paid] = broker.receive("points", "order.paid", wait_s=2)
    assert message_json(paid.message) == {"order_id": "o1", "amount": 1}
    assert order_ids(engine) == ["o1"] and states(engine) == {paid.transaction_id: "COMMITTED"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_async_calls_given_the_session_join_its_transaction(server, engine, db_url, factory, outcome) -> None:
    async def main(sessions: async_sessionmaker[AsyncSession]) -> str | None:
        async with AsyncProducer(server.url, "shop") as producer:
            @transactional_message(producer, sessions, topic="order.paid")
            async def pay(session: AsyncSession, order_id: str) -> str | None:
                await session.execute(orders.insert().values(id=order_id, amount=1))
                return current_transaction_id()

            async with sessions() as session:
                await session.begin()
                await session.execute(orders.insert().values(id="before", amount=1))
                first = await pay(session, "o1")
                assert await pay("o2", session=session) == first
                started = time.monotonic()
                with pytest.raises(NestedTransactionError, match="in this task"):
                    await pay("o3")
                assert time.monotonic() - started < 2, "refused at once, not after a lock wait"
                await (session.commit() if outcome == "commit" else session.rollback())
            return first

    transaction_id = run_with_sessions(db_url, main)
    assert transaction_id is not None
    if outcome == "commit":
        assert broker_states(server.broker) == {transaction_id: TransactionState.COMMITTED}
        assert sorted(bodies(server, "order.paid", wait_s=2)) == [b'{"order_id":"o1"}', b'{"order_id":"o2"}']
        assert order_ids(engine) == ["before", "o1", "o2"] and states(engine) == {transaction_id: "COMMITTED"}
    else:
        assert broker_states(server.broker) == {transaction_id: TransactionState.ROLLED_BACK}
        assert bodies(server, "order.paid") == [] and order_ids(engine) == [] and states(engine) == {}
