"""Transactions: the broker's durable record of every half message's fate.

Half messages live in ``RMQ_SYS_TRANS_HALF_TOPIC``. Everything that happens to a
transaction afterwards is an *op record* in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` whose body is
``{"tx": id, "op": commit|rollback|check|park|recheck, "n": check count, "ts": ms}``.
Replaying both topics on start rebuilds the book exactly: resolutions, check counts and
parked transactions survive restarts. Unlike RocketMQ, the resolution is kept, so a
repeated COMMIT is a no-op and a COMMIT after a ROLLBACK is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import msgspec

from . import codec
from .api import TransactionChecker
from .message import CheckRequest, Resolution, TransactionState
from .store.record import StoredRecord

log = logging.getLogger("broker_embedded.transactions")

OP_COMMIT = "commit"
OP_ROLLBACK = "rollback"
OP_CHECK = "check"
OP_PARK = "park"
OP_RECHECK = "recheck"

_FINAL_OPS = {OP_COMMIT: TransactionState.COMMITTED, OP_ROLLBACK: TransactionState.ROLLED_BACK}
RESOLUTION_OPS = {Resolution.COMMIT: OP_COMMIT, Resolution.ROLLBACK: OP_ROLLBACK}


class Op(msgspec.Struct):
    """One op record's body."""

    tx: str
    op: str
    n: int = 0
    ts: int = 0


encode_op = msgspec.msgpack.Encoder().encode
decode_op = msgspec.msgpack.Decoder(Op).decode


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Transaction:
    """One transaction id: its half messages, state and check bookkeeping."""

    transaction_id: str
    producer_group: str
    halves: list[StoredRecord] = field(default_factory=list)
    state: TransactionState = TransactionState.PENDING
    check_times: int = 0
    next_check_ms: int = 0
    check_deadline: float = 0.0  # monotonic time until which a check is outstanding
    resolved_ms: int | None = None
    #: Serialises the resolution of this transaction only (held across its fsync).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def born_ms(self) -> int:
        return self.halves[0].born_timestamp_ms if self.halves else 0

    @property
    def message_ids(self) -> tuple[str, ...]:
        return tuple(h.properties.get("UNIQ_KEY", "") for h in self.halves)

    def first_check_ms(self, default_timeout_s: float) -> int:
        """Store time of the newest half plus the longest timeout among its messages."""
        timeouts = [
            float(h.properties[codec.TRANSACTION_TIMEOUT])
            for h in self.halves
            if codec.TRANSACTION_TIMEOUT in h.properties
        ]
        timeout = max(timeouts, default=default_timeout_s)
        newest = max(h.store_timestamp_ms for h in self.halves)
        return newest + int(timeout * 1000)


class _SavedRecord(msgspec.Struct, array_like=True):
    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    flags: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    queue_offset: int
    commit_log_offset: int
    size: int


class _SavedTransaction(msgspec.Struct, array_like=True):
    transaction_id: str
    producer_group: str
    state: str
    check_times: int
    resolved_ms: int | None
    halves: list[_SavedRecord]


class BookSnapshot(msgspec.Struct):
    """The book as of the first ``half_upto`` half records and ``op_upto`` op records."""

    half_upto: int
    op_upto: int
    transactions: list[_SavedTransaction]


def _save_record(record: StoredRecord) -> _SavedRecord:
    return _SavedRecord(
        record.topic, record.queue_id, record.body, dict(record.properties), record.flags,
        record.born_timestamp_ms, record.store_timestamp_ms, record.queue_offset,
        record.commit_log_offset, record.size,
    )


def _load_record(saved: _SavedRecord) -> StoredRecord:
    return StoredRecord(
        saved.topic, saved.queue_id, saved.body, saved.properties, saved.flags,
        saved.born_timestamp_ms, saved.store_timestamp_ms, saved.queue_offset,
        saved.commit_log_offset, saved.size,
    )


_encode_snapshot = msgspec.msgpack.Encoder().encode
_decode_snapshot = msgspec.msgpack.Decoder(BookSnapshot).decode


