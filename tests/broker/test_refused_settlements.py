"""A settlement the disk refuses changes nothing: an ack, a dead-lettering, a move to the
DLQ after the last attempt and a ChangeInvisibleDuration that cannot be stored (here a full
disk: ``StoreFullError``) leave the message as it was, in flight with the receipt its
consumer holds, so the same call settles it once the disk takes writes again; neither a
clean restart nor a snapshot loses it, not even one taken while the refused write was
under way (the broker then killed and restarted from that snapshot). A receive refused so
spends no attempt and hides nothing. Before, the broker marked the message done (or gave
it a new receipt, or an attempt) before storing the event, and kept that when the store
refused it: a dead-lettering refused for a full disk left the message neither delivered
again nor in the DLQ, for good once a snapshot or a clean close wrote the group's
progress, and receives refused for a while sent messages no consumer had seen to the DLQ.
The broker runs on the simulated disk (``tests/sim/disk.py``), whose free space the test
sets, with a simulated clock."""

from __future__ import annotations

import errno
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_embedded import BrokerConfig, EmbeddedBroker, Message
from broker_embedded.errors import StoreFullError, UnknownReceiptError
from broker_embedded.store.config import StoreConfig

from ..sim.clock import SimClock
from ..sim.crash import abandon
from ..sim.disk import SimulatedDisk

GROUP, TOPIC = "g", "orders"
DATA = Path("/broker")
#: The store refuses writes below this much free space.
FLOOR = 1 << 20


class PausingDisk(SimulatedDisk):
    """The simulated disk, whose next commit log write (once ``pause`` is set) waits for
    ``release`` and then fails with ENOSPC: a write under way that the disk refuses."""

    def __init__(self) -> None:
        super().__init__(random.Random(7))
        self.pause, self.paused, self.release = threading.Event(), threading.Event(), threading.Event()

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        path = self._inode(fd).path
        if self.pause.is_set() and path is not None and path.parent.name == "commitlog":
            self.pause.clear()
            self.paused.set()
            self.release.wait(30)
            raise OSError(errno.ENOSPC, "no space left on device")
        return super().pwrite(fd, data, position)


class Broker:
    """An ``EmbeddedBroker`` on a simulated disk whose free space the test sets, reopened at will."""

    def __init__(self) -> None:
        self.disk = PausingDisk()
        self.clock = SimClock()
        store = StoreConfig(filesystem=self.disk, clock=self.clock, min_free_disk_bytes=FLOOR,
                            scrub_bytes_per_s=0, async_flush_interval_s=1e9)
        self.config = BrokerConfig(store=store, sync_consumer_progress=True, max_delivery_attempts=2,
                                   retry_backoff_s=(0.0,), service_tick_s=1e6)
        self.broker = EmbeddedBroker(DATA, self.config)

    def refused_on_a_full_disk(self, call: Callable[[], object]) -> None:
        """``call`` while the disk is full: refused with ``StoreFullError``."""
        self.disk.free = FLOOR - 1
        try:
            with pytest.raises(StoreFullError):
                call()
        finally:
            self.disk.free = 1 << 40

    def restart(self) -> EmbeddedBroker:
        """A clean close (it writes the group's progress to its snapshot) and a reopen."""
        self.broker.close()
        self.broker = EmbeddedBroker(DATA, self.config)
        return self.broker

    def kill_and_reopen(self) -> EmbeddedBroker:
        """The broker killed (no flush, snapshot or close) and reopened."""
        abandon(self.broker)
        self.disk.process_crash()
        self.broker = EmbeddedBroker(DATA, self.config)
        return self.broker


@pytest.fixture
def sim() -> Iterator[Broker]:
    opened = Broker()
    yield opened
    opened.broker.close()


def _received(sim: Broker, invisible_s: float = 30.0) -> str:
    """Send one message and receive it; its receipt handle."""
    sim.broker.send(Message(TOPIC, b"m"))
    [message] = sim.broker.receive(GROUP, TOPIC, max_messages=1, invisible_duration_s=invisible_s)
    return message.receipt_handle


def _dlq(broker: EmbeddedBroker) -> list[bytes]:
    return [stored.message.body for stored in broker.list_dlq(GROUP)]


@pytest.mark.parametrize("restart", [False, True], ids=["", "after a clean restart"])
def test_a_dead_lettering_refused_for_a_full_disk_is_done_again_with_the_same_receipt(sim: Broker,
                                                                                      restart: bool) -> None:
    handle = _received(sim)
    sim.refused_on_a_full_disk(lambda: sim.broker.dead_letter(GROUP, handle))
    broker = sim.restart() if restart else sim.broker
    assert _dlq(broker) == []
    broker.dead_letter(GROUP, handle)
    assert _dlq(broker) == [b"m"]
    sim.clock.advance(60.0)
    assert broker.receive(GROUP, TOPIC, invisible_duration_s=30.0) == []


def test_a_dead_lettering_refused_comes_back_when_its_time_ends_if_nobody_repeats_it(sim: Broker) -> None:
    handle = _received(sim, invisible_s=5.0)
    sim.refused_on_a_full_disk(lambda: sim.broker.dead_letter(GROUP, handle))
    broker = sim.restart()
    sim.clock.advance(6.0)
    [again] = broker.receive(GROUP, TOPIC, invisible_duration_s=30.0)
    assert (again.message.body, again.delivery_attempt) == (b"m", 2)


