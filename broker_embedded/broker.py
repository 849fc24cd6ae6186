"""``EmbeddedBroker``: the whole broker in-process, on one data directory.

It implements :class:`broker_embedded.api.BrokerAPI` over a :class:`MessageStore`, with
the transaction book and check service (``transactions``), delayed delivery (``delay``)
and consumer groups (``consumption``). State is rebuilt on start from the system topics,
so a restarted broker knows every resolution, check count, parked transaction, delayed
message and consumer's progress. The TCP server serves this same object.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
import zlib
from pathlib import Path

import msgspec

from . import codec
from .api import BrokerStats, CheckCallback, ParkedTransaction, TopicInfo, TransactionChecker
from .checkers import ProducerCallbackChecker
from .config import BrokerConfig
from .consumption import ConsumerGroups, decode_events
from .delay import DUE_AT, DelaySchedule, due_at_ms, validate_delay
from .errors import (
    BrokerClosedError,
    BrokerError,
    InvalidMessageError,
    MessageTooLargeError,
    TransactionConflictError,
    UnknownTopicError,
    UnknownTransactionError,
)
from .message import (
    EndTransactionResult,
    Message,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
)
from .store.message_store import MessageStore
from .store.record import PROPERTY_MESSAGE_ID, StoredRecord
from .topics import (
    CHECK_MAX_TOPIC,
    CONSUMER_STATE_TOPIC,
    HALF_TOPIC,
    MAX_ID_LENGTH,
    OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    dlq_topic,
    retry_topic,
    validate_group,
    validate_identifiers,
    validate_user_topic,
)
from .transactions import (
    OP_COMMIT,
    OP_PARK,
    OP_RECHECK,
    RESOLUTION_OPS,
    CheckService,
    Op,
    Transaction,
    TransactionBook,
    decode_op,
    encode_op,
    now_ms,
)

log = logging.getLogger("broker_embedded.broker")

_TRANSACTION_PROPERTIES = (
    codec.REAL_TOPIC, codec.REAL_QUEUE_ID, codec.TRANSACTION_TIMEOUT, codec.PRODUCER_GROUP,
)


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: written, fsync'd, renamed, directory fsync'd."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class EmbeddedBroker:
    """A durable broker in ``data_dir``; thread-safe. See :class:`BrokerAPI` for the methods."""

    def __init__(
        self,
        data_dir: Path | str,
        config: BrokerConfig | None = None,
        checker: TransactionChecker | None = None,
    ) -> None:
        self.config = config or BrokerConfig()
        self.data_dir = Path(data_dir)
        self._closed = threading.Event()
        self.store = MessageStore(self.data_dir, self.config.store)
        self.producers = ProducerCallbackChecker()
        self._checker: TransactionChecker = checker or self.producers
        self._topics_path = self.data_dir / "topics.json"
        self._consumer_snapshot_path = self.data_dir / "consumer_state.snapshot"
        self._book_snapshot_path = self.data_dir / "transactions.snapshot"
        self._topics: dict[str, int] = self._load_topics()
        self._topics_lock = threading.Lock()
        self._round_robin = itertools.count()
        self.book = TransactionBook(self.config.transaction_timeout_s)
        self.checks = CheckService(
            self.book, lambda: self._checker, self._write_op,
            self.config.check_interval_s, self.config.check_max,
            self.config.max_outstanding_checks,
        )
        self.schedule = DelaySchedule()
        self.consumers = ConsumerGroups(
            self.store.read_queue, self.store.queue_max_offset, self._queue_count,
            lambda records: self.store.put_batch(records, wait_for_flush=self.config.sync_consumer_progress),
            self.config.max_delivery_attempts,
            self.config.retry_backoff_s, self.config.max_inflight_per_queue,
        )
        self._rebuild()
        self.store.add_dispatch_listener(self._on_dispatch)
        self._service = threading.Thread(target=self._run_services, name="broker-services", daemon=True)
        self._service.start()
        log.info(
            "broker open on %s: %d topics, %d pending transactions, %d delayed (recovered in %.2fs)",
            self.data_dir, len(self._topics), sum(1 for _ in self.book.unresolved()),
            len(self.schedule), self.store.recovery_seconds,
        )

    # -- start-up -------------------------------------------------------------------------
    def _load_topics(self) -> dict[str, int]:
        if self._topics_path.exists():
            return {str(k): int(v) for k, v in json.loads(self._topics_path.read_text()).items()}
        return {}

    def read_all(self, topic: str, queue_id: int = 0, start: int = 0) -> list[StoredRecord]:
        """Every record of a queue (system topics included) from ``start``, oldest first."""
        records: list[StoredRecord] = []
        offset = max(start, self.store.queue_min_offset(topic, queue_id))
        while True:
            batch = self.store.read_queue(topic, queue_id, offset, 1024)
            if not batch:
                return records
            records.extend(batch)
            offset = batch[-1].queue_offset + 1

    def _rebuild(self) -> None:
        half_from, op_from = self._restore_book_snapshot()
        for record in self.read_all(HALF_TOPIC, 0, half_from):
            self.book.add_half(record)
        for record in self.read_all(OP_HALF_TOPIC, 0, op_from):
            self.book.apply(decode_op(record.body))
        for tx in list(self.book.unresolved()):
            first = tx.halves[0]
            if self._copied_later(first, (first.properties[codec.REAL_TOPIC], SCHEDULE_TOPIC)):
                log.info("transaction %s was committed before a crash; recording it", tx.transaction_id)
                self._apply_op(Op(tx.transaction_id, OP_COMMIT, tx.check_times, now_ms()))
        events_from = self._restore_consumer_snapshot()
        self.consumers.replay(
            event
            for record in self.read_all(CONSUMER_STATE_TOPIC, 0, events_from)
            for event in decode_events(record.body)
        )
        for queue_id in range(self.store.queues().get(SCHEDULE_TOPIC, 0)):
            for record in self.read_all(SCHEDULE_TOPIC, queue_id):
                if not self._copied_later(record, (record.properties[codec.REAL_TOPIC],)):
                    self.schedule.add(int(record.properties[DUE_AT]), record.commit_log_offset)

    def _restore_book_snapshot(self) -> tuple[int, int]:
        """Load the transaction snapshot if there is one; the (half, op) offsets to replay from."""
        if not self._book_snapshot_path.exists():
            return 0, 0
        try:
            return self.book.restore(self._book_snapshot_path.read_bytes(), self.store.commitlog.min_offset)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            log.warning("unreadable %s: replaying every half and op record", self._book_snapshot_path)
            self.book.by_id.clear()
            return 0, 0

    def _restore_consumer_snapshot(self) -> int:
        """Load the consumer snapshot if there is one; the event offset to replay from."""
        if not self._consumer_snapshot_path.exists():
            return 0
        try:
            return self.consumers.restore(self._consumer_snapshot_path.read_bytes())
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("unreadable %s: replaying every consumer event", self._consumer_snapshot_path)
            self.consumers.progress.clear()
            self.consumers.stats.clear()
            return 0

    def write_snapshots(self) -> None:
        """Save the transaction book and every group's progress (each fsync'd and renamed
        into place), so the next start replays only the records stored after them."""
        book = self.book.snapshot(lambda: (self.store.queue_max_offset(HALF_TOPIC, 0),
                                           self.store.queue_max_offset(OP_HALF_TOPIC, 0)))
        _write_atomically(self._book_snapshot_path, book)
        consumers = self.consumers.snapshot(lambda: self.store.queue_max_offset(CONSUMER_STATE_TOPIC, 0))
        _write_atomically(self._consumer_snapshot_path, consumers)

    def _copied_later(self, record: StoredRecord, topics: tuple[str, ...]) -> bool:
        """True if the message of ``record`` was written again, after it, into one of
        ``topics``: a delayed message already delivered, or a committed half message whose
        op record a crash cut off."""
        return any(
            offset > record.commit_log_offset and self.store.get(offset).topic in topics
            for offset in self.store.lookup_message_id(record.properties[PROPERTY_MESSAGE_ID])
        )

    # -- topics ---------------------------------------------------------------------------
    def _save_topics(self) -> None:
        tmp = self._topics_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._topics, sort_keys=True))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self._topics_path)

    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        validate_user_topic(topic)
        if not 1 <= queues <= 256:
            raise ValueError("a topic has 1 to 256 queues")
        with self._topics_lock:
            if topic not in self._topics:
                self._topics[topic] = queues
                self._save_topics()
                log.info("created topic %s with %d queues", topic, queues)
        return self._topic_info(topic)

    def _topic_info(self, topic: str) -> TopicInfo:
        queues = self._topics[topic]
        return TopicInfo(topic, queues, tuple(self.store.queue_max_offset(topic, q) for q in range(queues)))

    def list_topics(self) -> list[TopicInfo]:
        with self._topics_lock:  # create_topic may add one meanwhile
            names = sorted(self._topics)
        return [self._topic_info(topic) for topic in names]

    def _queue_count(self, topic: str) -> int:
        return self._topics.get(topic) or self.store.queues().get(topic, 0)

    def _ensure_topic(self, topic: str) -> int:
        validate_user_topic(topic)
        queues = self._topics.get(topic)
        if queues is None:
            if not self.config.auto_create_topics:
                raise UnknownTopicError(f"topic {topic!r} does not exist")
            queues = self.create_topic(topic, self.config.default_queues).queues
        return queues

    def _select_queue(self, message: Message, queues: int) -> int:
        if message.message_group:
            return zlib.crc32(message.message_group.encode()) % queues
        return next(self._round_robin) % queues

    def _validate(self, message: Message) -> int:
        self._check_open()
        if not isinstance(message.body, bytes | bytearray | memoryview):
            raise TypeError("message body must be bytes")
        if len(message.body) > self.config.max_body_size:
            raise MessageTooLargeError(
                f"body of {len(message.body)} bytes exceeds the limit of {self.config.max_body_size}"
            )
        validate_delay(message)
        validate_identifiers(message)
        return self._select_queue(message, self._ensure_topic(message.topic))

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise BrokerClosedError("the broker is closed")

    # -- producing ------------------------------------------------------------------------
    def send(self, message: Message) -> SendResult:
        queue_id = self._validate(message)
        stored = self.store.put(self._real_record(message.topic, queue_id, codec.message_properties(message),
                                                  bytes(message.body), now_ms()))
        return self._send_result(message, stored)

    def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages with one append and one fsync; per message a result or the
        typed error that refused it (the others are still sent). The server uses it to
        group concurrent sends."""
        outcomes: list[SendResult | BrokerError | None] = []
        records: list[StoredRecord] = []
        accepted: list[tuple[int, Message]] = []
        now = now_ms()
        for message in messages:
            try:
                queue_id = self._validate(message)
            except BrokerError as exc:
                outcomes.append(exc)
                continue
            accepted.append((len(outcomes), message))
            outcomes.append(None)  # filled in once stored
            records.append(self._real_record(message.topic, queue_id, codec.message_properties(message),
                                             bytes(message.body), now))
        for (index, message), stored in zip(accepted, self.store.put_batch(records), strict=True):
            outcomes[index] = self._send_result(message, stored)
        return [outcome for outcome in outcomes if outcome is not None]

    def _real_record(self, topic: str, queue_id: int, props: dict[str, str], body: bytes,
                     delay_from_ms: int, born_ms: int = 0) -> StoredRecord:
        """The record for a message bound to ``topic``: there, or via the delay topic."""
        message_due = due_at_ms(props, delay_from_ms)
        if message_due is not None and message_due > now_ms():
            props = {**props, codec.REAL_TOPIC: topic, codec.REAL_QUEUE_ID: str(queue_id),
                     DUE_AT: str(message_due)}
            return StoredRecord(SCHEDULE_TOPIC, int(props.get(codec.DELAY_LEVEL, "0")), body, props,
                                born_timestamp_ms=born_ms)
        props = codec.without(props, codec.DELAY_LEVEL, codec.DELIVER_AT, DUE_AT)
        return StoredRecord(topic, queue_id, body, props, born_timestamp_ms=born_ms)

    def _send_result(self, message: Message, stored: StoredRecord, transaction_id: str | None = None) -> SendResult:
        if stored.topic == SCHEDULE_TOPIC:
            self.schedule.add(int(stored.properties[DUE_AT]), stored.commit_log_offset)
        return SendResult(
            message_id=message.message_id,
            topic=message.topic,
            queue_id=int(stored.properties.get(codec.REAL_QUEUE_ID, stored.queue_id)),
            queue_offset=stored.queue_offset if stored.topic == message.topic else -1,
            commit_log_offset=stored.commit_log_offset,
            transaction_id=transaction_id,
        )

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        queue_id = self._validate(message)
        validate_group(producer_group)
        if not transaction_id or len(transaction_id) > MAX_ID_LENGTH or not transaction_id.isprintable():
            raise InvalidMessageError(f"a transaction id has 1 to {MAX_ID_LENGTH} printable characters")
        props = codec.message_properties(message)
        props.update({
            codec.REAL_TOPIC: message.topic, codec.REAL_QUEUE_ID: str(queue_id),
            codec.TRANSACTION_ID: transaction_id, codec.PRODUCER_GROUP: producer_group,
        })
        record = StoredRecord(HALF_TOPIC, 0, bytes(message.body), props)
        with self.book.lock:
            tx = self.book.by_id.get(transaction_id)
        if tx is None:
            with self.book.writing():
                stored = self.store.put(record)
                with self.book.lock:
                    self.book.add_half(stored)
        else:
            with tx.lock, self.book.writing():  # joins the transaction only while it is pending
                if tx.state is not TransactionState.PENDING or tx.producer_group != producer_group:
                    raise TransactionConflictError(
                        f"transaction {transaction_id} already ended ({tx.state.value}) "
                        f"or belongs to producer group {tx.producer_group!r}"
                    )
                stored = self.store.put(record)
                with self.book.lock:
                    self.book.add_half(stored)
        return SendResult(message.message_id, message.topic, queue_id, -1,
                          stored.commit_log_offset, transaction_id)

    def end_transaction(
        self, transaction_id: str, resolution: Resolution, *, producer_group: str,
        from_check: bool = False,
    ) -> EndTransactionResult:
        self._check_open()
        with self.book.lock:
            tx = self.book.by_id.get(transaction_id)
        if tx is None or tx.producer_group != producer_group:
            raise UnknownTransactionError(
                f"no transaction {transaction_id!r} for producer group {producer_group!r}"
            )
        if from_check:
            self.checks.answered(tx)
            log.info("transaction %s: check-back answer %s", transaction_id, resolution.value)
        source = "check-back answer" if from_check else "producer"
        if resolution is Resolution.UNKNOWN:
            log.info("transaction %s: %s UNKNOWN; it stays pending", transaction_id, source)
            return EndTransactionResult(transaction_id, tx.state, False, tx.message_ids)
        wanted = TransactionState.COMMITTED if resolution is Resolution.COMMIT else TransactionState.ROLLED_BACK
        with tx.lock:  # this transaction only: other transactions resolve meanwhile
            if tx.state is wanted:
                return EndTransactionResult(transaction_id, tx.state, False, tx.message_ids)
            if tx.state in (TransactionState.COMMITTED, TransactionState.ROLLED_BACK):
                raise TransactionConflictError(
                    f"transaction {transaction_id} is already {tx.state.value}; {resolution.value} refused"
                )
            op = Op(transaction_id, RESOLUTION_OPS[resolution], tx.check_times, now_ms())
            records = self._commit_records(tx) if resolution is Resolution.COMMIT else []
            with self.book.writing():
                stored = self.store.put_batch([*records, self._op_record(op)])
                with self.book.lock:
                    self.book.apply(op)
        for record in stored[:-1]:
            if record.topic == SCHEDULE_TOPIC:
                self.schedule.add(int(record.properties[DUE_AT]), record.commit_log_offset)
        log.info("transaction %s %s by %s", transaction_id, tx.state.value, source)
        return EndTransactionResult(transaction_id, tx.state, True, tx.message_ids)

    def _commit_records(self, tx: Transaction) -> list[StoredRecord]:
        committed_at = now_ms()
        return [
            self._real_record(
                half.properties[codec.REAL_TOPIC], int(half.properties[codec.REAL_QUEUE_ID]),
                codec.without(half.properties, *_TRANSACTION_PROPERTIES), half.body,
                committed_at, half.born_timestamp_ms,
            )
            for half in tx.halves
        ]

    def _op_record(self, op: Op) -> StoredRecord:
        return StoredRecord(OP_HALF_TOPIC, 0, encode_op(op), {"TAGS": "d"})

    def _write_op(self, op: Op) -> None:
        """Store an op record; parking also copies the half messages to ``CHECK_MAX_TOPIC``
        (one batch, so the copies and the op are durable together)."""
        records = self._parked_records(op) if op.op == OP_PARK else []
        self.store.put_batch([*records, self._op_record(op)])

    def _parked_records(self, op: Op) -> list[StoredRecord]:
        tx = self.book.by_id[op.tx]
        return [
            StoredRecord(CHECK_MAX_TOPIC, 0, half.body,
                         {**half.properties, codec.CHECK_TIMES: str(op.n)},
                         born_timestamp_ms=half.born_timestamp_ms)
            for half in tx.halves
        ]

    def _apply_op(self, op: Op) -> None:
        with self.book.writing():
            self._write_op(op)
            with self.book.lock:
                self.book.apply(op)

    def transaction_state(self, transaction_id: str) -> TransactionState:
        tx = self.book.by_id.get(transaction_id)
        if tx is None:
            raise UnknownTransactionError(f"no transaction {transaction_id!r}")
        return tx.state

    def set_checker(self, checker: TransactionChecker) -> None:
        """Send check-backs to ``checker`` from now on (e.g. the Celery checker)."""
        self._checker = checker

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        self.producers.register(producer_group, on_check)

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        self.producers.unregister(producer_group, on_check)

    # -- consuming ------------------------------------------------------------------------
    def receive(
        self, group: str, topic: str, *, max_messages: int = 32,
        invisible_duration_s: float = 30.0, wait_s: float = 0.0,
    ) -> list[ReceivedMessage]:
        self._check_open()
        validate_group(group)
        self._ensure_topic(topic)
        if max_messages < 1 or invisible_duration_s <= 0:
            raise ValueError("max_messages must be >= 1 and invisible_duration_s > 0")
        return self.consumers.receive(
            group, topic, max_messages, int(invisible_duration_s * 1000), wait_s, self._dead_letter,
        )

    def _dead_letter(self, group: str, record: StoredRecord, attempts: int) -> StoredRecord:
        props = {**record.properties, codec.DELIVERY_ATTEMPTS: str(attempts)}
        props.setdefault(codec.REAL_TOPIC, record.topic)
        stored = self.store.put(StoredRecord(dlq_topic(group), 0, record.body, props))
        log.warning("message %s dead-lettered for group %s after %d deliveries",
                    props.get(PROPERTY_MESSAGE_ID), group, attempts)
        return stored

    def ack(self, group: str, receipt_handle: str) -> None:
        self._check_open()
        self.consumers.ack(group, receipt_handle)

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float) -> str:
        self._check_open()
        if invisible_duration_s <= 0:
            raise ValueError("invisible_duration_s must be > 0")
        return self.consumers.change_invisible_duration(group, receipt_handle, int(invisible_duration_s * 1000))

    # -- reading, admin -------------------------------------------------------------------
    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32) -> list[StoredMessage]:
        validate_user_topic(topic)
        return [codec.stored_message_of(r) for r in self.store.read_queue(topic, queue_id, offset, max_messages)]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        validate_user_topic(topic)
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        for offset in reversed(self.store.lookup_message_id(message_id)):
            record = self.store.get(offset)
            if record.topic in self._topics:
                return codec.stored_message_of(record)
        return None

    def query_by_key(self, topic: str, key: str, max_messages: int = 64) -> list[StoredMessage]:
        offsets = self.store.lookup_key(topic, key)[-max_messages:]
        return [codec.stored_message_of(self.store.get(o)) for o in offsets]

    def list_parked(self) -> list[ParkedTransaction]:
        with self.book.lock:
            return [
                ParkedTransaction(tx.transaction_id, tx.producer_group, tx.message_ids, tx.check_times, tx.born_ms)
                for tx in self.book.by_id.values()
                if tx.state is TransactionState.PARKED
            ]

    def _parked(self, transaction_id: str) -> Transaction:
        tx = self.book.by_id.get(transaction_id)
        if tx is None or tx.state is not TransactionState.PARKED:
            raise UnknownTransactionError(f"no parked transaction {transaction_id!r}")
        return tx

    def resolve_parked(self, transaction_id: str, resolution: Resolution) -> EndTransactionResult:
        tx = self._parked(transaction_id)
        return self.end_transaction(transaction_id, resolution, producer_group=tx.producer_group)

    def recheck_parked(self, transaction_id: str) -> None:
        with self.book.lock:
            self._parked(transaction_id)
            self._apply_op(Op(transaction_id, OP_RECHECK, 0, now_ms()))
        log.info("transaction %s taken out of %s for re-checking", transaction_id, CHECK_MAX_TOPIC)

    def list_dlq(self, group: str, max_messages: int = 64) -> list[StoredMessage]:
        validate_group(group)
        records = self.read_all(dlq_topic(group))[-max_messages:]
        return [
            codec.stored_message_of(StoredRecord(
                r.properties.get(codec.REAL_TOPIC, r.topic), r.queue_id, r.body, r.properties, r.flags,
                r.born_timestamp_ms, r.store_timestamp_ms, r.queue_offset, r.commit_log_offset, r.size,
            ))
            for r in records
        ]

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        validate_group(group)
        for record in reversed(self.read_all(dlq_topic(group))):
            if record.properties.get(PROPERTY_MESSAGE_ID) == message_id:
                props = codec.without(record.properties, codec.DELIVERY_ATTEMPTS)
                stored = self.store.put(StoredRecord(retry_topic(group), 0, record.body, props))
                log.info("message %s re-sent from the DLQ to group %s", message_id, group)
                return SendResult(message_id, props[codec.REAL_TOPIC], 0, stored.queue_offset,
                                  stored.commit_log_offset)
        raise UnknownTopicError(f"message {message_id!r} is not in the DLQ of group {group!r}")

    def stats(self) -> BrokerStats:
        with self.book.lock:
            states = [tx.state for tx in self.book.by_id.values()]
        queues = self.store.queues()
        return BrokerStats(
            topics=tuple(self.list_topics()),
            pending_half=states.count(TransactionState.PENDING),
            parked=states.count(TransactionState.PARKED),
            outstanding_checks=self.checks.outstanding(),
            consumer_lag=self.consumers.lag(),
            dlq_depth={
                topic[len("%DLQ%"):]: self.store.queue_max_offset(topic, 0)
                for topic in queues if topic.startswith("%DLQ%")
            },
            extra={
                "committed": states.count(TransactionState.COMMITTED),
                "rolled_back": states.count(TransactionState.ROLLED_BACK),
                "checks_sent": self.checks.checks_sent,
                "delayed": len(self.schedule),
                "commit_log_bytes": self.store.commitlog.write_offset,
            },
        )

    # -- services -------------------------------------------------------------------------
    def _on_dispatch(self, record: StoredRecord) -> None:
        if record.topic in self._topics or record.topic.startswith("%RETRY%"):
            self.consumers.notify()

    def _deliver_due(self) -> None:
        for due_ms, offset in self.schedule.pop_due():
            record = self.store.get(offset)
            props = codec.without(record.properties, codec.REAL_TOPIC, codec.REAL_QUEUE_ID, DUE_AT,
                                  codec.DELAY_LEVEL, codec.DELIVER_AT)
            try:
                self.store.put(StoredRecord(record.properties[codec.REAL_TOPIC],
                                            int(record.properties[codec.REAL_QUEUE_ID]), record.body, props,
                                            born_timestamp_ms=record.born_timestamp_ms))
            except Exception:
                self.schedule.add(due_ms, offset)  # try again next tick
                raise

    def _run_services(self) -> None:
        last_check = 0.0
        last_retention = last_snapshot = time.monotonic()
        tick = self.config.service_tick_s
        check_every = min(self.config.check_interval_s, 1.0)
        while not self._closed.wait(tick):
            try:
                self._deliver_due()
                if time.monotonic() - last_check >= check_every:
                    last_check = time.monotonic()
                    self.checks.run_once()
                if time.monotonic() - last_snapshot >= self.config.snapshot_interval_s:
                    last_snapshot = time.monotonic()
                    self.write_snapshots()
                if time.monotonic() - last_retention >= 600:
                    last_retention = time.monotonic()
                    self.apply_retention()
            except BrokerClosedError:
                return
            except Exception:
                log.exception("broker service round failed")

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete expired commit log segments, keeping every segment from the oldest
        unresolved half message or waiting delayed message on; returns how many went."""
        with self.book.lock:
            guards = [self.book.oldest_unresolved_offset(), self.schedule.oldest_offset()]
        guard = min((g for g in guards if g is not None), default=None)
        deleted = self.store.delete_expired_segments(guard_offset=guard, now=now_ms)
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