class TransactionBook:
    """Every transaction the broker knows, by id. Callers hold ``lock``.

    Code that writes a half or op record and then applies it to the book does both inside
    ``writing()``, so ``snapshot`` can wait for a moment when every stored record is applied.
    """

    def __init__(self, default_timeout_s: float) -> None:
        self.lock = threading.RLock()
        self.by_id: dict[str, Transaction] = {}
        self.default_timeout_s = default_timeout_s
        self._idle = threading.Condition(self.lock)
        self._writers = 0
        self._snapshotting = False

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Bracket "store a record, then apply it" (waits while a snapshot is being taken)."""
        with self._idle:
            while self._snapshotting:
                self._idle.wait()
            self._writers += 1
        try:
            yield
        finally:
            with self._idle:
                self._writers -= 1
                if not self._writers:
                    self._idle.notify_all()

    def snapshot(self, stored: Callable[[], tuple[int, int]]) -> bytes:
        """The whole book, with ``stored()`` = (half records, op records) in the store, read
        when no write is between its store and its apply."""
        with self._idle:
            self._snapshotting = True
            try:
                while self._writers:
                    self._idle.wait()
                half_upto, op_upto = stored()
                return _encode_snapshot(BookSnapshot(half_upto, op_upto, [
                    _SavedTransaction(
                        tx.transaction_id, tx.producer_group, tx.state.value, tx.check_times,
                        tx.resolved_ms, [_save_record(h) for h in tx.halves],
                    )
                    for tx in self.by_id.values()
                ]))
            finally:
                self._snapshotting = False
                self._idle.notify_all()

    def restore(self, data: bytes, first_offset: int) -> tuple[int, int]:
        """Load a snapshot (on start, before replaying the records after it); resolved
        transactions whose half messages retention deleted (below ``first_offset``) are
        forgotten, as a full replay would."""
        snapshot = _decode_snapshot(data)
        with self.lock:
            for saved in snapshot.transactions:
                gone = all(h.commit_log_offset < first_offset for h in saved.halves)
                if gone and saved.state in (TransactionState.COMMITTED.value, TransactionState.ROLLED_BACK.value):
                    continue
                tx = Transaction(
                    saved.transaction_id, saved.producer_group,
                    [_load_record(h) for h in saved.halves],
                    TransactionState(saved.state), saved.check_times, resolved_ms=saved.resolved_ms,
                )
                if tx.state is TransactionState.PENDING:
                    tx.next_check_ms = tx.first_check_ms(self.default_timeout_s)
                self.by_id[tx.transaction_id] = tx
        return snapshot.half_upto, snapshot.op_upto

    def add_half(self, record: StoredRecord) -> Transaction:
        """Record a stored half message (new or replayed)."""
        props = record.properties
        tx_id = props[codec.TRANSACTION_ID]
        tx = self.by_id.get(tx_id)
        if tx is None:
            tx = Transaction(tx_id, props[codec.PRODUCER_GROUP])
            self.by_id[tx_id] = tx
        tx.halves.append(record)
        if tx.state is TransactionState.PENDING:
            tx.next_check_ms = tx.first_check_ms(self.default_timeout_s)
        return tx

    def apply(self, op: Op) -> None:
        """Apply an op record (new or replayed)."""
        tx = self.by_id.get(op.tx)
        if tx is None:
            return
        if op.op in _FINAL_OPS:
            tx.state = _FINAL_OPS[op.op]
            tx.resolved_ms = op.ts
            # a resolved transaction needs its halves' properties, not their bodies
            tx.halves = [replace(h, body=b"") for h in tx.halves]
        elif op.op == OP_CHECK:
            tx.check_times = max(tx.check_times, op.n)
        elif op.op == OP_PARK and tx.state is TransactionState.PENDING:
            tx.state = TransactionState.PARKED
        elif op.op == OP_RECHECK and tx.state is TransactionState.PARKED:
            tx.state = TransactionState.PENDING
            tx.check_times = 0
            tx.next_check_ms = op.ts

    def unresolved(self) -> Iterator[Transaction]:
        return (tx for tx in self.by_id.values() if tx.state is TransactionState.PENDING)

    def oldest_unresolved_offset(self) -> int | None:
        """The lowest commit log offset still needed by an unresolved transaction."""
        offsets = [
            h.commit_log_offset
            for tx in self.by_id.values()
            if tx.state in (TransactionState.PENDING, TransactionState.PARKED)
            for h in tx.halves
        ]
        return min(offsets, default=None)


class CheckService:
    """Asks the checker about transactions left unresolved past their timeout.

    Each round: a pending transaction whose next check is due is parked if it has been
    checked ``check_max`` times, else handed to the checker (bounded by
    ``max_outstanding``); its count is made durable first, RocketMQ's "put back before
    checking". A checker that has no route (returns False) costs no count.
    """

    def __init__(
        self,
        book: TransactionBook,
        checker: Callable[[], TransactionChecker],
        write_op: Callable[[Op], None],
        check_interval_s: float,
        check_max: int,
        max_outstanding: int,
    ) -> None:
        self.book = book
        self.checker = checker
        self.write_op = write_op
        self.check_interval_ms = int(check_interval_s * 1000)
        self.check_max = check_max
        self.max_outstanding = max_outstanding
        self.checks_sent = 0

    def outstanding(self) -> int:
        now = time.monotonic()
        with self.book.lock:  # other threads add transactions meanwhile
            return sum(1 for tx in self.book.unresolved() if tx.check_deadline > now)

    def answered(self, tx: Transaction) -> None:
        """A check answer arrived (any resolution, UNKNOWN included): free its slot."""
        tx.check_deadline = 0.0

    def run_once(self) -> None:
        """One round over the due transactions."""
        now = now_ms()
        with self.book.lock:
            due = [tx for tx in self.book.unresolved() if tx.next_check_ms <= now]
        due.sort(key=lambda tx: tx.next_check_ms)
        outstanding = self.outstanding()
        for tx in due:
            if tx.check_deadline > time.monotonic():
                continue
            if tx.check_times >= self.check_max:
                self._park(tx)
                continue
            if outstanding >= self.max_outstanding:
                log.warning("check back-pressure: %d checks outstanding", outstanding)
                return
            self._check(tx)
            outstanding += 1

    def _park(self, tx: Transaction) -> None:
        with tx.lock, self.book.writing():  # not while END_TRANSACTION of it is being written
            if tx.state is not TransactionState.PENDING:
                return
            op = Op(tx.transaction_id, OP_PARK, tx.check_times, now_ms())
            self.write_op(op)
            with self.book.lock:
                self.book.apply(op)
        log.warning(
            "transaction %s parked in %s after %d unanswered checks",
            tx.transaction_id, "TRANS_CHECK_MAX_TIME_TOPIC", tx.check_times,
        )

    def _check(self, tx: Transaction) -> None:
        with self.book.lock:
            if tx.state is not TransactionState.PENDING:
                return  # resolved since the round started: never check it again
            tx.check_deadline = time.monotonic() + self.check_interval_ms / 1000
        request = CheckRequest(
            producer_group=tx.producer_group,
            transaction_id=tx.transaction_id,
            message=codec.message_of(tx.halves[0]),
            check_times=tx.check_times + 1,
        )
        log.info(
            "check-back %d/%d for transaction %s (group %s)",
            request.check_times, self.check_max, tx.transaction_id, tx.producer_group,
        )
        try:
            routed = self.checker().request_check(request)
        except Exception:
            log.exception("checker failed for transaction %s", tx.transaction_id)
            routed = False
        tx.next_check_ms = now_ms() + self.check_interval_ms
        if not routed:
            # No route: this round does not count; try again next interval.
            tx.check_deadline = 0.0
            log.info("no checker route for transaction %s (group %s)", tx.transaction_id, tx.producer_group)
            return
        with tx.lock, self.book.writing():
            if tx.state is TransactionState.PENDING:  # the answer may already be in
                op = Op(tx.transaction_id, OP_CHECK, request.check_times, now_ms())
                self.write_op(op)
                with self.book.lock:
                    self.book.apply(op)
        self.checks_sent += 1
