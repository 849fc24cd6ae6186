"""``EmbeddedBroker``: the whole broker in-process, on one data directory.

The facade only wires RocketMQ's services over one :class:`MessageStore`: the topic
registry (``topic_registry``), transactions (``transactions``: half messages, END, the
check service), delayed delivery (``delay``) and consumer groups with their dead letters
(``consumption``). Each service is a projection of its system topics, applied as records
become durable and rebuilt on start from a small snapshot plus the records after it, so a
restart costs what is pending, not what is past. The TCP server serves this same object.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import msgspec

from ..api import (
    BrokerStats,
    CheckCallback,
    ConsumerQueue,
    DeletedGroup,
    GroupReset,
    OpenTransaction,
    ParkedTransaction,
    TopicInfo,
    TransactionChecker,
    duration_ms,
    validate_receive,
)
from ..checkers import ProducerCallbackChecker, ProducersFirst
from ..errors import BrokerClosedError, BrokerError, InvalidMessageError, UnknownTopicError
from ..filters import EVERY, TAG, parse_filter
from ..message import (
    EndTransactionResult,
    Message,
    MessageLimits,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
)
from ..store.files import write_atomically
from ..store.message_store import MessageStore, fitting
from ..store.record import StoredRecord
from ..topics import (
    CONSUMER_STATE_TOPIC,
    HALF_TOPIC,
    RETRY_PREFIX,
    validate_group,
    validate_user_topic,
)
from . import codec
from .config import BrokerConfig
from .consumption import ConsumerGroups
from .delay import DelayService, route_record
from .observer import BrokerObserver
from .topic_registry import TopicRegistry
from .transactions import CheckService, Transaction, TransactionBook, TransactionService
from .writes import AnyWriteCall, EndCall, ForcedResolveCall, HalfCall, RelayCall, SendCall, Staged

log = logging.getLogger(__name__)

#: The longest an operator's ``resolve_parked`` waits for the checker's answer.
MAX_RESOLVE_WAIT_S = 300.0


class EmbeddedBroker:
    """A durable broker in ``data_dir``; thread-safe. See :class:`BrokerAPI` for the methods."""

    def __init__(
        self,
        data_dir: Path | str,
        config: BrokerConfig | None = None,
        checker: TransactionChecker | None = None,
    ) -> None:
        self.config = config or BrokerConfig()
        self._limits = MessageLimits(self.config.max_body_size, self.config.max_properties_size)
        self.data_dir = Path(data_dir)
        self._closed = threading.Event()
        #: Told of writes and deliveries (metrics); None: nobody is.
        self.observer: BrokerObserver | None = None
        self.store = MessageStore(self.data_dir, self.config.store)
        self.producers = ProducerCallbackChecker()
        self._checker: TransactionChecker = self.producers
        if checker is not None:
            self.set_checker(checker)
        self.topics = TopicRegistry(self.data_dir / "topics.json", self.config.auto_create_topics,
                                    self.config.default_queues, self.store.fs, self.store.queues)
        self.transactions = TransactionService(
            self.store, self.config, lambda: self._checker,
            functools.partial(route_record, clock=self.config.store.clock), self.data_dir / "transactions.snapshot")
        self.delays = DelayService(self.store, self.data_dir / "delay.snapshot", self.data_dir / "recall.key")
        self.consumers = ConsumerGroups(
            self.store, self._queue_count, self.config.max_delivery_attempts,
            self.config.retry_backoff_s, self.config.max_inflight_per_queue, self.config.sync_consumer_progress,
            self.config.store.clock,
        )
        self._consumer_snapshot_path = self.data_dir / "consumer_state.snapshot"
        self._rebuild()
        self.store.add_dispatch_listener(self._on_dispatch)
        self.write_snapshots()  # the rebuilt state, redone records included, is the new cut
        self._clock = self.config.store.clock
        self._timers = _Timers(float("-inf"), self._clock.monotonic(), self._clock.monotonic())
        self._service = threading.Thread(target=self._run_services, name="broker-services", daemon=True)
        self._service.start()
        log.info(
            "broker open on %s: %d topics, %d open transactions, %d delayed (recovered in %.2fs)",
            self.data_dir, len(self.topics), len(self.book.by_id), len(self.delays), self.store.recovery_seconds,
        )

    @property
    def book(self) -> TransactionBook:
        """The open (pending and parked) transactions."""
        return self.transactions.book

    @property
    def checks(self) -> CheckService:
        return self.transactions.checks

    # -- start-up -------------------------------------------------------------------------
    def iter_queue(self, topic: str, queue_id: int = 0, start: int = 0) -> Iterator[StoredRecord]:
        """Every record of a queue (system topics included) from ``start``, oldest first."""
        self.store.settle()
        offset = max(start, self.store.queue_min_offset(topic, queue_id))
        while batch := self.store.read_queue(topic, queue_id, offset, 256):
            yield from batch
            offset = batch[-1].queue_offset + 1

    def read_all(self, topic: str, queue_id: int = 0, start: int = 0) -> list[StoredRecord]:
        """``iter_queue`` as a list."""
        return list(self.iter_queue(topic, queue_id, start))

    def _rebuild(self) -> None:
        self.transactions.rebuild(lambda topic, start: self.iter_queue(topic, 0, start))
        self.delays.rebuild(self.iter_queue)
        events_from = self._restore_consumer_snapshot()
        self.consumers.replay(self.iter_queue(CONSUMER_STATE_TOPIC, 0, events_from))

    def _restore_consumer_snapshot(self) -> int:
        """Load the consumer snapshot if there is one; the event offset to replay from."""
        if not self.store.fs.exists(self._consumer_snapshot_path):
            return 0
        try:
            return self.consumers.restore(self.store.fs.read_bytes(self._consumer_snapshot_path))
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("unreadable %s: replaying every consumer event", self._consumer_snapshot_path)
            self.consumers.progress.clear()
            return 0

    def write_snapshots(self) -> None:
        """Save open transactions, delay marks and every group's progress (each fsync'd and
        renamed into place), so the next start replays only the records stored after them."""
        self.transactions.write_snapshot()
        self.delays.write_snapshot(lambda path, data: write_atomically(path, data, self.store.fs))
        consumers = self.consumers.snapshot(lambda: self.store.queue_max_offset(CONSUMER_STATE_TOPIC, 0))
        write_atomically(self._consumer_snapshot_path, consumers, self.store.fs)

    # -- topics ---------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        self.topics.create(topic, queues)
        return self._topic_info(topic)

    def _topic_info(self, topic: str) -> TopicInfo:
        queues = self.topics.queues[topic]
        return TopicInfo(topic, queues, tuple(self.store.queue_max_offset(topic, q) for q in range(queues)))

    def list_topics(self) -> list[TopicInfo]:
        self.store.settle()
        return [self._topic_info(topic) for topic in self.topics.names()]

    def _queue_count(self, topic: str) -> int:
        return self.topics.queues.get(topic) or self.store.queues().get(topic, 0)

    @property
    def closed(self) -> bool:
        """True once ``close`` began: the broker takes no more requests."""
        return self._closed.is_set()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise BrokerClosedError("the broker is closed")

    # -- producing ------------------------------------------------------------------------
    def produce(self, calls: Sequence[AnyWriteCall]) -> list[Any]:
        """Run write calls as one batch: each is staged (a call that fails staging gets its
        error and writes nothing), all their records go into one append and one fsync, and
        each call gets its result or exception, in order. The server groups concurrent
        SEND_MESSAGE, SEND_HALF_MESSAGE, END_TRANSACTION and RELAY_COMMITTED requests
        through this."""
        observer = self.observer
        if observer is None:
            return self._produce(calls)
        started = time.perf_counter()
        outcomes = self._produce(calls)
        observer.written(len(calls), time.perf_counter() - started)
        return outcomes

    def answering_first(self) -> AbstractContextManager[None]:
        """A block in which this thread's writes are answered before they are dispatched
        (``MessageStore.answering_first``): a front's run of a few writes on its event loop.
        Every call of this broker from another thread waits for that dispatch first."""
        return self.store.answering_first()

    def _produce(self, calls: Sequence[AnyWriteCall]) -> list[Any]:
        self.store.settle()
        self._check_open()
        staged: list[Staged | Exception] = []
        for call in calls:
            try:
                staged.append(self._stage(call))
            except Exception as exc:
                staged.append(exc)
        records = [record for s in staged if isinstance(s, Staged) for record in s.records]
        waited = not all(isinstance(call, EndCall) and call.oneway for call in calls)

        def abort() -> None:  # a failed write, or held oneway ENDs dropped: each transaction stays pending
            for s in staged:
                if isinstance(s, Staged):
                    s.abort()

        try:
            stored = self.store.put_batch(records, hold=not waited, on_dropped=abort) if records else []
        except Exception as exc:
            abort()
            return [s if isinstance(s, Exception) else exc for s in staged]
        outcomes: list[Any] = []
        position = 0
        for s in staged:
            if isinstance(s, Exception):
                outcomes.append(s)
                continue
            mine, position = stored[position:position + len(s.records)], position + len(s.records)
            try:
                outcomes.append(s.finish(mine))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _stage(self, call: AnyWriteCall) -> Staged:
        """Validate ``call`` and turn it into its records (``_produce`` checked that the
        broker is open)."""
        call.validate(self._limits)
        if isinstance(call, SendCall):
            message = call.message
            queue_id = self.topics.select_queue(message)
            now = self._clock.time_ms()
            record = route_record(message.topic, queue_id, codec.message_properties(message),
                                  bytes(message.body), now, clock=self._clock)
            return Staged([record], lambda stored: self.delays.with_recall_handle(codec.send_result(stored[0])))
        if isinstance(call, HalfCall):
            return self.transactions.stage_half(call, self.topics.select_queue(call.message))
        if isinstance(call, EndCall):
            return self.transactions.stage_end(call)
        if isinstance(call, RelayCall):
            return self.transactions.stage_relay(call, [self.topics.select_queue(m) for m in call.messages])
        return self.transactions.stage_forced(call)

    def _one(self, call: AnyWriteCall) -> Any:
        outcome = self.produce([call])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def send(self, message: Message) -> SendResult:
        return self._one(SendCall(message))  # type: ignore[no-any-return]

    def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages with one append and one fsync; per message a result or the
        typed error that refused it (the others are still sent)."""
        return self.produce([SendCall(message) for message in messages])

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        return self._one(HalfCall(message, producer_group, transaction_id))  # type: ignore[no-any-return]

    def end_transaction(
        self, transaction_id: str, resolution: Resolution, *, producer_group: str,
        from_check: bool = False, oneway: bool = False,
    ) -> EndTransactionResult:
        return self._one(EndCall(transaction_id, resolution, producer_group, from_check,  # type: ignore[no-any-return]
                                 oneway))

    def when_durable(self, callback: Callable[[], None], lost: Callable[[Exception], None] | None = None) -> None:
        """Call ``callback`` once everything written so far is durable and visible: at
        once, or in the thread of the fsync that covers it (the next write's, ``flush``'s,
        or the store's background flush for oneway ENDs). Held oneway ENDs that cannot be
        written are dropped (their transactions stay pending, for the check-back): then
        ``lost`` is called instead, with why (``MessageStore.put_batch``)."""
        self.store.when_durable(callback, lost)

    @property
    def unsynced(self) -> bool:
        """Whether records were held (oneway ENDs) or written (consumer progress) that no
        fsync covers yet (``flush`` does). From another thread than a front's event loop, after
        the dispatch of a write run the loop answered first (``settle``), as every reader."""
        self.store.settle()
        return self.store.unsynced

    def flush(self) -> None:
        """fsync what is written and not yet durable (oneway ENDs), and make it visible."""
        self.store.flush()

    def relay_committed(self, messages: list[Message], *, producer_group: str,
                        transaction_id: str) -> list[SendResult]:
        return self._one(RelayCall(messages, producer_group, transaction_id))  # type: ignore[no-any-return]

    def recall(self, topic: str, recall_handle: str) -> str:
        self.store.settle()
        self._check_open()
        validate_user_topic(topic)
        return self.delays.recall(topic, recall_handle)

    def transaction_state(self, transaction_id: str) -> TransactionState:
        self.store.settle()
        return self.transactions.state(transaction_id)

    def set_checker(self, checker: TransactionChecker) -> None:
        """Send check-backs that no connected producer of the group takes to ``checker``
        from now on (e.g. the Celery checker)."""
        self._checker = ProducersFirst(self.producers, checker)

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        self.producers.register(producer_group, on_check)

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        self.producers.unregister(producer_group, on_check)

    # -- consuming ------------------------------------------------------------------------
    def receive(
        self, group: str, topic: str, *, max_messages: int = 32,
        invisible_duration_s: float = 30.0, wait_s: float = 0.0, max_bytes: int | None = None,
        filter_expression: str = EVERY, filter_type: str = TAG,
    ) -> list[ReceivedMessage]:
        self.store.settle()
        self._check_open()
        validate_group(group)
        subscription = parse_filter(filter_expression, filter_type)
        self.topics.ensure(topic)
        invisible_ms = validate_receive(max_messages, invisible_duration_s, wait_s)
        received = self.consumers.receive(group, topic, max_messages, invisible_ms, wait_s, max_bytes, subscription)
        observer = self.observer
        if observer is not None and received:
            observer.received(group, topic, received)
        return received

    def ack(self, group: str, receipt_handle: str) -> None:
        self._check_open()
        self.consumers.ack(group, receipt_handle)

    def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        self._check_open()
        return list(self.consumers.ack_many(group, receipt_handles))

    def dead_letter(self, group: str, receipt_handle: str) -> None:
        self._check_open()
        validate_group(group)
        self.consumers.dead_letter(group, receipt_handle)

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float, *,
                                  keep_receipt: bool = False) -> str:
        self._check_open()
        return self.consumers.change_invisible_duration(
            group, receipt_handle, duration_ms("invisible_duration_s", invisible_duration_s), keep_receipt)

    # -- reading, admin -------------------------------------------------------------------
    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             max_bytes: int | None = None) -> list[StoredMessage]:
        self.store.settle()
        validate_user_topic(topic)
        records = self.store.read_queue(topic, queue_id, offset, max_messages, max_bytes)
        return [codec.stored_message_of(r) for r in records]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self.store.settle()
        validate_user_topic(topic)
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        self.store.settle()
        for offset in reversed(self.store.lookup_message_id(message_id)):
            record = self.store.get(offset)
            if record.topic in self.topics:
                return codec.stored_message_of(record)
        return None

    def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                     max_bytes: int | None = None) -> list[StoredMessage]:
        self.store.settle()
        offsets = self.store.lookup_key(topic, key)[-max_messages:]
        newest_first = (self.store.get(o) for o in reversed(offsets))
        return [codec.stored_message_of(r) for r in reversed(fitting(newest_first, lambda r: r.size, max_bytes))]

    def query_half_by_id(self, message_id: str) -> StoredMessage | None:
        """Find a half message (not visible before its transaction commits) by its id, as
        bound for its real topic; None when there is none."""
        self.store.settle()
        for offset in reversed(self.store.lookup_message_id(message_id)):
            record = self.store.get(offset)
            if record.topic == HALF_TOPIC:
                return codec.stored_message_of(msgspec.structs.replace(
                    record, topic=record.properties.get(codec.REAL_TOPIC, record.topic)))
        return None

    def oldest_transactions(self, state: TransactionState, limit: int) -> tuple[list[OpenTransaction], int]:
        """The ``limit`` oldest open transactions in ``state`` (PENDING or PARKED), and how
        many are in that state in all."""
        self.store.settle()
        with self.book.lock:
            shown, total = self.book.oldest(state, limit)
            return [_open_transaction(tx) for tx in shown], total

    def open_transaction(self, transaction_id: str) -> OpenTransaction | None:
        """A pending or parked transaction by id; None when it is not open."""
        self.store.settle()
        with self.book.lock:
            tx = self.book.get(transaction_id)
            return None if tx is None else _open_transaction(tx)

    def consumer_queues(self) -> list[ConsumerQueue]:
        """Every consumer group's lag and messages in flight, per stored queue."""
        self.store.settle()
        return self.consumers.queues()

    def list_parked(self) -> list[ParkedTransaction]:
        self.store.settle()
        return self.transactions.list_parked()

    def open_transactions(self, producer_group: str | None = None) -> list[str]:
        self.store.settle()
        if producer_group is not None:
            validate_group(producer_group)
        return self.book.open_ids(producer_group)

    def resolve_parked(
        self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0,
    ) -> EndTransactionResult:
        self.store.settle()
        if force is not None:
            return self._one(ForcedResolveCall(transaction_id, force))  # type: ignore[no-any-return]
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 < wait_s <= MAX_RESOLVE_WAIT_S:
            raise InvalidMessageError(f"wait_s {wait_s!r} is not in (0, {MAX_RESOLVE_WAIT_S:g}] seconds")
        resolution, producer_group = self.transactions.ask_checker(transaction_id, wait_s)
        # the checker's own answer is being recorded: this END joins it, or repeats it
        return self.end_transaction(transaction_id, resolution, producer_group=producer_group)

    def recheck_parked(self, transaction_id: str) -> None:
        self.store.settle()
        self.transactions.recheck(transaction_id)

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        self.store.settle()
        validate_group(group)
        return [
            codec.stored_message_of(StoredRecord(
                r.properties.get(codec.REAL_TOPIC, r.topic), r.queue_id, r.body, r.properties, r.flags,
                r.born_timestamp_ms, r.store_timestamp_ms, r.queue_offset, r.commit_log_offset, r.size,
            ))
            for r in self.consumers.list_dlq(group, max_messages, max_bytes)
        ]

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        self.store.settle()
        validate_group(group)
        stored = self.consumers.resend_dlq(group, message_id)
        return SendResult(message_id, stored.properties.get(codec.REAL_TOPIC, ""), 0, stored.queue_offset,
                          stored.commit_log_offset)

    def delete_group(self, group: str) -> DeletedGroup:
        self.store.settle()
        validate_group(group)
        return self.consumers.delete_group(group)

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> GroupReset:
        self.store.settle()
        validate_group(group)
        validate_user_topic(topic)
        if not self._queue_count(topic):
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return self.consumers.reset_group(group, topic, timestamp_ms)

    def stats(self) -> BrokerStats:
        self.store.settle()
        book = self.book
        return BrokerStats(
            topics=tuple(self.list_topics()),
            pending_half=len(book.by_id) - book.parked,
            parked=book.parked,
            outstanding_checks=self.checks.outstanding(),
            consumer_lag=self.consumers.lag(),
            dlq_depth=self.dlq_depth(),
            extra={
                "committed": book.committed,
                "rolled_back": book.rolled_back,
                "checks_sent": self.checks.checks_sent,
                "delayed": len(self.delays),
                "commit_log_bytes": self.store.commitlog.write_offset,
            },
            unanswered_check_groups=self.checks.unanswered.seconds(),
        )

    def dlq_depth(self) -> dict[str, int]:
        """Messages dead-lettered per consumer group (``ConsumerGroups.dlq_depth``)."""
        self.store.settle()
        return self.consumers.dlq_depth()

    # -- services -------------------------------------------------------------------------
    def _on_dispatch(self, records: list[StoredRecord]) -> None:
        """Apply records made durable together to the transactions and delays, then wake
        the receivers once if any of them is deliverable."""
        arrived = False
        for record in records:
            try:
                self.transactions.on_dispatch(record)
                self.delays.on_dispatch(record)
            except Exception:
                log.exception("applying the record at commit log offset %d failed", record.commit_log_offset)
            arrived = arrived or record.topic in self.topics or record.topic.startswith(RETRY_PREFIX)
        if arrived:
            self.consumers.notify()

    def _run_services(self) -> None:
        while not self._closed.wait(self.config.service_tick_s):
            try:
                self.run_timers()
            except BrokerClosedError:
                return
            except Exception:
                log.exception("broker service round failed")

    def run_timers(self) -> None:
        """One round of the timed services at the clock's time (``StoreConfig.clock``):
        delayed messages come due, a check round once per check interval (at most 1 s),
        snapshots once per ``snapshot_interval_s``, retention every 10 minutes. The service
        thread runs one per ``service_tick_s``; a simulation advancing its own clock calls
        it itself."""
        timers, now = self._timers, self._clock.monotonic()
        self.delays.deliver_due()
        if now - timers.last_check >= min(self.config.check_interval_s, 1.0):
            timers.last_check = now
            self.checks.run_once()
        if now - timers.last_snapshot >= self.config.snapshot_interval_s:
            timers.last_snapshot = now
            self.write_snapshots()
        if now - timers.last_retention >= 600:
            timers.last_retention = now
            self.apply_retention(self._clock.time_ms())

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete expired commit log segments, keeping every segment from the oldest open
        half message or waiting delayed message on; returns how many went.

        The guard is taken before a fresh snapshot: whatever a restart replays after that
        snapshot (and may have to redo) needs only half messages the guard kept."""
        guards = [self.book.oldest_offset(), self.delays.oldest_offset()]
        self.write_snapshots()
        guard = min((g for g in guards if g is not None), default=None)
        deleted = self.store.delete_expired_segments(now_ms, guard_offset=guard)
        if deleted:
            log.info("retention deleted %d commit log segments (guard offset %s)", deleted, guard)
        return deleted

    def close(self) -> None:
        """Stop the services and close the store (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.consumers.close()
        self._service.join(timeout=10)
        try:
            self.write_snapshots()
        except OSError:
            log.exception("could not save the snapshots; the next start replays more records")
        self.store.close()
        log.info("broker on %s closed", self.data_dir)

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(slots=True)
class _Timers:
    """When ``run_timers`` last ran each timed service (the clock's monotonic seconds)."""

    last_check: float
    last_snapshot: float
    last_retention: float


def _open_transaction(tx: Transaction) -> OpenTransaction:
    """A copy of an open transaction's fields (call under the book's lock)."""
    return OpenTransaction(tx.transaction_id, tx.producer_group, tx.state, tx.message_ids, tx.check_times,
                           tx.born_ms, tx.problem)

