"""``relay_committed`` over the wire, against ``python -m broker_embedded serve`` processes:
a repeat after the server was SIGKILLed and restarted, the same relay from two
connections at once, a kill while a relay is written, and the asyncio client."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker_embedded import (
    AsyncBrokerClient,
    BrokerClient,
    BrokerError,
    Message,
    SendResult,
    TransactionState,
)
from broker_embedded.errors import TransactionConflictError

from ..broker.crashcut import describe, exactly_once, kill_later, visible
from .conftest import ServerProcess

TOPIC = "orders"
PG = "relays"


def _relay_until_done(client: BrokerClient, messages: list[Message], tx: str) -> list[SendResult]:
    """The relay's loop: again after a conflict (another relay of it is being written)."""
    for _ in range(200):
        try:
            return client.relay_committed(messages, producer_group=PG, transaction_id=tx)
        except TransactionConflictError:
            continue
    raise AssertionError("the relay never got through")


def _at_once(pool: ThreadPoolExecutor, clients: list[BrokerClient], messages: list[Message],
             tx: str) -> list[list[SendResult]]:
    """The same relay from each client at once (each until it got through)."""
    start = threading.Barrier(len(clients))

    def relay(client: BrokerClient) -> list[SendResult]:
        start.wait()
        return _relay_until_done(client, messages, tx)

    return list(pool.map(relay, clients))


def test_a_repeat_after_the_server_was_killed_stores_no_second_copy(
        server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    tx, messages = uuid.uuid4().hex, [Message(TOPIC, b"a"), Message(TOPIC, b"b", message_group="g")]
    with BrokerClient(server.url) as client:
        results = client.relay_committed(messages, producer_group=PG, transaction_id=tx)
    server.kill()
    server.start()
    with BrokerClient(server.url) as client:
        assert client.relay_committed(messages, producer_group=PG, transaction_id=tx) == results
        assert client.transaction_state(tx) is TransactionState.COMMITTED
        assert visible(client, TOPIC) == Counter(m.message_id for m in messages)


def test_the_same_relay_from_two_connections_at_once_stores_one_copy(
        server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    clients = [BrokerClient(server.url), BrokerClient(server.url)]
    try:
        with ThreadPoolExecutor(2) as pool:
            all_ids: list[str] = []
            for _ in range(10):
                tx = uuid.uuid4().hex
                messages = [Message(TOPIC, f"{tx}-{n}".encode()) for n in range(3)]
                all_ids += [m.message_id for m in messages]
                first, second = _at_once(pool, clients, messages, tx)
                assert first == second
        assert visible(clients[0], TOPIC) == Counter(all_ids)
    finally:
        for client in clients:
            client.close()


def test_a_relay_cut_by_a_kill_is_completed_by_its_retry_exactly_once(
        server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory("--log-level", "WARNING")
    ids: list[str] = []
    for delay_ms in (0, 1, 2, 4, 8):
        tx = uuid.uuid4().hex
        messages = [Message(TOPIC, bytes(64 * 1024)) for _ in range(8)]
        ids += [m.message_id for m in messages]
        with BrokerClient(server.url) as client:
            killer = kill_later(server, delay_ms / 1000)
            try:
                client.relay_committed(messages, producer_group=PG, transaction_id=tx)
            except BrokerError:
                pass  # killed before the answer: the relay tries again
            killer.join()
        server.start()
        with BrokerClient(server.url) as client:
            _relay_until_done(client, messages, tx)
            seen = visible(client, TOPIC)
            assert exactly_once(seen, ids), f"kill after {delay_ms} ms: {describe(seen, ids)}"


def test_the_asyncio_client_relays(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    tx, messages = uuid.uuid4().hex, [Message(TOPIC, b"async")]

    async def relay_twice() -> tuple[list[SendResult], list[SendResult]]:
        async with AsyncBrokerClient(server.url) as client:
            first = await client.relay_committed(messages, producer_group=PG, transaction_id=tx)
            return first, await client.relay_committed(messages, producer_group=PG, transaction_id=tx)

    first, again = asyncio.run(relay_twice())
    assert first == again and first[0].message_id == messages[0].message_id
    with BrokerClient(server.url) as client:
        assert visible(client, TOPIC) == Counter([messages[0].message_id])
