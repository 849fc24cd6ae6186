"""A oneway END_TRANSACTION (RocketMQ's ``endTransactionOneway``) is written without an
fsync of its own: the next write's fsync makes it durable and its messages visible, and
``when_durable`` tells whoever answers it when that happened. One that cannot be written is
dropped: its transaction stays pending, for a later END or the check-back."""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Callable
from pathlib import Path

from broker_embedded import BrokerConfig, EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.broker.writes import EndCall
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import OsFileSystem

from .conftest import FAST, AnsweringChecker, eventually

#: No background flush during a test: only the writes' own fsyncs.
QUIET = BrokerConfig(store=StoreConfig(async_flush_interval_s=3600))


def _counting_fsyncs(broker: EmbeddedBroker) -> list[float]:
    fsyncs: list[float] = []
    broker.store.on_fsync = fsyncs.append
    return fsyncs


def test_a_oneway_end_is_made_durable_and_visible_by_the_next_writes_fsync(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, QUIET)
    try:
        broker.create_topic("orders", queues=1)
        fsyncs = _counting_fsyncs(broker)
        broker.send_half(Message("orders", b"first"), producer_group="shop", transaction_id="tx-1")
        assert len(fsyncs) == 1

        durable: list[str] = []
        [ended] = broker.produce([EndCall("tx-1", Resolution.COMMIT, "shop", oneway=True)])
        broker.when_durable(lambda: durable.append("tx-1"))
        assert ended.applied
        assert len(fsyncs) == 1  # no fsync of its own
        assert broker.unsynced and durable == []
        assert broker.receive("points", "orders", wait_s=0) == []  # not visible before it is durable

        broker.send_half(Message("orders", b"second"), producer_group="shop", transaction_id="tx-2")
        assert len(fsyncs) == 2  # the half's fsync covered the END
        assert durable == ["tx-1"] and not broker.unsynced
        assert broker.transaction_state("tx-1") is TransactionState.COMMITTED
        assert [r.message.body for r in broker.receive("points", "orders", wait_s=0)] == [b"first"]
    finally:
        broker.close()


def test_a_waited_end_in_the_same_batch_makes_the_batch_wait_for_its_fsync(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, QUIET)
    try:
        broker.create_topic("orders", queues=1)
        for transaction_id in ("tx-1", "tx-2"):
            broker.send_half(Message("orders", transaction_id.encode()), producer_group="shop",
                             transaction_id=transaction_id)
        fsyncs = _counting_fsyncs(broker)
        broker.produce([EndCall("tx-1", Resolution.COMMIT, "shop", oneway=True),
                        EndCall("tx-2", Resolution.ROLLBACK, "shop")])
        assert len(fsyncs) == 1 and not broker.unsynced
        assert broker.transaction_state("tx-1") is TransactionState.COMMITTED
        assert broker.transaction_state("tx-2") is TransactionState.ROLLED_BACK
    finally:
        broker.close()


def test_flush_and_close_make_a_oneway_end_durable(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, QUIET)
    broker.create_topic("orders", queues=1)
    for transaction_id in ("tx-1", "tx-2"):
        broker.send_half(Message("orders", transaction_id.encode()), producer_group="shop",
                         transaction_id=transaction_id)
    broker.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
    durable: list[str] = []
    broker.when_durable(lambda: durable.append("flushed"))
    broker.flush()
    assert durable == ["flushed"] and not broker.unsynced
    assert [r.message.body for r in broker.receive("points", "orders", wait_s=0)] == [b"tx-1"]

    broker.end_transaction("tx-2", Resolution.COMMIT, producer_group="shop", oneway=True)
    broker.close()  # an END written without its fsync is flushed by close
    reopened = EmbeddedBroker(tmp_path, QUIET)
    try:
        assert reopened.transaction_state("tx-2") is TransactionState.COMMITTED
    finally:
        reopened.close()


