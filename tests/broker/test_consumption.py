"""Receive/ack, invisibility and retry, DLQ, FIFO groups, long polling, durability."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from broker_embedded import EmbeddedBroker, Message, ReceivedMessage, Resolution
from broker_embedded.errors import BrokerClosedError, InvalidMessageError, UnknownReceiptError

from ..sim.clock import SimClock
from .conftest import FAST, eventually


def test_each_group_gets_every_message_once_when_it_acks(broker_factory) -> None:
    broker = broker_factory()
    for n in range(20):
        broker.send(Message("orders", f"m{n}".encode()))
    for group in ("billing", "points"):
        got = []
        while batch := broker.receive(group, "orders", max_messages=7):
            for received in batch:
                got.append(received.message.body)
                broker.ack(group, received.receipt_handle)
        assert sorted(got) == sorted(f"m{n}".encode() for n in range(20))
    assert broker.stats().consumer_lag == {"billing": {"orders": 0}, "points": {"orders": 0}}


def test_unacked_message_returns_with_attempt_plus_one_then_goes_to_dlq(broker_factory) -> None:
    broker = broker_factory()
    sent = broker.send(Message("orders", b"poison"))
    attempts = []
    for _ in range(3):
        batch = broker.receive("g", "orders", invisible_duration_s=0.1, wait_s=2)
        attempts.append(batch[0].delivery_attempt)
    assert attempts == [1, 2, 3]
    assert broker.receive("g", "orders", invisible_duration_s=0.1, wait_s=0.5) == []
    dead = broker.list_dlq("g")
    assert [d.message.message_id for d in dead] == [sent.message_id]
    assert dead[0].message.topic == "orders"
    assert broker.stats().dlq_depth == {"g": 1}
    broker.resend_dlq("g", sent.message_id)
    again = broker.receive("g", "orders", wait_s=2)
    assert [r.message.message_id for r in again] == [sent.message_id]
    assert broker.receive("other", "orders", wait_s=0.2)[0].message.body == b"poison"


def test_stale_and_unknown_receipts_are_refused(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"x"))
    first = broker.receive("g", "orders", invisible_duration_s=0.05)[0]
    time.sleep(0.1)
    second = broker.receive("g", "orders", wait_s=1)[0]
    with pytest.raises(UnknownReceiptError):
        broker.ack("g", first.receipt_handle)
    with pytest.raises(UnknownReceiptError):
        broker.ack("g", "garbage")
    with pytest.raises(UnknownReceiptError):
        broker.ack("another-group", second.receipt_handle)
    broker.ack("g", second.receipt_handle)
    with pytest.raises(UnknownReceiptError):
        broker.ack("g", second.receipt_handle)


def test_change_invisible_duration_returns_a_new_handle(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"x"))
    received = broker.receive("g", "orders", invisible_duration_s=0.1)[0]
    with pytest.raises(InvalidMessageError):
        broker.change_invisible_duration("g", received.receipt_handle, 0)
    handle = broker.change_invisible_duration("g", received.receipt_handle, 5)
    time.sleep(0.3)
    assert broker.receive("g", "orders") == []  # still invisible thanks to the extension
    with pytest.raises(UnknownReceiptError):
        broker.ack("g", received.receipt_handle)
    broker.ack("g", handle)


def test_fifo_group_is_delivered_in_order_one_at_a_time(broker_factory) -> None:
    broker = broker_factory()
    for n in range(3):
        broker.send(Message("orders", f"a{n}".encode(), message_group="alice"))
        broker.send(Message("orders", f"b{n}".encode(), message_group="bob"))
    order: dict[str, list[bytes]] = {"alice": [], "bob": []}
    while True:
        batch = broker.receive("g", "orders", max_messages=10, wait_s=0.3)
        if not batch:
            break
        assert len({r.message.message_group for r in batch}) == len(batch), "two of one group at once"
        for received in batch:
            order[received.message.message_group or ""].append(received.message.body)
            broker.ack("g", received.receipt_handle)
    assert order == {"alice": [b"a0", b"a1", b"a2"], "bob": [b"b0", b"b1", b"b2"]}


def test_long_polling_returns_as_soon_as_a_message_arrives(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders")
    threading.Timer(0.3, lambda: broker.send(Message("orders", b"late"))).start()
    started = time.monotonic()
    batch = broker.receive("g", "orders", wait_s=10)
    assert [r.message.body for r in batch] == [b"late"]
    assert time.monotonic() - started < 5


def test_acks_and_in_flight_messages_survive_restart(broker_factory) -> None:
    broker = broker_factory()
    for n in range(4):
        broker.send(Message("orders", f"m{n}".encode()))
    batch = broker.receive("g", "orders", max_messages=4, invisible_duration_s=3)
    acked = {r.message.body for r in batch[:2]}
    for received in batch[:2]:
        broker.ack("g", received.receipt_handle)
    broker.close()
    broker = broker_factory()
    assert broker.receive("g", "orders", max_messages=10) == []  # in flight: invisible until its time
    again = broker.receive("g", "orders", max_messages=10, wait_s=10)
    assert {r.message.body for r in again} == {r.message.body for r in batch[2:]}
    assert not acked & {r.message.body for r in again}
    assert all(r.delivery_attempt == 2 for r in again)


def test_delay_level_and_exact_time(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders")
    sent_at = time.monotonic()
    broker.send(Message("orders", b"level1", delay_level=1))
    broker.send(Message("orders", b"at", deliver_at_ms=time.time_ns() // 1_000_000 + 600))
    assert broker.receive("g", "orders") == []
    got = []
    eventually(lambda: got.extend(broker.receive("g", "orders", wait_s=0.1)) or len(got) == 2, 10)
    assert time.monotonic() - sent_at >= 0.55
    assert sorted(r.message.body for r in got) == [b"at", b"level1"]


def test_delayed_message_survives_restart(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"later", delay_level=1))
    broker.close()
    broker = broker_factory()
    got = []
    eventually(lambda: got.extend(broker.receive("g", "orders", wait_s=0.1)) or got, 10)
    assert [r.message.body for r in got] == [b"later"]
    time.sleep(1.2)
    assert broker.receive("g2", "orders", max_messages=10) and broker.stats().topics[0].depth.count(1) == 1


def test_delay_on_a_transactional_message_applies_after_commit(broker_factory) -> None:
    """RocketMQ 4.5.2 (#1540) lost these: the committed message came back as a half."""
    broker = broker_factory()
    broker.create_topic("orders")
    broker.send_half(Message("orders", b"delayed-tx", delay_level=1), producer_group="pg", transaction_id="t")
    time.sleep(1.2)  # longer than the delay: a half message must not be delivered
    assert broker.receive("g", "orders") == []
    committed_at = time.monotonic()
    broker.end_transaction("t", Resolution.COMMIT, producer_group="pg")
    assert broker.receive("g", "orders", wait_s=0.5) == []  # the delay starts at commit
    got = []
    eventually(lambda: got.extend(broker.receive("g", "orders", wait_s=0.1)) or got, 10)
    assert time.monotonic() - committed_at >= 0.9
    assert [r.message.body for r in got] == [b"delayed-tx"]
    assert broker.stats().pending_half == 0 and broker.checks.checks_sent == 0


def test_a_snapshot_keeps_the_attempts_of_messages_in_flight(broker_factory) -> None:
    """A snapshot written after an in-flight message's deliveries were stored replays none
    of them on restart: it must carry their count itself, or a message redelivered across
    restarts never reaches the DLQ."""
    broker = broker_factory(default_queues=1)
    broker.send(Message("orders", b"poison"))
    attempts: list[int] = []
    eventually(lambda: attempts.extend(r.delivery_attempt for r in broker.receive(
        "g", "orders", invisible_duration_s=0.05, wait_s=0.1)) or len(attempts) == 2, 5)
    assert attempts == [1, 2]
    broker.store.flush()  # both delivery events are stored: the snapshot's cut is past them
    broker.write_snapshots()
    broker.close()
    broker = broker_factory(default_queues=1)
    again = broker.receive("g", "orders", wait_s=1)
    assert [r.delivery_attempt for r in again] == [3]


def test_restart_from_an_older_consumer_snapshot_replays_the_events_after_it(broker_factory, tmp_path) -> None:
    broker = broker_factory(default_queues=1)
    for n in range(6):
        broker.send(Message("orders", f"m{n}".encode()))
    batch = broker.receive("g", "orders", max_messages=6, invisible_duration_s=0.3)
    for received in batch[:2]:
        broker.ack("g", received.receipt_handle)
    broker.write_snapshots()
    snapshot = broker.data_dir / "consumer_state.snapshot"
    older = snapshot.read_bytes()
    broker.ack("g", batch[2].receipt_handle)  # only in the events after the snapshot
    broker.close()
    snapshot.write_bytes(older)  # as if the broker died before its next snapshot
    broker = broker_factory(default_queues=1)
    again = broker.receive("g", "orders", max_messages=10, wait_s=1, invisible_duration_s=0.3)
    assert [r.message.body for r in again] == [b"m3", b"m4", b"m5"]
    assert all(r.delivery_attempt == 2 for r in again)
    broker.close()
    snapshot.write_bytes(b"torn")  # an unreadable snapshot: every event is replayed instead
    broker = broker_factory(default_queues=1)
    assert [r.message.body for r in broker.receive("g", "orders", max_messages=10, wait_s=1)] == [
        b"m3", b"m4", b"m5"]


def test_close_wakes_a_long_polling_receiver(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders")
    outcome: list[BaseException] = []

    def poll() -> None:
        try:
            broker.receive("g", "orders", wait_s=30)
        except BrokerClosedError as exc:
            outcome.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)
    broker.close()
    poller.join(timeout=5)
    assert not poller.is_alive() and outcome


def test_fifo_group_waits_for_its_head_until_it_is_dead_lettered(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"a0", message_group="alice"))
    broker.send(Message("orders", b"a1", message_group="alice"))
    heads = []
    for _ in range(3):  # a0 is never acked; a1 must not overtake it
        batch = broker.receive("g", "orders", max_messages=10, invisible_duration_s=0.1, wait_s=2)
        heads.append([r.message.body for r in batch])
    assert heads == [[b"a0"], [b"a0"], [b"a0"]]
    after = broker.receive("g", "orders", max_messages=10, wait_s=2)
    assert [r.message.body for r in after] == [b"a1"]
    assert [m.message.body for m in broker.list_dlq("g")] == [b"a0"]


