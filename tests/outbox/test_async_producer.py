"""``AsyncProducer`` over a real TCP broker: sends, the half/end protocol, the listener
style, oneway END, check-back listeners, and the same instrumentation as ``Producer``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from broker_embedded import Message, Resolution, TransactionState
from outbox import (
    AsyncProducer,
    BrokerUnavailableError,
    Producer,
    check_transaction,
    instrumentation,
)
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.producer import TRANSACTION_ID_PROPERTY
from tests.ports import free_port
from tests.server.conftest import ThreadServer

from .async_support import bodies, tcp_broker, wait_for_state


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


class LogListener:
    """The local transaction is the transaction_log insert (run in a thread: the engine is
    sync); check-backs read it through the fence."""

    def __init__(self, engine: Engine, fail: bool = False) -> None:
        self.engine = engine
        self.fail = fail
        self.checked: list[Resolution] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
        def transaction() -> None:
            with self.engine.begin() as conn:
                record_committed(conn, arg, "shop")
                if self.fail:
                    raise RuntimeError("business rule failed")

        await asyncio.to_thread(transaction)
        return Resolution.COMMIT

    async def check_local_transaction(self, message: Message) -> Resolution:
        answer = await asyncio.to_thread(check_transaction, self.engine, message.properties[TRANSACTION_ID_PROPERTY],
                                         "shop")
        self.checked.append(answer)
        return answer


def test_send_and_the_half_end_protocol(server: ThreadServer) -> None:
    async def main() -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            await producer.send(Message("order.news", b"plain"))
            await producer.send_half(Message("order.paid", b"kept"), "tx-a")
            await producer.send_half(Message("order.paid", b"dropped"), "tx-b")
            assert await producer.end_transaction("tx-a", Resolution.COMMIT)
            assert await producer.end_transaction("tx-b", Resolution.ROLLBACK)

    asyncio.run(main())
    assert bodies(server, "order.news") == [b"plain"]
    assert bodies(server, "order.paid") == [b"kept"]
    assert server.broker.transaction_state("tx-b") is TransactionState.ROLLED_BACK


@pytest.mark.parametrize("fail", [False, True])
def test_send_message_in_transaction(server: ThreadServer, engine: Engine, monkeypatch, fail: bool) -> None:
    monkeypatch.setattr("outbox.aio_producer.new_transaction_id", lambda: "tx-listener")

    async def main() -> Resolution:
        async with AsyncProducer(server.url, "shop") as producer:
            return await producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-listener",
                                                              LogListener(engine, fail))

    if fail:
        with pytest.raises(RuntimeError, match="business rule"):
            asyncio.run(main())
    else:
        assert asyncio.run(main()) is Resolution.COMMIT
    expected = TransactionState.ROLLED_BACK if fail else TransactionState.COMMITTED
    assert server.broker.transaction_state("tx-listener") is expected
    assert bodies(server, "order.paid") == ([] if fail else [b"{}"])


def test_oneway_end_is_awaited_by_flush_and_aclose(server: ThreadServer, engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr("outbox.aio_producer.new_transaction_id", lambda: "tx-oneway")

    async def main() -> None:
        producer = AsyncProducer(server.url, "shop", oneway_end=True)
        assert await producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-oneway",
                                                          LogListener(engine)) is Resolution.COMMIT
        await producer.aclose()  # flushes the END under way first

    asyncio.run(main())
    assert server.broker.transaction_state("tx-oneway") is TransactionState.COMMITTED


def test_registered_check_listener_settles_a_transaction_whose_end_never_came(
        tmp_path: Path, engine: Engine) -> None:
    server = tcp_broker(tmp_path / "checking", check_after_s=0.1)
    listener = LogListener(engine)
    try:
        async def main() -> None:
            async with AsyncProducer(server.url, "shop") as producer:
                await producer.register_check_listener(listener)
                with engine.begin() as conn:
                    record_committed(conn, "tx-lost-end", "shop")
                await producer.send_half(Message("order.paid", b"{}"), "tx-lost-end")
                # No END_TRANSACTION: the broker asks this producer, which reads the log.
                await asyncio.to_thread(wait_for_state, server, "tx-lost-end")

        asyncio.run(main())
        assert server.broker.transaction_state("tx-lost-end") is TransactionState.COMMITTED
        assert listener.checked[-1] is Resolution.COMMIT
    finally:
        server.stop()


def test_broker_down_raises_the_outbox_error_and_end_never_raises() -> None:
    async def main() -> None:
        async with AsyncProducer(f"tcp://127.0.0.1:{free_port()}", "shop") as producer:
            with pytest.raises(BrokerUnavailableError):
                await producer.send_half(Message("order.paid", b"{}"), "tx-down")
            with pytest.raises(BrokerUnavailableError):
                await producer.send(Message("order.paid", b"{}"))
            assert await producer.end_transaction("tx-down", Resolution.COMMIT) is False

    asyncio.run(main())


def test_a_rollback_waits_for_its_half_message(server: ThreadServer) -> None:
    """``finish`` right after ``start_half``: the END goes out after the half is stored,
    so the broker knows the transaction and rolls it back."""

    async def main() -> bool:
        async with AsyncProducer(server.url, "shop") as producer:
            producer.start_half(Message("order.paid", b"{}"), "tx-race")
            return await producer.finish("tx-race", Resolution.ROLLBACK)

    assert asyncio.run(main()) is True
    assert server.broker.transaction_state("tx-race") is TransactionState.ROLLED_BACK
    assert bodies(server, "order.paid") == []


def test_no_end_is_sent_for_a_half_message_that_failed() -> None:
    async def main() -> bool:
        async with AsyncProducer(f"tcp://127.0.0.1:{free_port()}", "shop") as producer:
            half = producer.start_half(Message("order.paid", b"{}"), "tx-never")
            ended = await producer.finish("tx-never", Resolution.ROLLBACK)
            with pytest.raises(BrokerUnavailableError):
                await half
            return ended

    assert asyncio.run(main()) is False


@contextlib.contextmanager
def recorded_events() -> Iterator[list[tuple[str, str | None]]]:
    """Every operation announced inside the block: its name and outcome, in the order they ended."""
    events: list[tuple[str, str | None]] = []

    @contextlib.contextmanager
    def record(operation: instrumentation.Operation) -> Iterator[None]:
        yield
        events.append((operation.name, operation.outcome))

    names = [instrumentation.SEND, instrumentation.SEND_HALF, instrumentation.LOCAL_TRANSACTION,
             instrumentation.END_TRANSACTION, instrumentation.CHECK_BACK]
    for name in names:
        instrumentation.listen(name, record)
    try:
        yield events
    finally:
        for name in names:
            instrumentation.remove(name, record)


def test_both_producers_announce_the_same_events(server: ThreadServer, engine: Engine) -> None:
    class SyncLogListener:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
            return asyncio.run(LogListener(engine, self.fail).execute_local_transaction(message, arg))

        def check_local_transaction(self, message: Message) -> Resolution:
            raise AssertionError("not used")

    with recorded_events() as sync_events:
        producer = Producer(server.url, "shop")
        producer.send(Message("order.news", b"{}"))
        producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-sync-1", SyncLogListener(False))
        with pytest.raises(RuntimeError):
            producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-sync-2", SyncLogListener(True))
        producer.close()

    async def main() -> None:
        async with AsyncProducer(server.url, "shop") as producer:
            await producer.send(Message("order.news", b"{}"))
            await producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-async-1",
                                                       LogListener(engine))
            with pytest.raises(RuntimeError):
                await producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-async-2",
                                                           LogListener(engine, fail=True))

    with recorded_events() as async_events:
        asyncio.run(main())
    assert async_events == sync_events
    assert ("local_transaction", "commit") in sync_events and ("end_transaction", "sent") in sync_events
