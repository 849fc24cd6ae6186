"""SQL92 filters over the native TCP protocol: ``filter_type="SQL92"`` on the blocking and
the asyncio client, and the outbox consumer loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_embedded import AsyncBrokerClient, BrokerClient, Message, ReceivedMessage
from broker_embedded.errors import InvalidMessageError
from outbox.consumer import run_consumer


def test_blocking_client_receives_by_properties_and_refuses_malformed_sql(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        for amount in (3, 12, 40):
            client.send(Message("orders", f"{amount}".encode(), tag="paid", properties={"amount": str(amount)}))
        client.send(Message("orders", b"none"))
        got = client.receive("big", "orders", filter_expression="amount BETWEEN 10 AND 50 AND TAGS = 'paid'",
                             filter_type="SQL92")
        assert sorted(r.message.body for r in got) == [b"12", b"40"]
        with pytest.raises(InvalidMessageError, match="found the end at position 8"):
            client.receive("big", "orders", filter_expression="amount >", filter_type="SQL92")
        assert client.receive("big", "orders") == []  # the others were consumed for the group
        assert len(client.receive("audit", "orders", filter_expression="TRUE", filter_type="SQL92")) == 4


def test_async_client_receives_by_properties(thread_server) -> None:
    server = thread_server()

    async def scenario() -> list[bytes]:
        async with AsyncBrokerClient(server.url, timeout_s=20) as client:
            await client.send(Message("events", b"eu", properties={"region": "eu"}))
            await client.send(Message("events", b"us", properties={"region": "us"}))
            got = await client.receive("g", "events", filter_expression="region IN ('us')", filter_type="SQL92")
            return [r.message.body for r in got]

    assert asyncio.run(scenario()) == [b"us"]


def test_outbox_consumer_handles_only_matching_properties(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        for n in range(6):
            client.send(Message("orders", f"{n}".encode(), properties={"n": str(n)}))
        handled: list[bytes] = []
        stop = threading.Event()

        def handler(received: ReceivedMessage) -> bool:
            handled.append(received.message.body)
            if len(handled) == 2:
                stop.set()
            return True

        run_consumer(client, "late", "orders", handler, stop, wait_s=0.2, filter_expression="n >= 4",
                     filter_type="SQL92")
        assert sorted(handled) == [b"4", b"5"]
