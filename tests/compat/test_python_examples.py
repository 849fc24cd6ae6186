"""The example programs of rocketmq-python-client 5.1.x (``python/example/`` of
apache/rocketmq-clients), each as a program of our own making the same client calls with the
same settings against ``halfmoon-broker serve --grpc-port``, asserting what arrives.
``push_consumer_example.py`` (``PushConsumer(config, group, listener, {topic:
FilterExpression()})``) is run by ``test_python_push_consumer.py::test_every_message_once``.

The example's delays (10 s) are shortened to 2 s; everything else is as the examples have it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from broker_embedded.errors import InvalidMessageError, UnsupportedError
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc.convert import PRIORITY_PROPERTY, from_proto, to_proto

from .conftest import GrpcBroker, rocketmq


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _message(topic: str, **fields: Any) -> Any:
    """A message as the examples build it: the topic, then the body, then the other fields."""
    message = rocketmq.Message()
    message.topic = topic
    message.body = b"hello, rocketmq."
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def _consume(broker: GrpcBroker, clients: Callable[[Any], Any], topic: str, count: int,
             expression: Any = None) -> list[list[Any]]:
    """As ``simple_consumer_example.py``: ``receive(32, 15)`` and ``ack`` each, until ``count``
    messages came (bounded); the batches, then one more receive must be empty."""
    consumer = clients(rocketmq.SimpleConsumer(broker.config(), _name("consumer-group"),
                                               {topic: expression or rocketmq.FilterExpression()}, await_duration=1))
    batches: list[list[Any]] = []
    deadline = time.monotonic() + 30
    while sum(map(len, batches)) < count and time.monotonic() < deadline:
        batch = consumer.receive(32, 15)
        for message in batch:
            consumer.ack(message)
        if batch:
            batches.append(batch)
    assert consumer.receive(32, 15) == []
    return batches


def _received(batches: list[list[Any]]) -> list[Any]:
    messages = [message for batch in batches for message in batch]
    assert not any(message.corrupted for message in messages)
    return messages


def test_normal_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """normal_producer_example.py: one message (tag, keys, a property) sent ten times."""
    topic = _name("topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    message = _message(topic, tag="tag", keys="keys")
    message.add_property("key", "value")
    receipts = [producer.send(message) for _ in range(10)]
    assert len({receipt.message_id for receipt in receipts}) == 10
    got = _received(_consume(grpc_broker, clients, topic, 10))
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)
    assert all((m.body, m.tag, tuple(m.keys), m.properties) == (b"hello, rocketmq.", "tag", ("keys",), {"key": "value"})
               for m in got)


def test_async_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """async_producer_example.py: ten ``send_async``, each result read in a done callback."""
    topic = _name("topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    results: list[Any] = []
    all_done = threading.Event()

    def handle_send_result(future: Future[Any]) -> None:
        results.append(future.result())
        if len(results) == 10:
            all_done.set()

    for _ in range(10):
        message = _message(topic, tag="tag", keys="keys")
        message.add_property("send", "async")
        producer.send_async(message).add_done_callback(handle_send_result)
    assert all_done.wait(30)
    got = _received(_consume(grpc_broker, clients, topic, 10))
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in results)
    assert all(m.properties == {"send": "async"} for m in got)


def test_delay_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """delay_producer_example.py: ``delivery_timestamp`` in whole epoch seconds."""
    topic = _name("delay-topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    due_s = int(time.time()) + 2
    producer.send(_message(topic, tag="rocketmq-send-delay-message", delivery_timestamp=due_s))
    got = _received(_consume(grpc_broker, clients, topic, 1))
    assert time.time() >= due_s  # not delivered before its time
    assert [m.tag for m in got] == ["rocketmq-send-delay-message"]


def test_fifo_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """fifo_producer_example.py: nine messages, groups "1" and "2" in turn; each group's
    messages arrive in the order sent."""
    topic = _name("fifo-test-topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    ids = {"1": [], "2": []}
    for i in range(1, 10):
        group = "1" if i % 2 != 0 else "2"
        ids[group].append(producer.send(_message(topic, tag="rocketmq-send-fifo-message",
                                                 message_group=group)).message_id)
    got = _received(_consume(grpc_broker, clients, topic, 9))
    assert {group: [m.message_id for m in got if m.message_group == group] for group in ids} == ids


def test_priority_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """priority_producer_example.py: one message sent with priorities 0 to 9. Each comes with
    its priority, the PRIORITY type, and a receive hands out its higher priorities first."""
    topic = _name("priority-topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    message = _message(topic, tag="tag", keys="keys")
    for i in range(10):
        message.priority = i
        producer.send(message)
    batches = _consume(grpc_broker, clients, topic, 10)
    got = _received(batches)
    assert sorted(m.priority for m in got) == list(range(10))
    assert {m.message_type for m in got} == {pb.PRIORITY}
    for batch in batches:
        assert [m.priority for m in batch] == sorted((m.priority for m in batch), reverse=True)
    with grpc_broker.native() as native:  # natively: the property HALFMOON_PRIORITY, SQL92 filters too
        high = native.receive(_name("group"), topic, filter_expression=f"{PRIORITY_PROPERTY} >= 8",
                              filter_type="SQL92")
    assert sorted(m.message.properties[PRIORITY_PROPERTY] for m in high) == ["8", "9"]


def test_lite_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """lite_producer_example.py: a lite message is refused by the broker (UNSUPPORTED, which
    the client raises as its UnsupportedException), saying why."""
    topic = _name("parent-topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    message = _message(topic)
    message.lite_topic = "lite-test-0"
    with pytest.raises(Exception, match="lite topics .* not implemented") as refused:
        producer.send(message)
    assert type(refused.value).__name__ == "UnsupportedException"
    with grpc_broker.native() as native:
        assert native.receive(_name("group"), topic) == []


def test_lite_push_consumer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """lite_push_consumer_example.py: ``subscribe_lite`` fails with the broker's UNIMPLEMENTED."""

    class Listener(rocketmq.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            return rocketmq.ConsumeResult.SUCCESS

    consumer = clients(rocketmq.LitePushConsumer(grpc_broker.config(), _name("consumer-group"), _name("topic"),
                                                 Listener()))
    with pytest.raises(Exception, match="SyncLiteSubscription is not implemented"):
        consumer.subscribe_lite("lite-test-0")


def test_simple_consumer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """simple_consumer_example.py: ``{topic: FilterExpression()}`` takes every message;
    ``subscribe(topic, FilterExpression("tag"))`` then only the tagged ones."""
    topic = _name("topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for tag in ("tag", "other"):
        producer.send(_message(topic, tag=tag))
    consumer = clients(rocketmq.SimpleConsumer(grpc_broker.config(), _name("consumer-group"),
                                               {topic: rocketmq.FilterExpression()}, await_duration=1))
    consumer.subscribe(topic)
    every = [m for _ in range(3) for m in consumer.receive(32, 15)]
    assert sorted(m.tag for m in every) == ["other", "tag"]
    for m in every:
        consumer.ack(m)
    consumer.subscribe(topic, rocketmq.FilterExpression("tag"))
    for tag in ("other", "tag"):
        producer.send(_message(topic, tag=tag))
    tagged = [m for _ in range(3) for m in consumer.receive(32, 15)]
    assert [m.tag for m in tagged] == ["tag"]


def test_the_broker_checks_priority_and_lite_messages_itself() -> None:
    """What the clients refuse before sending is refused by the broker as well; a priority
    travels as ``SystemProperties.priority``, not as a user property."""
    def sent(**properties: Any) -> pb.Message:
        return pb.Message(topic=pb.Resource(name="t"), body=b"x",
                          system_properties=pb.SystemProperties(message_id="id-1", **properties))

    for properties in ({"priority": -1}, {"priority": 1, "message_group": "g"},
                       {"priority": 1, "message_type": pb.TRANSACTION}):
        with pytest.raises(InvalidMessageError):
            from_proto(sent(**properties))
    with pytest.raises(UnsupportedError, match="lite topics"):
        from_proto(sent(lite_topic="lite-1", message_type=pb.LITE))
    spoofed = sent(priority=3, message_type=pb.PRIORITY)
    spoofed.user_properties[PRIORITY_PROPERTY] = "9"
    back = to_proto(from_proto(spoofed))
    assert (back.system_properties.priority, back.system_properties.message_type) == (3, pb.PRIORITY)
    assert PRIORITY_PROPERTY not in back.user_properties
    assert to_proto(from_proto(sent())).system_properties.message_type == pb.NORMAL


def test_transaction_producer_example(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """transaction_producer_example.py: a checker answering COMMIT; one transaction left to the
    broker's check-back (``check_from_server``), one committed directly; both delivered."""

    class TestChecker(rocketmq.TransactionChecker):  # type: ignore[misc,name-defined]
        def check(self, message: Any) -> Any:
            return rocketmq.TransactionResolution.COMMIT

    topic = _name("topic")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,), checker=TestChecker()))
    ids = []
    for commit in (False, True):
        transaction = producer.begin_transaction()
        ids.append(producer.send(_message(topic, tag="rocketmq-send-transaction-message"), transaction).message_id)
        if commit:
            transaction.commit()
    got = _received(_consume(grpc_broker, clients, topic, 2))
    assert sorted(m.message_id for m in got) == sorted(ids)
