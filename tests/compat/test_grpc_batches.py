"""The official client's concurrent acks share the gRPC front's ack batches (as the native
port's do): each is applied once, each answered on its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.compat.conftest import GrpcBroker, rocketmq


def test_concurrent_acks_each_settle_their_message(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic, group = f"acks-{uuid.uuid4().hex[:10]}", f"group-{uuid.uuid4().hex[:10]}"
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    sent = [producer.send_async(_message(topic, f"order {n}".encode())) for n in range(40)]
    assert len({future.result(timeout=30).message_id for future in sent}) == 40
    consumer = clients(rocketmq.SimpleConsumer(grpc_broker.config(), group, {topic: rocketmq.FilterExpression()},
                                               await_duration=5))
    received: list[Any] = []
    while len(received) < 40 and (batch := consumer.receive(32, 2)):  # invisible for 2 s only
        received.extend(batch)
    assert sorted(m.body for m in received) == sorted(f"order {n}".encode() for n in range(40))
    # in flight together (the client's ack_async returns no future in 5.1.2: threads instead);
    # each answered OK (a refused ack raises)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(consumer.ack, received, timeout=30))
    assert consumer.receive(32, 2) == []  # none comes back once its 2 s are over (a 5 s long poll)


def _message(topic: str, body: bytes) -> Any:
    message = rocketmq.Message()
    message.topic, message.body = topic, body
    return message
