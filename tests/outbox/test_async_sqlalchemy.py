"""The async decorator and ``asend`` on AsyncSession, on SQLite (aiosqlite) and PostgreSQL
(asyncpg), against a TCP broker: the failure and fencing rules of the sync API, with
the half message awaited first or overlapping the transaction (``overlap``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.broker.export import transaction_states
from outbox import (
    AsyncProducer,
    BrokerUnavailableError,
    ConfigurationError,
    Producer,
    TransactionFencedError,
    asend,
    check_transaction,
    current_transaction_id,
    install,
    json_message,
    send,
    transactional_message,
)
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.schema import TRANSACTION_LOG
from tests.ports import free_port
from tests.server.conftest import ThreadServer

from .async_support import bodies, run_with_sessions, states, tcp_broker

shop = MetaData()
orders = Table("async_orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


@pytest.fixture
def db(engine: Engine, db_url: str) -> str:
    """The test database, with the outbox tables and the orders table."""
    shop.create_all(engine)
    return db_url


def broker_states(server: ThreadServer) -> dict[str, TransactionState]:
    return {tx: state for tx, (state, _) in transaction_states(server.broker).items()}


def order_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(orders.c.id)).scalars())


def pay_function(producer: AsyncProducer, sessions: Sessions, overlap: bool, fail: bool = False) -> Any:
    @transactional_message(producer, sessions, topic="order.paid", overlap=overlap)
    async def pay(session: AsyncSession, order_id: str, amount: int) -> str | None:
        await session.execute(orders.insert().values(id=order_id, amount=amount))
        if fail:
            raise ValueError("insufficient balance")
        return current_transaction_id()

    return pay


@pytest.mark.parametrize("overlap", [False, True])
def test_decorator_commits_with_the_log_row_as_the_first_statement(server, engine, db, overlap) -> None:
    statements: list[str] = []

    async def main(sessions: Sessions) -> str | None:
        sync_engine = sessions.kw["bind"].sync_engine
        event.listen(sync_engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *rest: statements.append(statement))
        async with AsyncProducer(server.url, "shop") as producer:
            return await pay_function(producer, sessions, overlap)("o1", amount=100)

    transaction_id = run_with_sessions(db, main)
    assert states(engine) == {transaction_id: "COMMITTED"}
    assert broker_states(server) == {transaction_id: TransactionState.COMMITTED}
    assert bodies(server, "order.paid") == [b'{"amount":100,"order_id":"o1"}']
    assert order_ids(engine) == ["o1"]
    written = [s for s in statements if not s.startswith(("BEGIN", "PRAGMA", "select pg_", "show ", "SELECT"))]
    assert written[0].startswith(f"INSERT INTO {TRANSACTION_LOG}"), statements
    assert written[1].startswith(f"INSERT INTO {orders.name}"), statements


@pytest.mark.parametrize("overlap", [False, True])
def test_business_failure_rolls_back_and_sends_rollback(server, engine, db, overlap) -> None:
    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            await pay_function(producer, sessions, overlap, fail=True)("o1", amount=1)

    with pytest.raises(ValueError, match="insufficient"):
        run_with_sessions(db, main)
    assert list(broker_states(server).values()) == [TransactionState.ROLLED_BACK]
    assert bodies(server, "order.paid") == [] and order_ids(engine) == [] and states(engine) == {}


@pytest.mark.parametrize("overlap", [False, True])
def test_broker_down_commits_nothing(engine, db, overlap) -> None:
    """Awaited half: the function does not run. Overlapping half: it ran, but its writes
    roll back before anything commits. Either way ``BrokerUnavailableError``."""
    ran: list[str] = []

    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(f"tcp://127.0.0.1:{free_port()}", "shop") as producer:
            @transactional_message(producer, sessions, topic="order.paid", overlap=overlap)
            async def pay(session: AsyncSession, order_id: str) -> None:
                ran.append(order_id)
                await session.execute(orders.insert().values(id=order_id, amount=1))

            await pay("o1")

    with pytest.raises(BrokerUnavailableError):
        run_with_sessions(db, main)
    assert ran == (["o1"] if overlap else [])
    assert order_ids(engine) == [] and states(engine) == {}


@pytest.mark.parametrize("overlap", [False, True])
def test_fenced_transaction_fails_cleanly_and_sends_rollback(server, engine, db, overlap, monkeypatch) -> None:
    monkeypatch.setattr("outbox.integrations.sqlalchemy.session.new_transaction_id", lambda: "tx-fenced")
    # The check-back arrived before the local transaction began: the fence wins.
    assert check_transaction(engine, "tx-fenced", "shop") is Resolution.ROLLBACK
    ran: list[str] = []

    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            @transactional_message(producer, sessions, topic="order.paid", overlap=overlap)
            async def pay(session: AsyncSession, order_id: str) -> None:
                ran.append(order_id)

            await pay("o1")

    with pytest.raises(TransactionFencedError, match="fenced"):
        run_with_sessions(db, main)
    assert ran == []
    assert broker_states(server) == {"tx-fenced": TransactionState.ROLLED_BACK}
    assert states(engine) == {"tx-fenced": "ROLLED_BACK"}


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_check_during_the_async_transaction_waits_for_its_outcome(server, engine, db, outcome) -> None:
    answers: list[Resolution] = []

    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            @transactional_message(producer, sessions, topic="order.paid", overlap=True)
            async def pay(session: AsyncSession, order_id: str) -> None:
                await session.execute(orders.insert().values(id=order_id, amount=1))
                transaction_id = current_transaction_id()
                checker = threading.Thread(
                    target=lambda: answers.append(check_transaction(engine, transaction_id, "shop", 20_000)))
                checkers.append(checker)
                checker.start()
                await asyncio.sleep(0.5)
                assert checker.is_alive() and not answers, "the check must wait for the running transaction"
                if outcome == "rollback":
                    raise ValueError("refused")

            with pytest.raises(ValueError) if outcome == "rollback" else contextlib.nullcontext():
                await pay("o1")

    checkers: list[threading.Thread] = []
    run_with_sessions(db, main)
    checkers[0].join(30)
    assert answers == [Resolution.COMMIT if outcome == "commit" else Resolution.ROLLBACK]


def test_asend_on_a_bare_async_session(server, engine, db) -> None:
    async def main(sessions: Sessions) -> tuple[str, str]:
        async with AsyncProducer(server.url, "shop") as producer:
            install(sessions, producer)
            async with sessions() as session, session.begin():
                first = await asend(session, json_message("order.paid", {"n": 1}))
                assert await asend(session, json_message("order.shipped", {"n": 1})) == first
                await session.execute(orders.insert().values(id="o1", amount=1))
            async with sessions() as session:
                await session.begin()
                second = await asend(session, Message("order.paid", b"undone"))
                await session.rollback()
            return first, second

    committed, rolled_back = run_with_sessions(db, main)
    assert broker_states(server) == {committed: TransactionState.COMMITTED, rolled_back: TransactionState.ROLLED_BACK}
    assert bodies(server, "order.paid") == [b'{"n":1}']
    assert bodies(server, "order.shipped") == [b'{"n":1}']
    assert states(engine) == {committed: "COMMITTED"}


def test_oneway_end_returns_after_the_commit_and_aclose_settles_it(server, engine, db) -> None:
    async def main(sessions: Sessions) -> str | None:
        producer = AsyncProducer(server.url, "shop", oneway_end=True)
        try:
            return await pay_function(producer, sessions, overlap=True)("o1", amount=3)
        finally:
            await producer.aclose()

    transaction_id = run_with_sessions(db, main)
    assert broker_states(server) == {transaction_id: TransactionState.COMMITTED}


def test_concurrent_overlapping_calls_each_commit_their_own_message(server, engine, db) -> None:
    async def main(sessions: Sessions) -> list[str | None]:
        async with AsyncProducer(server.url, "shop") as producer:
            pay = pay_function(producer, sessions, overlap=True)
            return list(await asyncio.gather(*(pay(f"o{n}", amount=n) for n in range(8))))

    transaction_ids = run_with_sessions(db, main)
    assert len(set(transaction_ids)) == 8
    assert broker_states(server) == dict.fromkeys(transaction_ids, TransactionState.COMMITTED)
    assert sorted(order_ids(engine)) == sorted(f"o{n}" for n in range(8))


def test_the_producer_must_match_the_function_and_the_session(server, tmp_path) -> None:
    sync_producer = Producer(server.url, "shop")
    sync_sessions = sessionmaker()
    url = f"sqlite:///{tmp_path / 'misuse.sqlite3'}"

    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            with pytest.raises(ConfigurationError, match="AsyncProducer"):
                transactional_message(sync_producer, sessions, topic="t")(_async_body)
            with pytest.raises(ConfigurationError, match="async def"):
                transactional_message(producer, sync_sessions, topic="t")(lambda session: None)
            async with sessions() as session:
                with pytest.raises(ConfigurationError, match="install"):
                    await asend(session, Message("t", b""))
                install(session, producer)
                with pytest.raises(ConfigurationError, match="asend"):
                    await session.run_sync(send, Message("t", b""))
                install(session, sync_producer)
                with pytest.raises(ConfigurationError, match="outbox.send"):
                    await asend(session, Message("t", b""))

    run_with_sessions(url, main)
    sync_producer.close()


async def _async_body(session: AsyncSession) -> None:
    return None


@pytest.mark.parametrize("overlap", [False, True])
def test_database_unreachable_after_the_half_message_sends_rollback(server, overlap) -> None:
    ran: list[str] = []

    async def main(sessions: Sessions) -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            @transactional_message(producer, sessions, topic="order.paid", overlap=overlap)
            async def pay(session: AsyncSession, order_id: str) -> None:
                ran.append(order_id)

            await pay("o1")

    with pytest.raises((OSError, OperationalError)):  # asyncpg's refusal comes through unwrapped
        run_with_sessions(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x", main)
    assert ran == []
    assert list(broker_states(server).values()) == [TransactionState.ROLLED_BACK]


@pytest.mark.postgres
def test_psycopg_async_driver(server, postgres_url) -> None:
    """psycopg 3's async connections (the ``postgresql+psycopg`` URL on an async engine)."""

    async def main() -> str | None:
        engine = create_async_engine(postgres_url)
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
            await conn.run_sync(shop.create_all)
        try:
            async with AsyncProducer(server.url, "shop") as producer:
                sessions = async_sessionmaker(engine, expire_on_commit=False)
                return await pay_function(producer, sessions, overlap=True)("o1", amount=1)
        finally:
            await engine.dispose()

    transaction_id = asyncio.run(main())
    assert broker_states(server) == {transaction_id: TransactionState.COMMITTED}
