"""A consumer over TCP keeps what it received across a restart of the broker's process (as
RocketMQ's pop checkpoints keep it): the messages it holds are not delivered to another
consumer of its group before their invisible time, and its client, reconnected, acks them
with the receipts it was given."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from broker_embedded import BrokerClient, Message, ReceivedMessage
from outbox.consumer import run_consumer

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


def test_a_consumer_loop_mid_batch_during_a_broker_restart_handles_each_message_once(
        server_factory: Callable[..., ServerProcess], caplog: pytest.LogCaptureFixture) -> None:
    """``outbox.consumer.run_consumer`` with a batch in its handler while the broker's process
    is SIGKILLed and started again: its acks after the restart are accepted (no "ack failed"),
    and no message comes back to be handled a second time."""
    server = server_factory()
    with BrokerClient(server.url) as producer:
        producer.create_topic(TOPIC, 2)
        sent = {producer.send(Message(TOPIC, f"m{n}".encode())).message_id for n in range(3)}
    restarted = threading.Event()
    handled: Counter[str] = Counter()

    def handler(received: ReceivedMessage) -> None:
        if not handled:  # the batch's first message: the broker restarts under it
            server.kill()
            server.start()
            restarted.set()
        handled[received.message.message_id] += 1

    stop = threading.Event()
    consumer = BrokerClient(server.url)
    loop = threading.Thread(target=run_consumer, args=(consumer, GROUP, TOPIC, handler, stop),
                            kwargs={"wait_s": 0.5})
    with caplog.at_level("WARNING", logger="outbox"):
        loop.start()
        try:
            assert restarted.wait(60)
            deadline = time.monotonic() + 30
            while set(handled) != sent and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2)  # a message due again after the restart would be handled twice by now
        finally:
            stop.set()
            loop.join(30)
            consumer.close()
    assert handled == Counter({message_id: 1 for message_id in sent})
    assert not [r.getMessage() for r in caplog.records if "ack of" in r.getMessage()]
