"""``reset_group``: a consumer group moved on a topic (RocketMQ's resetOffsetByTime), to skip
its backlog or to have messages stored since a time delivered again; durable across
restarts; refused while the group consumes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker_embedded import Message
from broker_embedded.errors import GroupInUseError, InvalidTopicError, UnknownTopicError

from ..sim.clock import SimClock
from .conftest import FAST, reopened


def _drain(broker, group: str, topic: str) -> list[bytes]:
    """Receive and ack until nothing comes; the bodies, sorted."""
    bodies = []
    while received := broker.receive(group, topic, max_messages=32, wait_s=0):
        for item in received:
            broker.ack(group, item.receipt_handle)
            bodies.append(item.message.body)
    return sorted(bodies)


@pytest.mark.parametrize("restart", ["replayed", "from a snapshot"])
def test_a_reset_to_the_end_skips_the_backlog_and_a_restart_keeps_it(broker_factory, restart: str) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 2)
    for n in range(5):
        broker.send(Message("orders", f"backlog{n}".encode()))
    assert broker.stats().consumer_lag == {}
    reset = broker.reset_group("late", "orders")  # a new group, from now on only
    assert (reset.group, reset.topic, reset.queues, reset.lag) == ("late", "orders", 2, 0)
    assert broker.stats().consumer_lag == {"late": {"orders": 0}}
    broker.send(Message("orders", b"new"))
    broker = reopened(broker, broker_factory, replay_every_event=restart == "replayed")
    assert _drain(broker, "late", "orders") == [b"new"]


def test_a_reset_to_a_time_delivers_what_was_stored_since_again_acked_or_not(broker_factory) -> None:
    clock = SimClock()
    broker = broker_factory(store=replace(FAST.store, clock=clock))
    broker.create_topic("orders", 2)
    for n in range(3):
        broker.send(Message("orders", f"before{n}".encode()))
    clock.advance(60)
    since = clock.time_ms()
    for n in range(3):
        broker.send(Message("orders", f"after{n}".encode()))
    assert len(_drain(broker, "g", "orders")) == 6
    reset = broker.reset_group("g", "orders", since)
    assert reset.lag == 3
    assert broker.stats().consumer_lag == {"g": {"orders": 3}}
    assert _drain(broker, "g", "orders") == [b"after0", b"after1", b"after2"]
    assert broker.reset_group("g", "orders", 0).lag == 6  # start: every message kept
    broker.close()
    broker = broker_factory(store=replace(FAST.store, clock=clock))
    assert len(_drain(broker, "g", "orders")) == 6


def test_a_group_consuming_is_refused_and_left_as_it_was(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    broker.send(Message("orders", b"a"))
    held = broker.receive("g", "orders", invisible_duration_s=30, wait_s=1)
    with pytest.raises(GroupInUseError, match="in flight"):
        broker.reset_group("g", "orders")
    broker.ack("g", held[0].receipt_handle)  # its receipt still holds
    assert broker.reset_group("g", "orders", 0).lag == 1
    assert _drain(broker, "g", "orders") == [b"a"]


def test_unknown_and_invalid_topics_and_groups(broker_factory) -> None:
    broker = broker_factory()
    with pytest.raises(UnknownTopicError):
        broker.reset_group("g", "no-such-topic")
    with pytest.raises(InvalidTopicError):
        broker.reset_group("g", "bad topic")
    with pytest.raises(InvalidTopicError):
        broker.reset_group("bad group", "orders")
