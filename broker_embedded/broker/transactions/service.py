"""The transaction service: half messages, END_TRANSACTION, relays of committed
transactions, parking, re-checks, recovery.

Half messages go to ``RMQ_SYS_TRANS_HALF_TOPIC`` with their real topic and queue in
properties. Every later step is an op record (``ops``). The rule that makes an operation
of several records atomic: **its op record is its decision and is written first**, in one
append with the records it implies. COMMIT writes ``[commit op, real message 1..N]``,
parking writes ``[park op, copies in TRANS_CHECK_MAX_TIME_TOPIC]``, ROLLBACK writes the op
alone. A crash can cut such an append anywhere: if the op did not survive, nothing was
decided and the transaction is still pending (the check service asks again); if it did,
recovery re-writes whichever of the implied records are missing, by message id, so each is
stored exactly once. Recovery never infers a decision from the records that follow one.
A relay (``stage_relay``) writes ``[commit op, relayed messages]`` the same way; its op
names the relayed messages by id only, so the relay's own retry (it was never
acknowledged) stores those a crash cut off.

Unlike RocketMQ the resolution is kept: a repeated COMMIT is a no-op and a COMMIT after a
ROLLBACK is refused, for as long as retention keeps the op record (found by transaction
id through the index once the transaction has left memory).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from ...api import ParkedTransaction, TransactionChecker
from ...errors import (
    CheckUnansweredError,
    CorruptLogError,
    InvalidMessageError,
    TransactionConflictError,
    UnknownTransactionError,
)
from ...message import EndTransactionResult, Message, Resolution, SendResult, TransactionState
from ...store.files import write_atomically
from ...store.message_store import MessageStore
from ...store.record import StoredRecord
from ...topics import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
)
from .. import codec
from ..config import BrokerConfig
from ..writes import EndCall, ForcedResolveCall, HalfCall, RelayCall, Staged
from .book import HalfFields, Transaction, TransactionBook, read_half
from .check_service import CheckService
from .latch import Latch
from .ops import (
    FINAL_STATES,
    OP_CHECK,
    OP_COMMIT,
    OP_PARK,
    OP_RECHECK,
    RESOLUTION_OPS,
    Op,
    decode_op,
    op_record,
)

log = logging.getLogger(__name__)

#: Properties of a half message that its committed copy does not keep.
_HALF_ONLY_PROPERTIES = (
    codec.REAL_TOPIC, codec.REAL_QUEUE_ID, codec.TRANSACTION_TIMEOUT, codec.PRODUCER_GROUP,
)
#: Topics where a message of a transaction is stored without being its committed copy.
_NOT_COMMITTED_COPIES = (HALF_TOPIC, CHECK_MAX_TOPIC)
#: How long a second END waits for a concurrent one with the same resolution.
_CONCURRENT_END_WAIT_S = 30.0

#: Builds the record of a committed message: ``(topic, queue_id, properties, body,
#: delay counted from ms, born ms)``, routed through the delay topic when it is delayed.
RouteRecord = Callable[[str, int, dict[str, str], bytes, int, int], StoredRecord]


def answered(value: object) -> Staged:
    """A call that writes nothing and answers ``value``."""
    return Staged([], lambda _: value)


class TransactionService:
    """Transactions of one broker: staging of SEND_HALF / END, the book, the check service."""

    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig,
        checker: Callable[[], TransactionChecker],
        route: RouteRecord,
        snapshot_path: Path,
    ) -> None:
        self.store = store
        self.route = route
        #: The time of op records and check rounds (the store's: ``StoreConfig.clock``).
        self.clock = store.config.clock
        self.book = TransactionBook(config.transaction_timeout_s)
        self.checks = CheckService(
            self.book, checker, self._first_message, self._write_check, self.park,
            config.check_interval_s, config.check_max, config.max_outstanding_checks, self.clock,
        )
        self._snapshot_path = snapshot_path
        #: Half messages being stored right now, per transaction id; the transactions being
        #: relayed right now (``stage_relay``). Both under the book's lock, both bounded by
        #: the writes in flight.
        self._joining: dict[str, int] = {}
        self._relaying: set[str] = set()
        #: The commit log offsets of the resolutions dispatched since an index write failed
        #: (``MessageIndex.failed_from``), per transaction id: the index lacks them until
        #: the next start indexes them again, and ``resolution_on_disk`` must still find
        #: them. Empty while the index is whole.
        self._unindexed: dict[str, list[int]] = {}

    # -- SEND_HALF ------------------------------------------------------------------------
    def stage_half(self, call: HalfCall, queue_id: int) -> Staged:
        """Stage the record of a validated half message bound for queue ``queue_id``."""
        message = call.message
        props = codec.message_properties(message)
        props.update({
            codec.REAL_TOPIC: message.topic, codec.REAL_QUEUE_ID: str(queue_id),
            codec.TRANSACTION_ID: call.transaction_id, codec.PRODUCER_GROUP: call.producer_group,
        })
        transaction_id = call.transaction_id
        with self.book.lock:
            tx = self.book.by_id.get(transaction_id)
            if tx is not None and (tx.state is not TransactionState.PENDING or tx.ending is not None
                                   or tx.producer_group != call.producer_group):
                raise TransactionConflictError(
                    f"transaction {transaction_id} is {tx.state.value}"
                    f"{' and ending' if tx.ending else ''} or belongs to producer group "
                    f"{tx.producer_group!r}: no half message can join it"
                )
            if transaction_id in self._relaying:
                raise TransactionConflictError(
                    f"transaction {transaction_id} is being relayed as committed: no half message can join it"
                )
            self._joining[transaction_id] = self._joining.get(transaction_id, 0) + 1

        def joined() -> None:
            with self.book.lock:
                left = self._joining.pop(transaction_id) - 1
                if left:
                    self._joining[transaction_id] = left

        try:
            if tx is None and (resolution := self.resolution_on_disk(transaction_id)) is not None:
                raise TransactionConflictError(
                    f"transaction {transaction_id} already ended ({FINAL_STATES[resolution.kind].value})"
                )
        except BaseException:
            joined()
            raise

        def finish(stored: list[StoredRecord]) -> SendResult:
            joined()
            return SendResult(message.message_id, message.topic, queue_id, -1,
                              stored[0].commit_log_offset, call.transaction_id)

        return Staged([StoredRecord(HALF_TOPIC, 0, bytes(message.body), props)], finish, joined)

    # -- END_TRANSACTION ------------------------------------------------------------------
    def stage_end(self, call: EndCall) -> Staged:
        """Stage a COMMIT (op + real messages), a ROLLBACK (op), or the answer to a repeat."""
        if call.from_check:
            self.checks.answered(call.transaction_id, call.producer_group, call.resolution)
            log.info("transaction %s: check-back answer %s", call.transaction_id, call.resolution.value)
        return self._stage_end(call, "check-back answer" if call.from_check else "producer")

    def stage_forced(self, call: ForcedResolveCall) -> Staged:
        """Stage an operator's COMMIT or ROLLBACK of a parked transaction, recorded as given:
        no check-back, its transaction_log is not read."""
        tx = self.parked(call.transaction_id)
        log.warning("transaction %s: %s forced by an operator without a check-back",
                    call.transaction_id, call.resolution.value)
        return self._stage_end(EndCall(call.transaction_id, call.resolution, tx.producer_group),
                               "an operator (forced, no check-back)")

    def ask_checker(self, transaction_id: str, wait_s: float) -> tuple[Resolution, str]:
        """An operator's resolve of a parked transaction: the COMMIT or ROLLBACK its
        producer group's checker answers now, and that group. ``CheckUnansweredError`` for
        no answer or UNKNOWN (nothing changes)."""
        tx = self.parked(transaction_id)
        answer = self.checks.ask_now(tx, wait_s)
        if answer is Resolution.UNKNOWN:
            raise CheckUnansweredError(
                f"the checker of producer group {tx.producer_group!r} answered UNKNOWN for transaction "
                f"{transaction_id} (its local transaction may still hold its transaction_log row); nothing changed"
            )
        log.info("transaction %s: the operator's check-back answered %s", transaction_id, answer.value)
        return answer, tx.producer_group

    def _stage_end(self, call: EndCall, source: str) -> Staged:
        with self.book.lock:
            tx = self.book.by_id.get(call.transaction_id)
            if tx is None or tx.producer_group != call.producer_group:
                tx = None
            elif call.resolution is not Resolution.UNKNOWN:
                if tx.ending is call.resolution and tx.ended is not None:
                    ended = tx.ended
                    return Staged([], lambda _: self._after_concurrent_end(call, ended))
                if tx.ending is not None:
                    raise TransactionConflictError(
                        f"transaction {call.transaction_id} is being resolved as {tx.ending.value}; "
                        f"{call.resolution.value} refused"
                    )
                if self._joining.get(call.transaction_id):
                    raise TransactionConflictError(
                        f"a half message of transaction {call.transaction_id} is still being stored; "
                        "end it once every send_half has returned"
                    )
                tx.ending, tx.ended = call.resolution, Latch()
        if tx is None:
            return answered(self._answer_from_disk(call))
        if call.resolution is Resolution.UNKNOWN:
            log.info("transaction %s: UNKNOWN; it stays pending", call.transaction_id)
            return answered(EndTransactionResult(call.transaction_id, tx.state, False, tx.message_ids))
        try:
            op = self._decision(tx, RESOLUTION_OPS[call.resolution])
            records = [op_record(op)]
            if op.kind == OP_COMMIT:
                records += [self._committed_copy(half, fields, op.timestamp_ms)
                            for half, fields in self._halves_to_commit(op.half_offsets)]
        except BaseException:
            self._end_failed(tx)
            raise

        def finish(_: list[StoredRecord]) -> EndTransactionResult:
            assert tx is not None
            ended = tx.ended
            if ended is not None:  # None: held (oneway) and dropped already, ``_end_failed``
                ended.open()
            # a producer's own END is the everyday case, one per call: not a line each at INFO
            (log.debug if source == "producer" else log.info)(
                "transaction %s %s by %s", call.transaction_id, FINAL_STATES[op.kind].value, source)
            return EndTransactionResult(call.transaction_id, FINAL_STATES[op.kind], True, tx.message_ids)

        return Staged(records, finish, lambda: self._end_failed(tx))

    def _end_failed(self, tx: Transaction) -> None:
        with self.book.lock:
            ended, tx.ending, tx.ended = tx.ended, None, None
        if ended is not None:
            ended.open()

    def _after_concurrent_end(self, call: EndCall, ended: Latch) -> EndTransactionResult:
        """The answer to an END that arrived while the same resolution was being written
        (or, a oneway END, was written and waits for the next fsync: made durable now)."""
        if ended.wait(_CONCURRENT_END_WAIT_S) and self.book.get(call.transaction_id) is not None:
            self.store.flush()  # the open transaction leaves the book once its op is dispatched
        if self.book.get(call.transaction_id) is not None:
            raise TransactionConflictError(
                f"a concurrent {call.resolution.value} of transaction {call.transaction_id} failed; try again"
            )
        return self._answer_from_disk(call)

    def _answer_from_disk(self, call: EndCall) -> EndTransactionResult:
        """The answer to an END for a transaction no longer (or never) open."""
        op = self.resolution_on_disk(call.transaction_id)
        if op is None or (op.producer_group and op.producer_group != call.producer_group):
            raise UnknownTransactionError(
                f"no transaction {call.transaction_id!r} for producer group {call.producer_group!r}"
            )
        state = FINAL_STATES[op.kind]
        if call.resolution is not Resolution.UNKNOWN and RESOLUTION_OPS[call.resolution] != op.kind:
            raise TransactionConflictError(
                f"transaction {call.transaction_id} is already {state.value}; {call.resolution.value} refused"
            )
        return EndTransactionResult(call.transaction_id, state, False, tuple(op.message_ids))

    def resolution_on_disk(self, transaction_id: str) -> Op | None:
        """The commit or rollback op of a transaction, found through the index. A
        transaction committed by several ops (relays that added messages to it) reads as one
        commit op naming the half messages and message ids of them all."""
        found: Op | None = None
        offsets = self.store.lookup_key(OP_HALF_TOPIC, transaction_id)
        if unindexed := self._unindexed.get(transaction_id):
            offsets = sorted({*offsets, *unindexed})
        for offset in offsets:
            record = self.store.get(offset)
            if record.topic != OP_HALF_TOPIC:
                continue
            op = _decode(record)
            if op is None or op.transaction_id != transaction_id or op.kind not in FINAL_STATES:
                continue
            if found is not None and found.kind == op.kind == OP_COMMIT:
                op = msgspec.structs.replace(
                    found, half_offsets=[*found.half_offsets, *op.half_offsets],
                    message_ids=list(dict.fromkeys([*found.message_ids, *op.message_ids])))
            found = op
        return found

    # -- RELAY_COMMITTED ------------------------------------------------------------------
    def stage_relay(self, call: RelayCall, queue_ids: list[int]) -> Staged:
        """Stage the messages of a transaction that committed in the producer's database,
        handed over without half message or END (``queue_ids``: each message's queue).

        ``[commit op, the copies it lacks]`` in one append: a transaction unknown here is
        committed with the messages; a pending (or parked) one is committed with its half
        messages and the messages it does not hold; one committed already gets the messages
        it does not hold yet, under a further commit op. A message it holds (by id) is
        answered with its stored copy and never stored twice. ``TransactionConflictError``
        for a rolled-back transaction, another producer group's, or one being ended or
        relayed right now (retry)."""
        transaction_id = call.transaction_id
        with self.book.lock:
            if transaction_id in self._relaying or self._joining.get(transaction_id):
                raise TransactionConflictError(
                    f"transaction {transaction_id} is being relayed, or a half message of it stored, right now; "
                    "try again"
                )
            tx = self.book.by_id.get(transaction_id)
            if tx is not None:
                if tx.producer_group != call.producer_group or tx.ending is not None:
                    raise TransactionConflictError(
                        f"transaction {transaction_id} belongs to producer group {tx.producer_group!r}"
                        f"{f' and is being resolved as {tx.ending.value}' if tx.ending else ''}; relay refused"
                    )
                tx.ending, tx.ended = Resolution.COMMIT, Latch()
            self._relaying.add(transaction_id)

        def done() -> None:
            with self.book.lock:
                self._relaying.discard(transaction_id)
            if tx is not None and tx.ended is not None:
                tx.ended.open()

        def failed() -> None:
            with self.book.lock:
                self._relaying.discard(transaction_id)
            if tx is not None:
                self._end_failed(tx)

        try:
            records, results = (self._relay_into_open(tx, call, queue_ids) if tx is not None
                                else self._relay_into_ended(call, queue_ids))
        except BaseException:
            failed()
            raise

        def finish(stored: list[StoredRecord]) -> list[SendResult]:
            done()
            log.info("transaction %s: %d messages relayed as committed, %d of them stored now",
                     transaction_id, len(results), max(0, len(stored) - 1))
            return [codec.send_result(stored[r]) if isinstance(r, int) else r for r in results]

        return Staged(records, finish, failed)

    def _relay_into_open(self, tx: Transaction, call: RelayCall,
                         queue_ids: list[int]) -> tuple[list[StoredRecord], list[int | SendResult]]:
        """COMMIT of an open transaction (being ended by this relay) with the relayed
        messages it does not hold: ``[op, a copy per relayed message (of its half message
        where it has a usable one), copies of its other half messages]``; per relayed
        message, the index of its copy."""
        op = self._decision(tx, OP_COMMIT)
        halves = {fields.message_id: (half, fields) for half, fields in self._halves_to_commit(op.half_offsets)}
        copies: list[StoredRecord] = []
        for message, queue_id in zip(call.messages, queue_ids, strict=True):
            held = halves.pop(message.message_id, None)
            if held is not None and not held[1].problem:
                copies.append(self._committed_copy(*held, op.timestamp_ms))
                continue
            if held is None:
                op.message_ids.append(message.message_id)
            # a half message that cannot be committed is replaced by the message relayed for it
            copies.append(self._relayed_copy(message, queue_id, call.transaction_id, op.timestamp_ms))
        copies += [self._committed_copy(half, fields, op.timestamp_ms) for half, fields in halves.values()]
        return [op_record(op), *copies], list(range(1, len(call.messages) + 1))

    def _relay_into_ended(self, call: RelayCall,
                          queue_ids: list[int]) -> tuple[list[StoredRecord], list[int | SendResult]]:
        """The relayed messages of a transaction not open here: those its commit ops on disk
        name and whose copy is stored are answered with that copy; the others are stored
        after a commit op naming them. Per relayed message, its result or the index of its copy."""
        transaction_id = call.transaction_id
        ended = self.resolution_on_disk(transaction_id)
        if ended is not None and (ended.kind != OP_COMMIT
                                  or (ended.producer_group and ended.producer_group != call.producer_group)):
            raise TransactionConflictError(
                f"transaction {transaction_id} is already {FINAL_STATES[ended.kind].value} (producer group "
                f"{ended.producer_group!r}); relay refused"
            )
        named = set(ended.message_ids) if ended is not None else set()
        results: list[int | SendResult] = []
        op = Op(transaction_id, OP_COMMIT, 0, self.clock.time_ms(), call.producer_group, relayed=ended is None)
        copies: list[StoredRecord] = []
        for message, queue_id in zip(call.messages, queue_ids, strict=True):
            stored = self._copy_of(message.message_id, transaction_id) if message.message_id in named else None
            if stored is not None:
                results.append(codec.send_result(stored))
                continue
            if message.message_id in named:  # an append a crash cut after its op: never acknowledged
                log.warning("transaction %s: message %s is named by its commit but not stored; stored now",
                            transaction_id, message.message_id)
            op.message_ids.append(message.message_id)
            copies.append(self._relayed_copy(message, queue_id, transaction_id, op.timestamp_ms))
            results.append(len(copies))
        return ([op_record(op), *copies] if copies else []), results

    def _copy_of(self, message_id: str, transaction_id: str) -> StoredRecord | None:
        """The first committed copy of a message of a transaction (in its topic, or held in
        the delay topic), found through the index; None when there is none."""
        for offset in self.store.lookup_message_id(message_id):
            try:
                record = self.store.get(offset)
            except CorruptLogError as exc:
                log.error("transaction %s: message %s: %s", transaction_id, message_id, exc)
                continue
            if record.topic not in _NOT_COMMITTED_COPIES and record.properties.get(codec.TRANSACTION_ID) == transaction_id:
                return record
        return None

    # -- records --------------------------------------------------------------------------
    def _decision(self, tx: Transaction, kind: str) -> Op:
        return Op(tx.transaction_id, kind, tx.check_times, self.clock.time_ms(), tx.producer_group,
                  tx.half_offsets, list(tx.message_ids))

    def _halves_to_commit(self, offsets: list[int]) -> Iterator[tuple[StoredRecord, HalfFields]]:
        """The half messages of an open transaction and their fields: those the book still
        keeps, the others read from the log."""
        for offset in offsets:
            kept = self.book.fresh_half(offset)
            if kept is None:
                record = self.store.get(offset)
                kept = record, read_half(record)
            yield kept

    def _halves_of(self, op: Op) -> Iterator[StoredRecord]:
        """The half messages a stored op names; an offset that holds no half message of its
        transaction (a damaged op) is logged and skipped."""
        for offset in op.half_offsets:
            try:
                record = self.store.get(offset)
            except CorruptLogError as exc:
                log.error("%s op of transaction %s: %s", op.kind, op.transaction_id, exc)
                continue
            if record.topic == HALF_TOPIC and read_half(record).transaction_id == op.transaction_id:
                yield record
            else:
                log.error("%s op of transaction %s names commit log offset %d, which holds no half message "
                          "of it; skipped", op.kind, op.transaction_id, offset)

    def _committed_copy(self, half: StoredRecord, fields: HalfFields, committed_ms: int) -> StoredRecord:
        """The real message of a committed half message (``fields``: its ``read_half``); a
        delay counts from the commit. ``InvalidMessageError`` for one that cannot be committed."""
        if fields.problem:
            raise InvalidMessageError(
                f"transaction {fields.transaction_id} cannot be committed: its half message at commit log "
                f"offset {half.commit_log_offset} has {fields.problem}; roll it back"
            )
        props = codec.without(half.properties, *_HALF_ONLY_PROPERTIES)
        return self.route(fields.real_topic, fields.real_queue_id, props, half.body, committed_ms,
                          half.born_timestamp_ms)

    def _relayed_copy(self, message: Message, queue_id: int, transaction_id: str, committed_ms: int) -> StoredRecord:
        """The real message of a relayed one, as ``_committed_copy`` makes it of a half message."""
        props = codec.without(codec.message_properties(message), codec.TRANSACTION_TIMEOUT)
        props[codec.TRANSACTION_ID] = transaction_id
        return self.route(message.topic, queue_id, props, bytes(message.body), committed_ms, committed_ms)

    @staticmethod
    def _parked_copy(half: StoredRecord, check_times: int) -> StoredRecord:
        return StoredRecord(CHECK_MAX_TOPIC, 0, half.body,
                            {**half.properties, codec.CHECK_TIMES: str(check_times)},
                            born_timestamp_ms=half.born_timestamp_ms)

    def _first_message(self, tx: Transaction) -> Message:
        return codec.message_of(self.store.get(tx.halves[0].commit_log_offset))

    # -- check service callbacks and admin ------------------------------------------------
    def _write_check(self, tx: Transaction, check_times: int) -> None:
        if self.book.get(tx.transaction_id) is tx and tx.state is TransactionState.PENDING:
            self.store.put(op_record(Op(tx.transaction_id, OP_CHECK, check_times, self.clock.time_ms())))

    def park(self, tx: Transaction) -> None:
        """Park ``tx`` after ``check_max`` unanswered checks: ``[park op, copies]``."""
        with self.book.lock:
            if self.book.by_id.get(tx.transaction_id) is not tx or tx.state is not TransactionState.PENDING \
                    or tx.ending is not None:
                return
        op = self._decision(tx, OP_PARK)
        self.store.put_batch([op_record(op), *(self._parked_copy(h, op.check_times) for h in self._halves_of(op))])
        log.warning("transaction %s parked in %s %s", tx.transaction_id, CHECK_MAX_TOPIC,
                    f"because it cannot be committed ({tx.problem})" if tx.problem
                    else f"after {tx.check_times} unanswered checks")

    def parked(self, transaction_id: str) -> Transaction:
        tx = self.book.get(transaction_id)
        if tx is None or tx.state is not TransactionState.PARKED:
            raise UnknownTransactionError(f"no parked transaction {transaction_id!r}")
        return tx

    def recheck(self, transaction_id: str) -> None:
        """Put a parked transaction back under check with a fresh count."""
        self.parked(transaction_id)
        self.store.put(op_record(Op(transaction_id, OP_RECHECK, 0, self.clock.time_ms())))
        log.info("transaction %s taken out of %s for re-checking", transaction_id, CHECK_MAX_TOPIC)

    def list_parked(self) -> list[ParkedTransaction]:
        return [
            ParkedTransaction(tx.transaction_id, tx.producer_group, tx.message_ids, tx.check_times, tx.born_ms)
            for tx in self.book.in_state(TransactionState.PARKED)
        ]

    def state(self, transaction_id: str) -> TransactionState:
        tx = self.book.get(transaction_id)
        if tx is not None:
            return tx.state
        op = self.resolution_on_disk(transaction_id)
        if op is None:
            raise UnknownTransactionError(f"no transaction {transaction_id!r}")
        return FINAL_STATES[op.kind]

    # -- the log, applied -----------------------------------------------------------------
    def on_dispatch(self, record: StoredRecord) -> None:
        """Apply a durable half or op record to the book (a store dispatch listener)."""
        if record.topic == HALF_TOPIC:
            self.book.add_half(record)
        elif record.topic == OP_HALF_TOPIC:
            op = _decode(record)
            if op is not None:
                self.book.apply(op, record.queue_offset)
                failed = self.store.index.failed_from
                if failed is not None and record.commit_log_offset >= failed and op.kind in FINAL_STATES:
                    self._unindexed.setdefault(op.transaction_id, []).append(record.commit_log_offset)

    def rebuild(self, read_all: Callable[[str, int], Iterator[StoredRecord]]) -> None:
        """Restore the book from its snapshot and the half/op records after its cut, then
        redo the records of any commit or park that a crash cut off."""
        self._restore_snapshot()
        for record in read_all(HALF_TOPIC, self.book.half_applied):
            self.book.add_half(record)
        decided: list[tuple[Op, StoredRecord]] = []
        for record in read_all(OP_HALF_TOPIC, self.book.op_applied):
            op = _decode(record)
            if op is None:
                continue
            self.book.apply(op, record.queue_offset)
            if op.kind in (OP_COMMIT, OP_PARK):
                decided.append((op, record))
        self._redo(decided)

    def _redo(self, decided: list[tuple[Op, StoredRecord]]) -> None:
        """Write again every record a commit or park implies that is not stored after its op."""
        missing: list[StoredRecord] = []
        redone: set[str] = set()
        for op, op_stored in decided:
            for half in self._halves_of(op):
                fields = read_half(half)
                if fields.problem:
                    log.error("cannot redo the %s of transaction %s for its half message at commit log offset "
                              "%d: %s", op.kind, op.transaction_id, half.commit_log_offset, fields.problem)
                    continue
                if op.kind == OP_COMMIT:
                    topics: tuple[str, ...] = (fields.real_topic, SCHEDULE_TOPIC)
                else:
                    topics = (CHECK_MAX_TOPIC,)
                if not self.store.stored_after(fields.message_id, op_stored.commit_log_offset, topics):
                    missing.append(self._committed_copy(half, fields, op.timestamp_ms) if op.kind == OP_COMMIT
                                   else self._parked_copy(half, op.check_times))
                    redone.add(op.transaction_id)
        if missing:
            self.store.put_batch(missing)
            log.warning("recovery redid %d records of %d transactions cut off by a crash: %s",
                        len(missing), len(redone), ", ".join(sorted(redone)[:20]))

    # -- snapshot -------------------------------------------------------------------------
    def write_snapshot(self) -> None:
        """Save the open transactions (O(pending)); the next start replays only what follows."""
        write_atomically(self._snapshot_path, self.book.snapshot(), self.store.fs)

    def _restore_snapshot(self) -> None:
        if not self.store.fs.exists(self._snapshot_path):
            return
        try:
            self.book.restore(self.store.fs.read_bytes(self._snapshot_path), self.store.commitlog.write_offset)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
            log.warning("unreadable %s: replaying every half and op record", self._snapshot_path)
            self.book.clear()


def _decode(record: StoredRecord) -> Op | None:
    try:
        return decode_op(record.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        log.warning("undecodable op record at commit log offset %d skipped", record.commit_log_offset)
        return None
