"""Bad input gets a typed error and loses nothing."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from broker_embedded import Message, Resolution
from broker_embedded.errors import (
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    ReservedTopicError,
    UnknownTopicError,
)


@pytest.mark.parametrize(
    "topic,error",
    [
        ("", InvalidTopicError),
        ("has space", InvalidTopicError),
        ("x" * 200, InvalidTopicError),
        ("RMQ_SYS_TRANS_HALF_TOPIC", ReservedTopicError),
        ("%DLQ%group", ReservedTopicError),
        ("SCHEDULE_TOPIC_XXXX", ReservedTopicError),
        ("TRANS_CHECK_MAX_TIME_TOPIC", ReservedTopicError),
    ],
)
def test_bad_topics_are_refused(broker_factory, topic, error) -> None:
    broker = broker_factory()
    with pytest.raises(error):
        broker.send(Message(topic, b"x"))
    with pytest.raises(error):
        broker.send_half(Message(topic, b"x"), producer_group="pg", transaction_id="t")


def test_a_bad_topic_is_refused_every_time_next_to_good_ones(broker_factory) -> None:
    broker = broker_factory()
    for _ in range(3):  # a topic checked once is remembered only when it passed
        with pytest.raises(InvalidTopicError):
            broker.send(Message("has space", b"x"))
        with pytest.raises(ReservedTopicError):
            broker.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"))
        assert broker.send(Message("orders", b"x")).topic == "orders"


@pytest.mark.parametrize("group", ["has space", "", ["pg"]])
def test_a_bad_producer_group_is_refused_every_time_with_a_typed_error(broker_factory, group) -> None:
    broker = broker_factory()
    for _ in range(2):  # a group checked once is remembered only when it passed
        with pytest.raises(InvalidTopicError):
            broker.send_half(Message("orders", b"x"), producer_group=group, transaction_id="t")
        with pytest.raises(InvalidTopicError):
            broker.end_transaction("t", Resolution.COMMIT, producer_group=group)
        assert broker.send_half(Message("orders", b"x"), producer_group="pg", transaction_id="t").transaction_id == "t"


def test_a_delayed_send_answers_its_queue_to_be_and_no_offset_yet(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    delayed = broker.send(Message("orders", b"x", delay_level=3))
    sent = broker.send(Message("orders", b"y"))
    assert (delayed.topic, delayed.queue_id, delayed.queue_offset) == ("orders", 0, -1)
    assert (sent.topic, sent.queue_id, sent.queue_offset) == ("orders", 0, 0)


def test_oversize_body_and_bad_delay_are_refused_and_nothing_is_lost(broker_factory) -> None:
    broker = broker_factory(max_body_size=1024)
    kept = broker.send(Message("orders", b"ok"))
    with pytest.raises(MessageTooLargeError):
        broker.send(Message("orders", b"x" * 1025))
    with pytest.raises(InvalidMessageError):
        broker.send(Message("orders", b"x", delay_level=19))
    with pytest.raises(InvalidMessageError):
        broker.send(Message("orders", b"x", delay_level=1, deliver_at_ms=1))
    got = broker.receive("g", "orders", max_messages=10)
    assert [r.message.message_id for r in got] == [kept.message_id]


def test_unknown_topic_when_auto_create_is_off(broker_factory) -> None:
    broker = broker_factory(auto_create_topics=False)
    with pytest.raises(UnknownTopicError):
        broker.send(Message("orders", b"x"))
    broker.create_topic("orders", queues=2)
    assert broker.send(Message("orders", b"x")).queue_id in (0, 1)


@pytest.mark.parametrize(
    "message",
    [
        Message("orders", b"x", message_id=""),
        Message("orders", b"x", message_id="m" * 65),
        Message("orders", b"x", message_id="has space"),
        Message("orders", b"x", keys=("two words",)),
        Message("orders", b"x", keys=("",)),
        Message("orders", b"x", tag="a tag"),
        Message("orders", b"x", keys=""),  # type: ignore[arg-type]  # text, not a tuple of keys
        Message("orders", b"x", keys=["two words"]),  # type: ignore[arg-type]
        Message("orders", b"x", properties=MappingProxyType({"a name": "v"})),
    ],
)
def test_bad_ids_keys_and_tags_are_refused(broker_factory, message) -> None:
    broker = broker_factory()
    with pytest.raises(InvalidMessageError):
        broker.send(message)
    with pytest.raises(InvalidMessageError):
        broker.send_half(message, producer_group="pg", transaction_id="t")
    assert broker.stats().pending_half == 0


@pytest.mark.parametrize("transaction_id", ["", "t" * 65, "bad\nid"])
def test_bad_transaction_ids_are_refused(broker_factory, transaction_id) -> None:
    broker = broker_factory()
    with pytest.raises(InvalidMessageError):
        broker.send_half(Message("orders", b"x"), producer_group="pg", transaction_id=transaction_id)
    with pytest.raises(InvalidTopicError):
        broker.send_half(Message("orders", b"x"), producer_group="bad group", transaction_id="t")


@pytest.mark.parametrize("argument", ["wait_s", "invisible_duration_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 86_401.0, "1", True])
def test_bad_receive_durations_are_refused_and_deliver_nothing(broker_factory, argument, value) -> None:
    broker = broker_factory()
    kept = broker.send(Message("orders", b"ok"))
    with pytest.raises(InvalidMessageError):
        broker.receive("g", "orders", **{argument: value})
    [received] = broker.receive("g", "orders", max_messages=10)
    assert (received.message.message_id, received.delivery_attempt) == (kept.message_id, 1)
    with pytest.raises(InvalidMessageError):
        broker.change_invisible_duration("g", received.receipt_handle, float("nan") if argument == "wait_s" else value)
    broker.ack("g", received.receipt_handle)
