"""RocketMQ 5.3's RecallMessage with the official Python client (rocketmq-python-client): a
delayed message's SendReceipt carries a recall handle, and ``Producer.recall_message`` takes
the message back before it is due (the calls of the clients' ProducerRecallMessageExample).
A recall is durable: it holds across a SIGKILL and restart of the broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker_embedded.server.grpc._proto import definition_pb2 as pb

from .conftest import GrpcBroker, eventually, rocketmq, start_grpc_broker


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _delayed(topic: str, body: bytes, in_ms: int) -> Any:
    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    message.delivery_timestamp = int(time.time() * 1000) + in_ms  # 5.1.2: milliseconds
    return message


def _bodies_within(broker: GrpcBroker, group: str, topic: str, seconds: float) -> list[bytes]:
    """Everything the group receives (and acks) within ``seconds``."""
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    with broker.native() as native:
        while (left := deadline - time.monotonic()) > 0:
            for received in native.receive(group, topic, wait_s=min(left, 1.0)):
                got.append(bytes(received.message.body))
                native.ack(group, received.receipt_handle)
    return got


def test_recall_before_delivery(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("recalled")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    receipt = producer.send(_delayed(topic, b"recalled", 1500))
    kept = producer.send(_delayed(topic, b"kept", 1500))
    assert receipt.recall_handle and kept.recall_handle
    assert producer.send(_delayed(topic, b"due now", -1000)).recall_handle is None  # not delayed
    assert producer.recall_message(topic, receipt.recall_handle) == receipt.message_id
    assert producer.recall_message(topic, receipt.recall_handle) == receipt.message_id  # again: harmless
    assert sorted(_bodies_within(grpc_broker, _name("group"), topic, 3.5)) == [b"due now", b"kept"]


def test_recall_refused(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """Too late, an unknown handle, another topic's handle: BAD_REQUEST, nothing recalled."""
    topic, other = _name("recall"), _name("other")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic, other)))
    soon = producer.send(_delayed(topic, b"soon", 300))
    theirs = producer.send(_delayed(other, b"theirs", 1500))
    for asked_topic, handle in ((topic, "not-a-handle"), (topic, theirs.recall_handle)):
        with pytest.raises(Exception, match="recall handle is invalid") as refused:
            producer.recall_message(asked_topic, handle)
        assert getattr(refused.value, "code", None) == pb.BAD_REQUEST
    assert _bodies_within(grpc_broker, _name("group"), topic, 1.5) == [b"soon"]
    with pytest.raises(Exception, match="delivered already") as late:
        producer.recall_message(topic, soon.recall_handle)
    assert getattr(late.value, "code", None) == pb.BAD_REQUEST
    assert _bodies_within(grpc_broker, _name("group"), other, 2.0) == [b"theirs"]  # not taken back


def test_a_recall_survives_sigkill(tmp_path: Path, clients: Callable[[Any], Any]) -> None:
    broker = start_grpc_broker(tmp_path / "broker")
    try:
        topic = _name("durable")
        producer = clients(rocketmq.Producer(broker.config(), (topic,)))
        recalled = producer.send(_delayed(topic, b"recalled", 4000))
        kept = producer.send(_delayed(topic, b"kept", 4000))
        producer.recall_message(topic, recalled.recall_handle)
        broker.process.kill()  # SIGKILL: no snapshot after the recall
        broker = start_grpc_broker(tmp_path / "broker", grpc_port=broker.grpc_port)
        assert _bodies_within(broker, _name("group"), topic, 5.0) == [b"kept"]
        assert eventually(lambda: _recalls_again(producer, topic, recalled.recall_handle))
        assert kept.recall_handle != recalled.recall_handle
    finally:
        broker.process.stop()


def _recalls_again(producer: Any, topic: str, handle: str) -> bool:
    """The repeated recall's answer, after the restart (False while the channel reconnects)."""
    try:
        return bool(producer.recall_message(topic, handle))
    except Exception as exc:
        if "UNAVAILABLE" in str(exc):
            return False
        raise
