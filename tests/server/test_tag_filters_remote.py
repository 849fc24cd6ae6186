"""Tag filters over the native TCP protocol: the blocking client, the asyncio client (a
long poll that only a matching message ends), and the outbox consumer loops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_embedded import AsyncBrokerClient, BrokerClient, Message, ReceivedMessage
from broker_embedded.errors import InvalidMessageError
from outbox.aio_consumer import arun_consumer
from outbox.consumer import run_consumer


def test_blocking_client_receives_by_tag_and_refuses_a_malformed_expression(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        for tag in ("paid", "created", "paid", ""):
            client.send(Message("orders", tag.encode() or b"none", tag=tag))
        got = client.receive("billing", "orders", filter_expression="paid || refunded")
        assert sorted(r.message.body for r in got) == [b"paid", b"paid"]
        assert len(client.receive("audit", "orders")) == 4  # the default: every message
        with pytest.raises(InvalidMessageError, match="not a TAG expression"):
            client.receive("billing", "orders", filter_expression="paid ||")
        assert client.receive("billing", "orders", filter_expression="*") == []  # the others are consumed


def test_async_long_poll_ends_only_for_a_matching_message(thread_server) -> None:
    server = thread_server()

    async def scenario() -> None:
        async with AsyncBrokerClient(server.url, timeout_s=20) as client:
            await client.create_topic("events", 1)
            poll = asyncio.create_task(client.receive("g", "events", wait_s=20, filter_expression="wanted"))
            await client.send(Message("events", b"noise", tag="noise"))
            await asyncio.sleep(0.5)
            assert not poll.done()
            await client.send(Message("events", b"match", tag="wanted"))
            got = await asyncio.wait_for(poll, 20)
            assert [r.message.body for r in got] == [b"match"]
            with pytest.raises(InvalidMessageError):
                await client.receive("g", "events", filter_expression="a | b")

    asyncio.run(scenario())


def test_outbox_consumers_handle_only_their_tags(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        for n in range(6):
            client.send(Message("orders", f"{n}".encode(), tag="paid" if n % 2 else "created"))
        handled: list[bytes] = []
        stop = threading.Event()

        def handler(received: ReceivedMessage) -> bool:
            handled.append(received.message.body)
            if len(handled) == 3:
                stop.set()
            return True

        run_consumer(client, "billing", "orders", handler, stop, wait_s=0.2, filter_expression="paid")
        assert sorted(handled) == [b"1", b"3", b"5"]

    async def async_consumer() -> list[bytes]:
        got: list[bytes] = []
        async_stop = asyncio.Event()

        async def async_handler(received: ReceivedMessage) -> bool:
            got.append(received.message.body)
            if len(got) == 3:
                async_stop.set()
            return True

        async with AsyncBrokerClient(server.url) as async_client:
            await arun_consumer(async_client, "mail", "orders", async_handler, async_stop, wait_s=0.2,
                                filter_expression="created")
        return got

    assert sorted(asyncio.run(async_consumer())) == [b"0", b"2", b"4"]
