"""A consumer over TCP keeps what it received across a restart of the broker's process (as
RocketMQ's pop checkpoints keep it): the messages it holds are not delivered to another
consumer of its group before their invisible time, and its client, reconnected, acks them
with the receipts it was given."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_embedded import BrokerClient, Message

from .conftest import ServerProcess

GROUP, TOPIC = "workers", "orders"


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_consumer_acks_what_it_holds_after_the_broker_process_restarts(
        server_factory: Callable[..., ServerProcess], stop: str) -> None:
    server = server_factory()
    with BrokerClient(server.url) as producer:
        producer.create_topic(TOPIC, 2)
        sent = [producer.send(Message(TOPIC, f"m{n}".encode())).message_id for n in range(3)]
    consumer = BrokerClient(server.url)
    try:
        held = consumer.receive(GROUP, TOPIC, max_messages=2, invisible_duration_s=30)
        assert len(held) == 2
        if stop == "SIGTERM":
            assert server.stop() == 0
        else:
            server.kill()
        server.start()
        with BrokerClient(server.url) as other:  # another consumer of the group gets only the third
            rest = other.receive(GROUP, TOPIC, max_messages=10, wait_s=1)
            assert [r.message.message_id for r in rest] == sorted(set(sent) - {h.message.message_id for h in held})
            other.ack(GROUP, rest[0].receipt_handle)
        for received in held:
            consumer.ack(GROUP, received.receipt_handle)  # the receipts it holds, over a new connection
        assert consumer.receive(GROUP, TOPIC, max_messages=10, wait_s=0.5) == []
    finally:
        consumer.close()