def test_a_receive_reads_each_record_it_delivers_once(broker_factory) -> None:
    """The records a receive reads while topping its queues up are the ones it delivers:
    none is read from the commit log a second time (the reads are counted on the store's
    own commit log), within the receive's count and bytes; what does not fit is read again
    when it goes out, whole."""
    broker = broker_factory()
    bodies = {f"m{n}".encode() * (1 + n * 2000) for n in range(12)}  # up to 46 KB, several sizes
    for body in sorted(bodies):
        broker.send(Message("orders", body))
    commitlog = broker.store.commitlog
    reads: list[int] = []
    plain_read, plain_read_many, plain_read_at = commitlog.read, commitlog.read_many, commitlog.read_at

    def counted_read(offset: int, size: int):
        reads.append(offset)
        return plain_read(offset, size)

    def counted_read_many(entries: list[tuple[int, int]]):
        reads.extend(offset for offset, _ in entries)
        return plain_read_many(entries)

    def counted_read_at(offset: int):
        reads.append(offset)
        return plain_read_at(offset)

    commitlog.read, commitlog.read_many, commitlog.read_at = counted_read, counted_read_many, counted_read_at
    first = broker.receive("g", "orders", max_messages=5)
    assert len(first) == 5
    assert reads and len(reads) == len(set(reads)), "a delivered record was read twice"
    # bytes: a receive that returns fewer than it read keeps no more than it can return
    reads.clear()
    small = broker.receive("g", "orders", max_messages=7, max_bytes=50_000)
    assert 1 <= len(small) < 7
    got = [received.message.body for received in first + small]
    while batch := broker.receive("g", "orders", max_messages=12):
        got += [received.message.body for received in batch]
    assert sorted(got) == sorted(bodies)


