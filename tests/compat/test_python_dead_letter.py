"""ForwardMessageToDeadLetterQueue: the official Python client's PushConsumer of a FIFO group
(the broker's ``fifo_groups``) retries a failed message itself, then forwards it to the DLQ;
the RPC called directly, with hostile receipts too."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from broker_embedded import Message
from broker_embedded.broker.config import BrokerConfig
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc._proto import service_pb2 as spb
from broker_embedded.server.grpc.service import SERVICE_NAME

from .conftest import InProcess, eventually, rocketmq, start_grpc_broker

ATTEMPTS = 3


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class FailingListener(rocketmq.MessageListener):  # type: ignore[misc,name-defined]
    """Fails every message whose body starts with "fail"; records each consumption."""

    def __init__(self) -> None:
        self.consumed: list[tuple[str, float]] = []

    def consume(self, message: Any) -> Any:
        body = message.body.decode()
        self.consumed.append((body, time.monotonic()))
        return rocketmq.ConsumeResult.FAILURE if body.startswith("fail") else rocketmq.ConsumeResult.SUCCESS


def test_a_fifo_push_consumer_forwards_what_keeps_failing(in_process: Callable[..., InProcess],
                                                           clients: Callable[[Any], Any]) -> None:
    topic, group = _name("forwarded"), _name("group")
    served = in_process(BrokerConfig(max_delivery_attempts=ATTEMPTS, retry_backoff_s=(1.0,)), fifo_groups=(group,))
    listener = FailingListener()
    clients(rocketmq.PushConsumer(served.config, group, listener, {topic: rocketmq.FilterExpression()}))
    failing = served.broker.send(Message(topic, b"fail always", message_group="account-1"))
    served.broker.send(Message(topic, b"next of the group", message_group="account-1"))
    dead = eventually(lambda: served.broker.list_dlq(group), 30)
    assert [d.message.message_id for d in dead] == [failing.message_id]
    assert eventually(lambda: ("next of the group" in [body for body, _ in listener.consumed]), 10)
    assert [body for body, _ in listener.consumed].count("fail always") == ATTEMPTS  # the client's retries
    assert eventually(lambda: sum(served.broker.stats().consumer_lag.get(group, {}).values()) == 0)
    time.sleep(1.5)  # nothing more: the broker neither redelivers it nor dead-letters it again
    assert [d.message.message_id for d in served.broker.list_dlq(group)] == [failing.message_id]
    assert [body for body, _ in listener.consumed].count("fail always") == ATTEMPTS


def _rpc(endpoint: str, name: str, request: Any, answer: Any) -> Any:
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/{SERVICE_NAME}/{name}", request_serializer=type(request).SerializeToString,
                                   response_deserializer=answer.FromString)
        return call(request, timeout=30)


def _forward(endpoint: str, group: str, topic: str, handle: str) -> int:
    request = spb.ForwardMessageToDeadLetterQueueRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                                         receipt_handle=handle, delivery_attempt=1,
                                                         max_delivery_attempts=ATTEMPTS)
    return int(_rpc(endpoint, "ForwardMessageToDeadLetterQueue", request,
                    spb.ForwardMessageToDeadLetterQueueResponse).status.code)


def test_the_rpc_and_hostile_receipts(in_process: Callable[..., InProcess]) -> None:
    served = in_process(BrokerConfig())
    topic, group = _name("direct"), _name("group")
    sent = served.broker.send(Message(topic, b"poison"))
    received = spb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=1,
                                         message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
    received.invisible_duration.FromSeconds(30)
    received.long_polling_timeout.FromSeconds(5)
    with grpc.insecure_channel(served.endpoint) as channel:
        stream = channel.unary_stream(f"/{SERVICE_NAME}/ReceiveMessage",
                                      request_serializer=spb.ReceiveMessageRequest.SerializeToString,
                                      response_deserializer=spb.ReceiveMessageResponse.FromString)
        [message] = [a.message for a in stream(received, timeout=30) if a.HasField("message")]
    handle = message.system_properties.receipt_handle
    assert _forward(served.endpoint, _name("other"), topic, handle) == pb.INVALID_RECEIPT_HANDLE  # another group's
    assert _forward(served.endpoint, group, topic, "garbage") == pb.INVALID_RECEIPT_HANDLE
    assert _forward(served.endpoint, group, topic, handle) == pb.OK
    assert _forward(served.endpoint, group, topic, handle) == pb.OK  # repeated: harmless (the clients retry)
    assert [d.message.message_id for d in served.broker.list_dlq(group)] == [sent.message_id]
    assert served.broker.receive(group, topic, wait_s=0.3) == []


def test_serve_names_the_fifo_groups(tmp_path: Path) -> None:
    """``serve --grpc-fifo-groups``: those groups' push consumers consume as FIFO, others do not."""
    fifo, other, topic = _name("fifo"), _name("other"), _name("topic")
    broker = start_grpc_broker(tmp_path / "broker", "--grpc-fifo-groups", f"{fifo}, unused")
    consumers = [rocketmq.PushConsumer(broker.config(), group, FailingListener(), {topic: rocketmq.FilterExpression()})
                 for group in (fifo, other)]
    try:
        for consumer in consumers:
            consumer.startup()
        # each has its settings (its consumption is set up from them)
        assert eventually(lambda: all(c._PushConsumer__consumption is not None for c in consumers))
        assert [consumer.fifo for consumer in consumers] == [True, False]
    finally:
        for consumer in consumers:
            consumer.shutdown()
        broker.process.stop()
