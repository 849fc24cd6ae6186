"""``arun_consumer`` and the async ``idempotent_consumer`` over a real TCP broker, on
SQLite (aiosqlite) and PostgreSQL (asyncpg): handled once under redelivery, duplicates
skipped, cancellation and stop lose nothing, a broker that goes away and comes back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from broker_embedded import AsyncBrokerClient, BrokerConfig, Message, ReceivedMessage
from outbox import (
    ConfigurationError,
    arun_consumer,
    idempotent_consumer,
    instrumentation,
)
from outbox.integrations.sqlalchemy.tables import consumed_message, metadata

from ..server.conftest import ServerProcess, ThreadServer
from .async_points import GROUP, TOPIC, awarded, awarding, ledger, points
from .conftest import make_engine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def async_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An async SQLAlchemy URL of a fresh database with the outbox tables and the points."""
    if request.param == "sqlite":
        sync_url = f"sqlite:///{tmp_path / 'consumer.sqlite3'}"
        url = sync_url.replace("sqlite://", "sqlite+aiosqlite://", 1)
    else:
        sync_url = request.getfixturevalue("postgres_url")
        url = sync_url.replace("+psycopg", "+asyncpg", 1)
    engine = make_engine(sync_url)
    metadata.create_all(engine)
    ledger.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    """A TCP broker that retries a failed message at once and dead-letters it after 3 tries."""
    started = ThreadServer(tmp_path / "broker", BrokerConfig(max_delivery_attempts=3, retry_backoff_s=(0.0,)))
    yield started
    started.stop()


@contextlib.contextmanager
def recorded_events() -> Iterator[list[str]]:
    """The DELIVERY outcomes and DUPLICATE_SKIPPED occurrences announced meanwhile."""
    seen: list[str] = []

    @contextlib.contextmanager
    def delivery(operation: instrumentation.Operation) -> Iterator[None]:
        yield
        seen.append(f"delivery:{operation.outcome}")

    def duplicate(**_: Any) -> None:
        seen.append("duplicate_skipped")

    instrumentation.listen(instrumentation.DELIVERY, delivery)
    instrumentation.listen(instrumentation.DUPLICATE_SKIPPED, duplicate)
    try:
        yield seen
    finally:
        instrumentation.remove(instrumentation.DELIVERY, delivery)
        instrumentation.remove(instrumentation.DUPLICATE_SKIPPED, duplicate)


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.05)


async def send_orders(client: AsyncBrokerClient, *orders: str) -> None:
    for order in orders:
        await client.send(Message(TOPIC, f'{{"order": "{order}", "amount": 10}}'.encode(), message_id=order))


def test_each_message_is_handled_once_under_redelivery(async_url: str, server: ThreadServer) -> None:
    async def scenario() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        calls: list[str] = []
        award = awarding(sessions, calls, fail_first=frozenset({"o2"}))
        async with AsyncBrokerClient(server.url) as client:
            await send_orders(client, "o1", "o2", "o3")
            # o1 handled but its ack never sent (the consumer "died"): it comes back.
            first = await client.receive(GROUP, TOPIC, max_messages=1, invisible_duration_s=0.2, wait_s=5)
            assert [r.message.message_id for r in first] == ["o1"] and await award(first[0]) is True
            stop = asyncio.Event()
            with recorded_events() as events:
                consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, award, stop,
                                                             invisible_duration_s=0.5, wait_s=0.2))

                async def all_done() -> bool:
                    return "duplicate_skipped" in events and len(await awarded(sessions)) == 3

                await until(all_done)
                stop.set()
                handled = await consumer
        assert await awarded(sessions) == [("o1", 10), ("o2", 10), ("o3", 10)]
        async with sessions() as session:
            consumed = (await session.execute(select(consumed_message.c.message_id))).scalars().all()
        assert sorted(consumed) == ["o1", "o2", "o3"]
        assert sorted(calls) == ["o1", "o2", "o2", "o3"]  # o2 failed once (rolled back); o1 never ran again
        assert handled == 3  # o1's duplicate (skipped), o2's second try, o3
        assert sorted(events) == ["delivery:failed", "delivery:handled", "delivery:handled",
                                  "delivery:skipped", "duplicate_skipped"]
        await engine.dispose()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_consumer_killed_before_its_ack_has_no_second_effect(async_url: str, server: ThreadServer) -> None:
    orders = [f"o{n}" for n in range(12)]

    async def send() -> None:
        async with AsyncBrokerClient(server.url) as client:
            await send_orders(client, *orders)

    asyncio.run(send())
    # The child handles (and commits) its fifth message, then is SIGKILLed before that ack.
    child = subprocess.run([sys.executable, "-m", "tests.outbox.async_points", server.url, async_url, "5"],
                           cwd=ROOT, timeout=120)
    assert child.returncode == -signal.SIGKILL

    async def finish() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        assert len(await awarded(sessions)) >= 5
        stop = asyncio.Event()
        with recorded_events() as events:
            async with AsyncBrokerClient(server.url) as client:
                consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, awarding(sessions), stop,
                                                             invisible_duration_s=1, wait_s=0.2))

                async def all_done() -> bool:
                    return "duplicate_skipped" in events and len(await awarded(sessions)) == len(orders)

                await until(all_done)
                stop.set()
                await consumer
        assert await awarded(sessions) == sorted((order, 10) for order in orders)
        async with sessions() as session:
            consumed = (await session.execute(select(consumed_message.c.message_id))).scalars().all()
        assert sorted(consumed) == sorted(orders)
        await engine.dispose()

    asyncio.run(finish())