def test_a_fifo_group_behind_a_long_busy_group_is_delivered_in_the_same_receive(broker_factory) -> None:
    """A receive reads on past the pending messages of a busy FIFO group (its head in
    flight) until it finds deliverable ones, within ``max_inflight_per_queue``: bob's message
    behind 300 of alice's comes with the receive that finds alice busy, not 300 receives later."""
    broker = broker_factory()
    broker.create_topic("fifo", 1)
    for n in range(300):
        broker.send(Message("fifo", f"a{n}".encode(), message_group="alice"))
    broker.send(Message("fifo", b"b0", message_group="bob"))
    assert [r.message.body for r in broker.receive("g", "fifo", max_messages=1)] == [b"a0"]
    assert [r.message.body for r in broker.receive("g", "fifo", max_messages=1)] == [b"b0"]


def _two_received_before_a_restart(broker_factory, clock: SimClock, **config: object) \
        -> tuple[EmbeddedBroker, ReceivedMessage]:
    """m0 and m1 sent to a one-queue topic, both received (invisible 0.5 s on ``clock``), the
    broker restarted: the new broker and m1 as received (its receipt from before the restart)."""
    config["store"] = replace(FAST.store, clock=clock)
    broker = broker_factory(**config)
    broker.create_topic("orders", queues=1)
    for body in (b"m0", b"m1"):
        broker.send(Message("orders", body))
    _, m1 = broker.receive("g", "orders", max_messages=2, invisible_duration_s=0.5, wait_s=2)
    broker.close()
    return broker_factory(**config), m1


