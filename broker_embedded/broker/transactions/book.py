"""The transaction book: the pending and parked transactions, and nothing else.

The book is a projection of the half and op topics, applied as their records are
dispatched (durable), so it never runs ahead of the log. A resolved transaction leaves
the book at once: its resolution lives on disk in its op record (found through the
index), which keeps memory proportional to the transactions still open, not to history.
Pending transactions sit in a heap by next check time, so a check round costs O(due).

The half messages of open transactions are also kept as dispatched, with their fields
read (``fresh_half``), a bounded number of them, so that a commit copies them without
reading the log back and checking them again.

``snapshot`` copies the open transactions and how far the half and op topics are applied,
under the book's lock: a consistent cut without stopping writers for more than the copy.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from ...errors import InvalidTopicError
from ...message import Resolution, TransactionState, is_name, validate_group_once
from ...store.record import PROPERTY_MESSAGE_ID, StoredRecord
from ...topics import MAX_ID_LENGTH
from .. import codec
from ..codec import PropertyError
from ..delay import due_at_ms, target_of
from .latch import Latch
from .ops import FINAL_STATES, OP_CHECK, OP_PARK, OP_RECHECK, Op

log = logging.getLogger(__name__)

#: At most this many half messages, with bodies of this many bytes in all, are kept for
#: their commit (the oldest go first; a commit reads those from the log).
FRESH_HALVES = 4096
FRESH_HALF_BYTES = 8 * 1024 * 1024


class HalfRef(msgspec.Struct, frozen=True):
    """Where a half message is in the commit log, and what the book needs of it."""

    commit_log_offset: int
    size: int
    message_id: str
    born_ms: int
    store_ms: int


@dataclass(eq=False, slots=True)
class Transaction:
    """One open transaction: its half messages, state and check bookkeeping."""

    transaction_id: str
    producer_group: str
    halves: list[HalfRef] = field(default_factory=list)
    #: The longest per-message transaction timeout, None when no message set one (the
    #: broker's default, as configured now, applies).
    timeout_ms: int | None = None
    state: TransactionState = TransactionState.PENDING
    check_times: int = 0
    next_check_ms: int = 0
    #: The resolution an END_TRANSACTION is writing right now, and its completion.
    ending: Resolution | None = None
    ended: Latch | None = None
    #: Why the transaction cannot be committed (a stored half message is unusable): it is
    #: parked at once for an operator, who can only roll it back. Empty for a sound one.
    problem: str = ""

    @property
    def born_ms(self) -> int:
        return self.halves[0].born_ms if self.halves else 0

    @property
    def message_ids(self) -> tuple[str, ...]:
        return tuple(h.message_id for h in self.halves)

    @property
    def half_offsets(self) -> list[int]:
        return [h.commit_log_offset for h in self.halves]


class HalfFields(msgspec.Struct, frozen=True):
    """What the broker reads of a stored half message. ``problem`` says why it cannot be
    committed (empty when it can): a record of an older version, or one damaged behind a
    valid CRC, is read as far as it goes and never stops a start."""

    transaction_id: str
    producer_group: str
    message_id: str
    #: The message's own check timeout in ms; None for none, or for an unusable one (the
    #: broker's default applies, which is harmless).
    timeout_ms: int | None
    real_topic: str
    real_queue_id: int
    problem: str


def read_half(record: StoredRecord) -> HalfFields:
    """The fields of a half message; an unusable transaction id reads as
    ``unreadable-tx-at-<offset>`` so the message can still be parked and resolved."""
    props = record.properties
    problems: list[str] = []
    transaction_id = props.get(codec.TRANSACTION_ID, "")
    if not is_name(transaction_id, MAX_ID_LENGTH):
        problems.append(f"{codec.TRANSACTION_ID}={transaction_id!r}")
        transaction_id = f"unreadable-tx-at-{record.commit_log_offset}"
    group = props.get(codec.PRODUCER_GROUP, "")
    try:
        validate_group_once(group)
    except InvalidTopicError:
        problems.append(f"{codec.PRODUCER_GROUP}={group!r}")
    message_id = props.get(PROPERTY_MESSAGE_ID, "")
    if not is_name(message_id, MAX_ID_LENGTH):
        problems.append(f"{PROPERTY_MESSAGE_ID}={message_id!r}")
    real_topic, real_queue_id = "", 0
    try:
        real_topic, real_queue_id = target_of(record)
        due_at_ms(props, 0)
    except PropertyError as exc:
        problems.append(str(exc))
    timeout_s = codec.tolerant(record, codec.timeout_property, None)
    return HalfFields(transaction_id, group, message_id, None if timeout_s is None else int(timeout_s * 1000),
                      real_topic, real_queue_id, "; ".join(problems))


class _SavedTransaction(msgspec.Struct, array_like=True):
    transaction_id: str
    producer_group: str
    state: str
    check_times: int
    timeout_ms: int | None
    halves: list[tuple[int, int, str, int, int]]
    problem: str = ""


class BookSnapshot(msgspec.Struct):
    """The open transactions as of the first ``half_upto`` half and ``op_upto`` op records."""

    half_upto: int
    op_upto: int
    committed: int
    rolled_back: int
    transactions: list[_SavedTransaction]


encode_snapshot = msgspec.msgpack.Encoder().encode
decode_snapshot = msgspec.msgpack.Decoder(BookSnapshot).decode


class TransactionBook:
    """Open transactions by id; thread-safe (``lock`` may be held around several calls)."""

    def __init__(self, default_timeout_s: float) -> None:
        self.lock = threading.RLock()
        self.by_id: dict[str, Transaction] = {}
        self.default_timeout_s = default_timeout_s
        #: Queue offsets of the next half and op record to apply.
        self.half_applied = 0
        self.op_applied = 0
        #: Resolutions applied since the data directory was created.
        self.committed = 0
        self.rolled_back = 0
        #: How many of ``by_id`` are parked (kept at each change: read without a scan).
        self.parked = 0
        self._due: list[tuple[int, int, str]] = []
        self._sequence = itertools.count()
        #: Half messages of open transactions by commit log offset, oldest first.
        self._fresh: dict[int, tuple[StoredRecord, HalfFields]] = {}
        self._fresh_bytes = 0

    # -- applying the log -----------------------------------------------------------------
    def add_half(self, record: StoredRecord) -> None:
        """Apply a dispatched (or replayed) half message; replays are skipped."""
        with self.lock:
            if record.queue_offset < self.half_applied:
                return
            self.half_applied = record.queue_offset + 1
            half = read_half(record)
            tx = self.by_id.get(half.transaction_id)
            if tx is None:
                tx = self.by_id[half.transaction_id] = Transaction(half.transaction_id, half.producer_group)
            tx.halves.append(HalfRef(record.commit_log_offset, record.size, half.message_id,
                                     record.born_timestamp_ms, record.store_timestamp_ms))
            self._keep_fresh(record, half)
            if half.timeout_ms is not None:
                tx.timeout_ms = max(tx.timeout_ms or 0, half.timeout_ms)
            if half.problem and not tx.problem:
                tx.problem = f"half message at commit log offset {record.commit_log_offset}: {half.problem}"
                log.error("transaction %s cannot be committed (%s); it goes to the parked transactions",
                          tx.transaction_id, tx.problem)
            if tx.state is TransactionState.PENDING:
                self._schedule(tx, self.first_check_ms(tx))

    def apply(self, op: Op, queue_offset: int) -> None:
        """Apply a dispatched (or replayed) op record; replays are skipped."""
        with self.lock:
            if queue_offset < self.op_applied:
                return
            self.op_applied = queue_offset + 1
            tx = self.by_id.get(op.transaction_id)
            if tx is None:
                if op.relayed:  # committed by a relay without ever being open here
                    self.committed += 1
                return
            if op.kind in FINAL_STATES:
                del self.by_id[op.transaction_id]
                self._forget_fresh(tx)
                if tx.state is TransactionState.PARKED:
                    self.parked -= 1
                tx.state = FINAL_STATES[op.kind]
                if tx.state is TransactionState.COMMITTED:
                    self.committed += 1
                else:
                    self.rolled_back += 1
                self._compact_due()
            elif op.kind == OP_CHECK:
                tx.check_times = max(tx.check_times, op.check_times)
            elif op.kind == OP_PARK and tx.state is TransactionState.PENDING:
                tx.state = TransactionState.PARKED
                self.parked += 1
            elif op.kind == OP_RECHECK and tx.state is TransactionState.PARKED:
                tx.state = TransactionState.PENDING
                self.parked -= 1
                tx.check_times = 0
                self._schedule(tx, op.timestamp_ms)

    # -- fresh half messages --------------------------------------------------------------
    def fresh_half(self, commit_log_offset: int) -> tuple[StoredRecord, HalfFields] | None:
        """The half message at ``commit_log_offset`` and its fields, if still kept."""
        with self.lock:
            return self._fresh.get(commit_log_offset)

    def _keep_fresh(self, record: StoredRecord, fields: HalfFields) -> None:
        self._fresh[record.commit_log_offset] = (record, fields)
        self._fresh_bytes += len(record.body)
        while len(self._fresh) > FRESH_HALVES or self._fresh_bytes > FRESH_HALF_BYTES:
            oldest = self._fresh.pop(next(iter(self._fresh)))
            self._fresh_bytes -= len(oldest[0].body)

    def _forget_fresh(self, tx: Transaction) -> None:
        for half in tx.halves:
            kept = self._fresh.pop(half.commit_log_offset, None)
            if kept is not None:
                self._fresh_bytes -= len(kept[0].body)

    # -- checking -------------------------------------------------------------------------
    def first_check_ms(self, tx: Transaction) -> int:
        """Store time of the newest half message plus the transaction's timeout; at once
        for a transaction that cannot be committed (the next round parks it)."""
        if tx.problem:
            return 0
        timeout_ms = tx.timeout_ms if tx.timeout_ms is not None else int(self.default_timeout_s * 1000)
        return max(h.store_ms for h in tx.halves) + timeout_ms

    def _schedule(self, tx: Transaction, when_ms: int) -> None:
        tx.next_check_ms = when_ms
        heapq.heappush(self._due, (when_ms, next(self._sequence), tx.transaction_id))

    def _compact_due(self) -> None:
        """Drop the heap entries of transactions that left (amortised O(1) per resolution)."""
        if len(self._due) > 2 * len(self.by_id) + 1024:
            self._due = [
                (tx.next_check_ms, next(self._sequence), tx.transaction_id)
                for tx in self.by_id.values() if tx.state is TransactionState.PENDING
            ]
            heapq.heapify(self._due)

    def reschedule(self, tx: Transaction, when_ms: int) -> None:
        """Check ``tx`` again at ``when_ms`` (if it is still pending then)."""
        with self.lock:
            if self.by_id.get(tx.transaction_id) is tx and tx.state is TransactionState.PENDING:
                self._schedule(tx, when_ms)

    def pop_due(self, now_ms: int, limit: int) -> list[Transaction]:
        """Up to ``limit`` pending transactions whose check is due, soonest first; O(due)."""
        due: list[Transaction] = []
        with self.lock:
            while self._due and self._due[0][0] <= now_ms and len(due) < limit:
                when, _, tx_id = heapq.heappop(self._due)
                tx = self.by_id.get(tx_id)
                if tx is not None and tx.state is TransactionState.PENDING and tx.next_check_ms == when:
                    due.append(tx)
        return due

    # -- reading --------------------------------------------------------------------------
    def get(self, transaction_id: str) -> Transaction | None:
        with self.lock:
            return self.by_id.get(transaction_id)

    def in_state(self, state: TransactionState) -> list[Transaction]:
        with self.lock:
            return [tx for tx in self.by_id.values() if tx.state is state]

    def oldest(self, state: TransactionState, limit: int) -> tuple[list[Transaction], int]:
        """The ``limit`` oldest transactions in ``state`` (by their first half message's
        arrival) and how many are in that state in all; copies only those shown."""
        with self.lock:
            matching = (tx for tx in self.by_id.values() if tx.state is state)
            shown = list(itertools.islice(matching, limit))
            return shown, len(shown) + sum(1 for _ in matching)

    def open_ids(self, producer_group: str | None = None) -> list[str]:
        """The ids of the open transactions (of ``producer_group`` only if given); O(open)."""
        with self.lock:
            return [tx_id for tx_id, tx in self.by_id.items()
                    if producer_group is None or tx.producer_group == producer_group]

    def oldest_pending_store_ms(self) -> int | None:
        """Store time of the first half message of the oldest pending transaction, or None.
        ``by_id`` keeps the order transactions arrived in, so this passes over the parked
        ones only, never over every open transaction."""
        with self.lock:
            for tx in self.by_id.values():
                if tx.state is TransactionState.PENDING and tx.halves:
                    return tx.halves[0].store_ms
        return None

    def oldest_offset(self) -> int | None:
        """The lowest commit log offset an open transaction still needs (retention keeps it)."""
        with self.lock:
            return min((h.commit_log_offset for tx in self.by_id.values() for h in tx.halves), default=None)

    def __iter__(self) -> Iterator[Transaction]:
        with self.lock:
            return iter(list(self.by_id.values()))

    # -- snapshot -------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The open transactions and how far the log is applied: a consistent cut."""
        with self.lock:
            saved = [
                _SavedTransaction(
                    tx.transaction_id, tx.producer_group, tx.state.value, tx.check_times, tx.timeout_ms,
                    [(h.commit_log_offset, h.size, h.message_id, h.born_ms, h.store_ms) for h in tx.halves],
                    tx.problem,
                )
                for tx in self.by_id.values()
            ]
            cut = (self.half_applied, self.op_applied, self.committed, self.rolled_back)
        return encode_snapshot(BookSnapshot(*cut, saved))

    def restore(self, data: bytes, log_end: int) -> None:
        """Load a snapshot (on start, before replaying the records after its cut). Half
        messages at or past ``log_end`` (a torn tail the snapshot outran) are dropped."""
        snapshot = decode_snapshot(data)
        with self.lock:
            self.half_applied, self.op_applied = snapshot.half_upto, snapshot.op_upto
            self.committed, self.rolled_back = snapshot.committed, snapshot.rolled_back
            for saved in snapshot.transactions:
                halves = [HalfRef(*h) for h in saved.halves if h[0] < log_end]
                if not halves:
                    continue
                tx = Transaction(saved.transaction_id, saved.producer_group, halves, saved.timeout_ms,
                                 TransactionState(saved.state), saved.check_times, problem=saved.problem)
                self.by_id[tx.transaction_id] = tx
                if tx.state is TransactionState.PENDING:
                    self._schedule(tx, self.first_check_ms(tx))
                else:
                    self.parked += 1

    def clear(self) -> None:
        with self.lock:
            self.by_id.clear()
            self._due.clear()
            self._fresh.clear()
            self._fresh_bytes = 0
            self.half_applied = self.op_applied = self.committed = self.rolled_back = self.parked = 0