def test_a_poison_message_is_dead_lettered(async_url: str, server: ThreadServer) -> None:
    async def scenario() -> None:
        engine = create_async_engine(async_url)

        @idempotent_consumer(GROUP, async_sessionmaker(engine))
        async def broken(session: AsyncSession, received: ReceivedMessage) -> None:
            raise RuntimeError("bug")

        async with AsyncBrokerClient(server.url) as client:
            await client.send(Message(TOPIC, b"{}", message_id="poison"))
            consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, broken,
                                                         invisible_duration_s=0.2, wait_s=0.2))

            async def dead_lettered() -> bool:
                return bool(await client.list_dlq(GROUP))

            await until(dead_lettered)
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            assert [m.message.message_id for m in await client.list_dlq(GROUP)] == ["poison"]
        async with async_sessionmaker(engine)() as session:
            assert (await session.execute(select(consumed_message))).all() == []
        await engine.dispose()

    asyncio.run(scenario())


def test_cancelling_while_waiting_loses_nothing(async_url: str, server: ThreadServer) -> None:
    async def scenario() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        async with AsyncBrokerClient(server.url) as client:
            await client.create_topic(TOPIC)
            waiting = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, awarding(sessions),
                                                        invisible_duration_s=0.5, wait_s=2))
            await asyncio.sleep(0.3)  # inside its long poll
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The abandoned poll may still take this message on the broker: it is redelivered.
            await send_orders(client, "o1")
            stop = asyncio.Event()
            consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, awarding(sessions), stop,
                                                         invisible_duration_s=0.5, wait_s=0.2))

            async def handled() -> bool:
                return bool(await awarded(sessions))

            await until(handled)
            stop.set()
            assert await consumer == 1
        assert await awarded(sessions) == [("o1", 10)]
        await engine.dispose()

    asyncio.run(scenario())


def test_cancelling_while_handling_rolls_back_and_redelivers(async_url: str, server: ThreadServer) -> None:
    async def scenario() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        in_handler = asyncio.Event()

        @idempotent_consumer(GROUP, sessions)
        async def slow(session: AsyncSession, received: ReceivedMessage) -> None:
            await session.execute(points.insert().values(order_id="o1", points=10))
            in_handler.set()
            await asyncio.sleep(3600)

        async with AsyncBrokerClient(server.url) as client:
            await send_orders(client, "o1")
            consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, slow,
                                                         invisible_duration_s=0.5, wait_s=0.2))
            await asyncio.wait_for(in_handler.wait(), 30)
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            assert await awarded(sessions) == []  # the handler's transaction rolled back
            stop = asyncio.Event()
            again = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, awarding(sessions), stop,
                                                      invisible_duration_s=5, wait_s=0.2))

            async def handled() -> bool:
                return bool(await awarded(sessions))

            await until(handled)
            stop.set()
            assert await again == 1
        assert await awarded(sessions) == [("o1", 10)]
        await engine.dispose()

    asyncio.run(scenario())