def test_a_refused_oneway_end_stores_nothing(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, QUIET)
    try:
        fsyncs = _counting_fsyncs(broker)
        [refused] = broker.produce([EndCall("tx-unknown", Resolution.COMMIT, "shop", oneway=True)])
        assert isinstance(refused, Exception)
        assert fsyncs == [] and not broker.unsynced
    finally:
        broker.close()


def test_a_repeated_end_while_a_oneway_end_waits_for_its_fsync_is_answered_as_a_repeat(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, QUIET)
    try:
        broker.create_topic("orders", queues=1)
        broker.send_half(Message("orders", b"paid"), producer_group="shop", transaction_id="tx-1")
        broker.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
        assert broker.unsynced
        again = broker.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop")
        assert not again.applied and again.state is TransactionState.COMMITTED
        assert not broker.unsynced  # its answer waited for the first END's fsync
    finally:
        broker.close()


#: The body whose committed copy the disk refuses to write (``PoisonedWrites``).
POISON = b"poison"


class PoisonedWrites(OsFileSystem):
    """The real file system, except that once ``armed`` every write carrying ``POISON`` fails
    with EIO: a held END whose committed copy can never be written."""

    def __init__(self) -> None:
        self.armed = False

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if self.armed and POISON in bytes(data):
            raise OSError(errno.EIO, "injected write error")
        return super().pwrite(fd, data, position)


def _held_end_dropped(broker: EmbeddedBroker, fs: PoisonedWrites) -> None:
    """tx-1's oneway COMMIT held, then dropped by the next write, which is written alone;
    tx-1 is left pending, not being ended."""
    broker.create_topic("orders", queues=1)
    broker.send_half(Message("orders", POISON), producer_group="shop", transaction_id="tx-1")
    fs.armed = True
    durable: list[str] = []
    lost: list[Exception] = []
    [ended] = broker.produce([EndCall("tx-1", Resolution.COMMIT, "shop", oneway=True)])
    broker.when_durable(lambda: durable.append("tx-1"), lost.append)
    assert ended.applied and broker.unsynced

    broker.send(Message("orders", b"next"))  # was: OSError, for this and every later write
    assert durable == [] and [type(exc) for exc in lost] == [OSError]
    assert broker.transaction_state("tx-1") is TransactionState.PENDING
    assert [r.message.body for r in broker.receive("points", "orders", wait_s=0)] == [b"next"]
    fs.armed = False


def test_a_held_end_that_cannot_be_written_is_dropped_and_a_later_end_commits(tmp_path: Path) -> None:
    fs = PoisonedWrites()
    broker = EmbeddedBroker(tmp_path, dataclasses.replace(QUIET, store=dataclasses.replace(QUIET.store, filesystem=fs)))
    try:
        _held_end_dropped(broker, fs)
        again = broker.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop")
        assert again.applied and again.state is TransactionState.COMMITTED
        assert [r.message.body for r in broker.receive("points", "orders", wait_s=0)] == [POISON]
        broker.send(Message("orders", b"last"))
    finally:
        broker.close()
    reopened = EmbeddedBroker(tmp_path, QUIET)
    try:
        assert reopened.transaction_state("tx-1") is TransactionState.COMMITTED
        assert [r.message.body for r in reopened.receive("replay", "orders", wait_s=0)] == [b"next", POISON, b"last"]
    finally:
        reopened.close()


def test_a_dropped_held_end_is_settled_by_the_check_back(broker_factory: Callable[..., EmbeddedBroker]) -> None:
    fs = PoisonedWrites()
    checker = AnsweringChecker(Resolution.COMMIT)
    quiet = dataclasses.replace(FAST.store, async_flush_interval_s=3600, checkpoint_interval_s=3600, filesystem=fs)
    broker = broker_factory(checker, store=quiet)  # only the test's writes drop the held END
    _held_end_dropped(broker, fs)
    eventually(lambda: broker.transaction_state("tx-1") is TransactionState.COMMITTED)
    assert [r.transaction_id for r in checker.requests][:1] == ["tx-1"]
    assert [r.message.body for r in broker.receive("points", "orders", wait_s=0)] == [POISON]