def test_an_ack_refused_for_a_full_disk_is_taken_with_the_same_receipt(sim: Broker) -> None:
    handle = _received(sim, invisible_s=5.0)
    sim.refused_on_a_full_disk(lambda: sim.broker.ack(GROUP, handle))
    sim.broker.ack(GROUP, handle)
    sim.clock.advance(6.0)
    assert sim.broker.receive(GROUP, TOPIC, invisible_duration_s=30.0) == []
    assert sim.broker.stats().consumer_lag == {GROUP: {TOPIC: 0}}


def test_a_move_to_the_dlq_refused_for_a_full_disk_is_made_by_the_next_receive(sim: Broker) -> None:
    sim.broker.send(Message(TOPIC, b"m"))
    for _ in range(2):  # max_delivery_attempts: 2
        assert len(sim.broker.receive(GROUP, TOPIC, invisible_duration_s=5.0)) == 1
        sim.clock.advance(6.0)
    # its third delivery would be one too many: the receive moves it to the DLQ, and is refused
    sim.refused_on_a_full_disk(lambda: sim.broker.receive(GROUP, TOPIC, invisible_duration_s=5.0))
    broker = sim.restart()
    assert _dlq(broker) == []
    assert broker.receive(GROUP, TOPIC, invisible_duration_s=5.0) == []
    assert _dlq(broker) == [b"m"]


@pytest.mark.parametrize("keep_receipt", [False, True])
def test_a_change_of_invisible_time_refused_for_a_full_disk_leaves_the_receipt_and_its_time(
        sim: Broker, keep_receipt: bool) -> None:
    handle = _received(sim, invisible_s=5.0)
    sim.refused_on_a_full_disk(
        lambda: sim.broker.change_invisible_duration(GROUP, handle, 60.0, keep_receipt=keep_receipt))
    sim.clock.advance(6.0)  # past the receive's 5 s, not the refused change's 60 s
    [again] = sim.broker.receive(GROUP, TOPIC, invisible_duration_s=30.0)
    assert again.delivery_attempt == 2
    with pytest.raises(UnknownReceiptError):
        sim.broker.ack(GROUP, handle)  # the first delivery's receipt, replaced by the second
    sim.broker.ack(GROUP, again.receipt_handle)


def test_a_change_refused_keeps_the_receipt_acking_within_its_time(sim: Broker) -> None:
    handle = _received(sim, invisible_s=5.0)
    sim.refused_on_a_full_disk(lambda: sim.broker.change_invisible_duration(GROUP, handle, 60.0))
    sim.clock.advance(3.0)
    sim.broker.ack(GROUP, handle)
    assert sim.broker.stats().consumer_lag == {GROUP: {TOPIC: 0}}


@pytest.mark.parametrize("settle", ["ack", "dead_letter"])
def test_a_snapshot_taken_while_a_refused_settlement_was_being_written_keeps_the_message(sim: Broker,
                                                                                          settle: str) -> None:
    handle = _received(sim)
    refused: list[BaseException] = []

    def settling() -> None:
        try:
            getattr(sim.broker, settle)(GROUP, handle)
        except Exception as exc:
            refused.append(exc)

    sim.disk.pause.set()
    thread = threading.Thread(target=settling)
    thread.start()
    try:
        assert sim.disk.paused.wait(10), "the settlement never wrote"
        sim.broker.write_snapshots()  # while its event is being written
    finally:
        sim.disk.release.set()
        thread.join(10)
    assert refused, "the disk refused the write: the settlement must fail"
    broker = sim.kill_and_reopen()  # from that snapshot
    getattr(broker, settle)(GROUP, handle)  # still in flight, with the same receipt
    assert _dlq(broker) == ([b"m"] if settle == "dead_letter" else [])


def test_a_receive_refused_for_a_full_disk_spends_no_attempt_and_hides_nothing(sim: Broker) -> None:
    sim.broker.send(Message(TOPIC, b"m"))
    for _ in range(3):  # more than max_delivery_attempts (2)
        sim.refused_on_a_full_disk(lambda: sim.broker.receive(GROUP, TOPIC, invisible_duration_s=5.0))
    [message] = sim.broker.receive(GROUP, TOPIC, invisible_duration_s=5.0)  # at once: not invisible
    assert message.delivery_attempt == 1
    assert _dlq(sim.broker) == []


@pytest.mark.parametrize("settle", ["ack", "dead_letter"])
def test_a_fifo_message_whose_settlement_was_refused_still_holds_back_the_next_of_its_group(
        sim: Broker, settle: str) -> None:
    """Messages of one message group go one at a time, in order: a refused settlement puts
    the first back in flight, ahead of the second (it was put back behind it, so the next
    receive gave the second while the first was still held)."""
    for body in (b"first", b"second"):
        sim.broker.send(Message(TOPIC, body, message_group="alice"))
    [first] = sim.broker.receive(GROUP, TOPIC, max_messages=2, invisible_duration_s=30.0)
    assert first.message.body == b"first"
    assert sim.broker.receive(GROUP, TOPIC, max_messages=2, invisible_duration_s=30.0) == []
    settling = getattr(sim.broker, settle)
    sim.refused_on_a_full_disk(lambda: settling(GROUP, first.receipt_handle))
    assert sim.broker.receive(GROUP, TOPIC, max_messages=2, invisible_duration_s=30.0) == []
    settling(GROUP, first.receipt_handle)
    [second] = sim.broker.receive(GROUP, TOPIC, max_messages=2, invisible_duration_s=30.0)
    assert second.message.body == b"second"
