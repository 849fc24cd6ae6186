"""``delete_group``: a consumer group no longer used stops being reported (lag, messages in
flight, DLQ depth), across restarts; consumers of it that come back resume where it stopped;
a group that is consuming is refused."""

from __future__ import annotations

import threading

import pytest

from broker_embedded import Message
from broker_embedded.errors import (
    GroupInUseError,
    InvalidTopicError,
    UnknownGroupError,
    UnknownTopicError,
)


def _consume(broker, group: str, topic: str, count: int, dead: int = 0) -> list[str]:
    """Receive ``count`` messages for ``group``; dead-letter the first ``dead``, ack the rest;
    their ids in order."""
    received = broker.receive(group, topic, max_messages=count, wait_s=2)
    assert len(received) == count
    for n, item in enumerate(received):
        (broker.dead_letter if n < dead else broker.ack)(group, item.receipt_handle)
    return [item.message.message_id for item in received]


@pytest.mark.parametrize("restart", ["replayed", "from a snapshot"])
def test_a_retired_group_is_no_longer_reported_and_a_restart_keeps_it_so(broker_factory, restart: str) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    for n in range(3):
        broker.send(Message("orders", f"m{n}".encode()))
    _consume(broker, "retired", "orders", 3, dead=1)
    _consume(broker, "kept", "orders", 3)
    broker.send(Message("orders", b"after"))  # the retired group's lag would be 1 from now on
    assert broker.stats().consumer_lag == {"retired": {"orders": 1}, "kept": {"orders": 1}}
    assert broker.stats().dlq_depth == {"retired": 1}

    deleted = broker.delete_group("retired")
    assert (deleted.group, deleted.dead_letters) == ("retired", 1) and deleted.queues >= 1

    def only_kept_is_reported() -> None:
        stats = broker.stats()
        assert stats.consumer_lag == {"kept": {"orders": 1}}
        assert stats.dlq_depth == {}
        assert {queue.group for queue in broker.consumer_queues()} == {"kept"}
        assert broker.list_dlq("retired") == []

    only_kept_is_reported()
    with pytest.raises(UnknownGroupError):
        broker.delete_group("retired")  # deleted already
    broker.close()  # writes the snapshots
    if restart == "replayed":  # as after a crash before any snapshot: every event replayed
        broker._consumer_snapshot_path.unlink()
    broker = broker_factory()
    only_kept_is_reported()
    with pytest.raises(UnknownGroupError):
        broker.delete_group("retired")


def test_consumers_that_come_back_resume_where_the_group_stopped(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    old = [broker.send(Message("orders", f"m{n}".encode())).message_id for n in range(2)]
    [dead_before] = _consume(broker, "g", "orders", 2, dead=1)[:1]
    broker.delete_group("g")
    new = broker.send(Message("orders", b"new")).message_id
    broker.close()
    broker = broker_factory()
    assert _consume(broker, "g", "orders", 1, dead=1) == [new]  # not the two it had done
    assert broker.receive("g", "orders", wait_s=0.2) == []
    assert [d.message.message_id for d in broker.list_dlq("g")] == [new]  # only what it dead-lettered since
    assert broker.stats().dlq_depth == {"g": 1}
    with pytest.raises(UnknownTopicError):
        broker.resend_dlq("g", dead_before)  # forgotten with the group
    broker.resend_dlq("g", new)
    assert [r.message.message_id for r in broker.receive("g", "orders", wait_s=2)] == [new]
    assert dead_before in old


def test_a_group_with_messages_in_flight_is_refused_and_left_as_it_was(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    broker.send(Message("orders", b"a"))
    held = broker.receive("g", "orders", invisible_duration_s=30, wait_s=2)
    with pytest.raises(GroupInUseError, match="1 message"):
        broker.delete_group("g")
    assert broker.stats().consumer_lag == {"g": {"orders": 1}}
    broker.ack("g", held[0].receipt_handle)  # its receipt still holds
    assert broker.delete_group("g").queues >= 1


def test_a_group_whose_receive_is_waiting_is_refused(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 1)
    got: list[object] = []
    polling = threading.Thread(target=lambda: got.extend(broker.receive("g", "orders", wait_s=10)))
    polling.start()
    try:
        for _ in range(200):
            if broker.consumer_queues():
                break
            threading.Event().wait(0.01)
        with pytest.raises(GroupInUseError, match="receive running"):
            broker.delete_group("g")
    finally:
        broker.send(Message("orders", b"wake"))
        polling.join(10)
    assert not polling.is_alive() and len(got) == 1


def test_unknown_and_invalid_groups(broker_factory) -> None:
    broker = broker_factory()
    with pytest.raises(UnknownGroupError):
        broker.delete_group("never-used")
    with pytest.raises(InvalidTopicError):
        broker.delete_group("no spaces")
