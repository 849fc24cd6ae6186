"""``delete_group``: a consumer group no longer used stops being reported (lag, messages in
flight, DLQ depth), across restarts; consumers of it that come back resume where it stopped;
a group that is consuming is refused."""

from __future__ import annotations

import random
import threading
import time

import pytest

from broker_embedded import Message
from broker_embedded.errors import (
    GroupInUseError,
    InvalidTopicError,
    UnknownGroupError,
    UnknownReceiptError,
    UnknownTopicError,
)

from .conftest import reopened


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
    broker = reopened(broker, broker_factory, replay_every_event=restart == "replayed")
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


#: The invisible duration of a receive whose messages come back within the test, and of one
#: whose messages are held across steps (a group holding them cannot be deleted).
SHORT_S, HOLD_S = 0.03, 60.0


@pytest.mark.parametrize("seed", range(6))
def test_deletions_in_a_seeded_mix_never_bring_back_what_the_group_had_done(broker_factory, seed: int) -> None:
    """Whatever mix of sends, receives, acks, dead-letterings, holds, deletions, snapshots and
    restarts a seed draws: a message done (acked or dead-lettered) is not delivered again,
    unless a deletion came after it while an earlier message of its queue was not done
    (the group then resumes from that one); a deletion is refused exactly while messages are
    held, and the DLQ lists only what was dead-lettered since the last deletion."""
    rng = random.Random(seed)
    broker = broker_factory(max_delivery_attempts=1000)
    broker.create_topic("orders", 2)
    position: dict[str, tuple[int, int]] = {}  # message id -> (queue, offset)
    done: set[str] = set()
    held: dict[str, str] = {}  # message id -> receipt handle
    dead_since: set[str] = set()
    used_since = False  # a receive or a dead-lettering since the last deletion
    for step in range(60):
        where = f"seed {seed}, step {step}"
        choice = rng.random()
        if choice < 0.15:
            for _ in range(rng.randint(1, 3)):
                sent = broker.send(Message("orders", b"m"))
                position[sent.message_id] = (sent.queue_id, sent.queue_offset)
        elif choice < 0.55:
            hold = rng.random() < 0.2
            time.sleep(SHORT_S * 1.5)
            received = broker.receive("g", "orders", max_messages=rng.randint(1, 4),
                                      invisible_duration_s=HOLD_S if hold else SHORT_S, wait_s=0)
            used_since = True
            for item in received:
                message_id = item.message.message_id
                assert message_id not in done and message_id not in held, f"{where}: {message_id} came back"
                if hold:
                    held[message_id] = item.receipt_handle
                elif rng.random() < 0.5:
                    try:
                        broker.ack("g", item.receipt_handle)
                    except UnknownReceiptError:
                        continue  # a loaded machine let its invisible duration end first
                    done.add(message_id)
        elif choice < 0.65 and held:
            message_id, handle = held.popitem()
            if rng.random() < 0.5:
                broker.ack("g", handle)
            else:
                broker.dead_letter("g", handle)
                dead_since.add(message_id)
                used_since = True
            done.add(message_id)
        elif choice < 0.8:
            time.sleep(SHORT_S * 1.5)  # what was received for SHORT_S and not acked is no longer in flight
            if held:
                with pytest.raises(GroupInUseError):
                    broker.delete_group("g")
            elif not used_since:
                with pytest.raises(UnknownGroupError):
                    broker.delete_group("g")
            else:
                broker.delete_group("g")
                assert "g" not in broker.stats().consumer_lag, where
                floors = {}
                for queue in (0, 1):
                    offsets = {o for m, (q, o) in position.items() if q == queue and m in done}
                    floors[queue] = next(o for o in range(len(position) + 1) if o not in offsets)
                done = {m for m in done if position[m][1] < floors[position[m][0]]}  # the rest may come again
                dead_since, used_since = set(), False
        else:
            if rng.random() < 0.5:
                broker.write_snapshots()
            broker = reopened(broker, broker_factory, replay_every_event=rng.random() < 0.5,
                              max_delivery_attempts=1000)
        assert {d.message.message_id for d in broker.list_dlq("g", max_messages=1000)} == dead_since, where


def test_the_lag_of_a_group_come_back_counts_from_where_it_stopped_in_every_queue(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", 2)
    for n in range(6):
        broker.send(Message("orders", f"old{n}".encode()))
    for _ in range(2):
        for item in broker.receive("g", "orders", max_messages=16, wait_s=1):
            broker.ack("g", item.receipt_handle)
    assert broker.stats().consumer_lag == {"g": {"orders": 0}}
    broker.delete_group("g")
    new_in_queue_1 = 0
    while broker.send(Message("orders", b"new")).queue_id != 0:
        new_in_queue_1 += 1
    # one message, from queue 0 (read first): queue 1 is not read again by this receive
    [item] = broker.receive("g", "orders", max_messages=1, wait_s=1)
    broker.ack("g", item.receipt_handle)
    assert broker.stats().consumer_lag == {"g": {"orders": new_in_queue_1}}