def test_a_message_read_ahead_of_its_queue_for_a_receipt_from_before_a_restart_hides_none_behind_it(
        broker_factory) -> None:
    """A receipt from before a restart reads its message out of queue order (no receive
    has read the queue yet); the messages below it, read by the next receive, are delivered
    by that receive."""
    clock = SimClock()
    broker, m1 = _two_received_before_a_restart(broker_factory, clock)
    broker.change_invisible_duration("g", m1.receipt_handle, 60.0)
    clock.advance(0.6)  # m0's invisible time is over
    [again] = broker.receive("g", "orders", max_messages=2, invisible_duration_s=30.0, wait_s=0)
    assert (again.message.body, again.delivery_attempt) == (b"m0", 2)


def test_a_receive_gives_a_message_read_ahead_for_an_old_receipt_once(broker_factory) -> None:
    """A message read ahead of its queue for a receipt from before a restart is picked
    from before the receive reads the queue on, and not again after."""
    clock = SimClock()
    broker, m1 = _two_received_before_a_restart(broker_factory, clock, retry_backoff_s=(0.0,))
    broker.change_invisible_duration("g", m1.receipt_handle, 0.001)
    clock.advance(0.6)  # both invisible times are over
    received = broker.receive("g", "orders", max_messages=4, invisible_duration_s=0.001, wait_s=0)
    assert sorted(r.message.body for r in received) == [b"m0", b"m1"]


def test_a_positive_invisible_duration_under_a_millisecond_is_one_not_none(broker_factory) -> None:
    """The range checked is (0, MAX]: 0.4 ms hides a message for a millisecond, not for no
    time at all (it would come back to the very next receive)."""
    clock = SimClock()
    broker = broker_factory(store=replace(FAST.store, clock=clock))
    broker.send(Message("orders", b"m"))
    [first] = broker.receive("g", "orders", invisible_duration_s=0.0004, wait_s=2)
    assert broker.receive("g", "orders", wait_s=0) == []
    broker.change_invisible_duration("g", first.receipt_handle, 0.0004)
    assert broker.receive("g", "orders", wait_s=0) == []
    clock.advance(0.001)
    [again] = broker.receive("g", "orders", wait_s=0)
    assert (again.message.body, again.delivery_attempt) == (b"m", 2)