def test_stop_finishes_the_handler_in_progress_and_releases_the_rest(async_url: str, server: ThreadServer) -> None:
    async def scenario() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        stop = asyncio.Event()
        award = awarding(sessions)

        async def stopping(received: ReceivedMessage) -> bool | None:
            stop.set()  # a shutdown arrives while the first message is being handled
            await asyncio.sleep(0.05)
            return await award(received)

        async with AsyncBrokerClient(server.url) as client:
            await send_orders(client, "o1", "o2", "o3")
            await until(lambda: _depth_is(client, 3))
            # Hidden for a minute once received: only a release brings them back sooner.
            assert await arun_consumer(client, GROUP, TOPIC, stopping, stop, invisible_duration_s=60,
                                       wait_s=1) == 1
            rest: list[ReceivedMessage] = []
            async with asyncio.timeout(20):
                while len(rest) < 2:
                    rest += await client.receive(GROUP, TOPIC, max_messages=10, wait_s=1)
            assert await awarded(sessions) == [(rest_order(rest), 10)]
        await engine.dispose()

    asyncio.run(scenario())


async def _depth_is(client: AsyncBrokerClient, depth: int) -> bool:
    return sum(sum(topic.depth) for topic in (await client.stats()).topics if topic.name == TOPIC) == depth


def rest_order(rest: list[ReceivedMessage]) -> str:
    """The one order of o1..o3 not among ``rest``: the one handled before the stop."""
    (order,) = {"o1", "o2", "o3"} - {r.message.message_id for r in rest}
    return order


@pytest.mark.slow
def test_a_consumer_waits_out_a_broker_outage(async_url: str, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    broker = ServerProcess(tmp_path / "broker").start()
    caplog.set_level(logging.INFO, logger="outbox.consumer")

    async def scenario() -> None:
        engine = create_async_engine(async_url)
        sessions = async_sessionmaker(engine)
        stop = asyncio.Event()
        async with AsyncBrokerClient(broker.url, timeout_s=5, connect_timeout_s=1) as client:
            await send_orders(client, "before")
            consumer = asyncio.create_task(arun_consumer(client, GROUP, TOPIC, awarding(sessions), stop,
                                                         wait_s=0.2))

            async def has(orders: list[str]) -> bool:
                return [order for order, _ in await awarded(sessions)] == orders

            await until(lambda: has(["before"]))
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(1.5)  # a few failed receives, backing off
            assert not consumer.done()
            await asyncio.to_thread(broker.start)  # the same port and data
            async with AsyncBrokerClient(broker.url) as producer:
                await send_orders(producer, "after")
            await until(lambda: has(["after", "before"]), timeout_s=60)
            stop.set()
            assert await consumer == 2
        await engine.dispose()
        said = [r.getMessage() for r in caplog.records]
        assert len([m for m in said if "broker unavailable" in m]) == 1  # once, not per attempt
        assert len([m for m in said if "reachable again" in m]) == 1

    try:
        asyncio.run(scenario())
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def test_wrong_handlers_are_refused_at_once(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}")
    with pytest.raises(ConfigurationError, match="async_sessionmaker"):
        idempotent_consumer(GROUP, async_sessionmaker(engine))(lambda session, received: None)  # type: ignore[arg-type,return-value]

    async def handler(session: Any, received: ReceivedMessage) -> None: ...

    sync_engine = make_engine(f"sqlite:///{tmp_path / 'y.sqlite3'}")
    with pytest.raises(ConfigurationError, match="async_sessionmaker"):
        idempotent_consumer(GROUP, sessionmaker(sync_engine))(handler)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="async handler"):
        asyncio.run(arun_consumer(AsyncBrokerClient("tcp://127.0.0.1:1"), GROUP, TOPIC,
                                  lambda received: True))  # type: ignore[arg-type,return-value]
    sync_engine.dispose()
