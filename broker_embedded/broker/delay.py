"""Delayed delivery: RocketMQ's 18 delay levels and exact delivery times.

A delayed message is stored in ``SCHEDULE_TOPIC_XXXX`` (queue = its delay level, 0 for
an exact time) with its real topic and due time in properties, and written to the real
topic when due. A transactional message's delay starts at its commit: the half message
is never delayed (RocketMQ 4.5.2 lost such messages, issue #1540).

Only the messages still waiting are in memory. A small snapshot keeps, per schedule queue,
the lowest queue offset not yet delivered, so a restart re-reads the waiting messages
only, each checked (by message id) for a delivery that a crash left unrecorded.

Recall (RocketMQ 5.3's RecallMessage): a send of a delayed message returns a recall handle,
its topic, schedule record and message id signed with the broker's key (``recall.key`` in the
data directory), so it takes back that message of that topic and no other. A recall writes a
durable record (``RMQ_SYS_RECALL``, under the message's id) and stops watching the message:
it is never delivered, and a restart that re-reads it finds the recall by its message id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import msgspec

from ..clock import WALL, Clock
from ..errors import InvalidMessageError, InvalidTopicError
from ..message import DELAY_LEVELS_S, SendResult
from ..store.files import write_atomically
from ..store.filesystem import FileSystem
from ..store.message_store import MessageStore
from ..store.record import PROPERTY_MESSAGE_ID, StoredRecord
from ..topics import MAX_QUEUES, RECALL_TOPIC, SCHEDULE_TOPIC, validate_user_topic
from .codec import (
    DELAY_LEVEL,
    DELIVER_AT,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    PropertyError,
    delay_level_property,
    deliver_at_property,
    int_property,
    without,
)

log = logging.getLogger(__name__)

DUE_AT = "DUE_AT"
#: A recall record's property: the commit log offset of the schedule record it takes back.
RECALLED_OFFSET = "RECALLED_OFFSET"
HANDLE_VERSION = "v1"
#: Recalled entries the due-time heap may hold beyond twice the waiting ones before it is
#: compacted (a recalled message's entry otherwise stays until its due time).
HEAP_SLACK = 64
INVALID_HANDLE = "recall handle is invalid"


def due_at_ms(properties: Mapping[str, str], from_ms: int) -> int | None:
    """When a message (its record properties) is due, counted from ``from_ms``; None if
    it is not delayed. ``PropertyError`` for a delay that is not one."""
    deliver_at = deliver_at_property(properties)
    if deliver_at is not None:
        return deliver_at
    level = delay_level_property(properties)
    if level:
        return from_ms + DELAY_LEVELS_S[level - 1] * 1000
    return None


def target_of(record: StoredRecord) -> tuple[str, int]:
    """The real topic and queue a stored record is bound for (its ``REAL_TOPIC`` and
    ``REAL_QID``); ``PropertyError`` when they are absent or name no user queue."""
    topic = record.properties.get(REAL_TOPIC, "")
    try:
        validate_user_topic(topic)
    except InvalidTopicError as exc:
        raise PropertyError(f"{REAL_TOPIC}={topic!r}: {exc}") from None
    queue_id = int_property(record.properties, REAL_QUEUE_ID, 0, MAX_QUEUES - 1)
    if queue_id is None:
        raise PropertyError(f"no {REAL_QUEUE_ID}")
    return topic, queue_id


def route_record(topic: str, queue_id: int, props: dict[str, str], body: bytes,
                 delay_from_ms: int, born_ms: int = 0, clock: Clock = WALL) -> StoredRecord:
    """The record for a message bound to ``topic``: there, or via the delay topic while it
    is not due by ``clock``."""
    if DELAY_LEVEL not in props and DELIVER_AT not in props and DUE_AT not in props:
        return StoredRecord(topic, queue_id, body, props, born_timestamp_ms=born_ms)  # not delayed: as it is
    message_due = due_at_ms(props, delay_from_ms)
    if message_due is not None and message_due > clock.time_ms():
        props = {**props, REAL_TOPIC: topic, REAL_QUEUE_ID: str(queue_id), DUE_AT: str(message_due)}
        return StoredRecord(SCHEDULE_TOPIC, delay_level_property(props), body, props,
                            born_timestamp_ms=born_ms)
    props = without(props, DELAY_LEVEL, DELIVER_AT, DUE_AT)
    return StoredRecord(topic, queue_id, body, props, born_timestamp_ms=born_ms)


class DelayService:
    """The delayed messages still waiting, soonest first, and their delivery (thread-safe)."""

    def __init__(self, store: MessageStore, snapshot_path: Path, key_path: Path) -> None:
        self.store = store
        self._snapshot_path = snapshot_path
        self._key = _load_key(store.fs, key_path)
        self._heap: list[tuple[int, int]] = []  # (due ms, commit log offset); recalled ones skipped
        self._waiting: dict[int, tuple[int, int]] = {}  # commit log offset -> (queue id, queue offset)
        self._applied: dict[int, int] = {}  # queue id -> next queue offset seen
        self._lock = threading.Lock()
        #: Held over one delivery or one recall: a message is delivered or recalled, never both.
        self._moving = threading.Lock()

    def on_dispatch(self, record: StoredRecord) -> None:
        """Take a durable schedule record under watch (a store dispatch listener)."""
        if record.topic == SCHEDULE_TOPIC:
            self._add(record)

    def _add(self, record: StoredRecord) -> None:
        """Watch a delayed message; one with no usable destination is left where it is (logged)."""
        with self._lock:
            self._applied[record.queue_id] = max(self._applied.get(record.queue_id, 0), record.queue_offset + 1)
            if record.commit_log_offset in self._waiting or _unusable(record):
                return
            self._waiting[record.commit_log_offset] = (record.queue_id, record.queue_offset)
            heapq.heappush(self._heap, (_due(record), record.commit_log_offset))

    def deliver_due(self, now: int | None = None) -> None:
        """Write every due message to its real topic (due by the store's clock unless ``now``
        is given)."""
        moment = self.store.config.clock.time_ms() if now is None else now
        while True:
            with self._moving:
                with self._lock:
                    if not self._heap or self._heap[0][0] > moment:
                        return
                    due_ms, offset = heapq.heappop(self._heap)
                    if offset not in self._waiting:
                        continue  # recalled
                try:
                    record = self.store.get(offset)
                    props = without(record.properties, REAL_TOPIC, REAL_QUEUE_ID, DUE_AT, DELAY_LEVEL, DELIVER_AT)
                    self.store.put(StoredRecord(*target_of(record), record.body, props,
                                                born_timestamp_ms=record.born_timestamp_ms))
                except Exception:
                    with self._lock:
                        heapq.heappush(self._heap, (due_ms, offset))  # try again next tick
                    raise
                with self._lock:
                    self._waiting.pop(offset, None)

    # -- recall ---------------------------------------------------------------------------
    def with_recall_handle(self, result: SendResult) -> SendResult:
        """``result`` with the recall handle of its message if it waits in the schedule
        topic (a ``queue_offset`` of -1), as it is."""
        if result.queue_offset != -1:
            return result
        fields = (HANDLE_VERSION, result.topic, str(result.commit_log_offset),
                  self._sign(result.topic, result.commit_log_offset, result.message_id), result.message_id)
        handle = base64.urlsafe_b64encode(" ".join(fields).encode()).decode()
        return msgspec.structs.replace(result, recall_handle=handle)

    def _sign(self, topic: str, offset: int, message_id: str) -> str:
        signed = "\n".join((topic, str(offset), message_id)).encode()
        return hmac.new(self._key, signed, hashlib.sha256).hexdigest()[:32]

    def _verify(self, topic: str, handle: str) -> tuple[int, str]:
        """The schedule record offset and message id of a handle this broker issued for a
        message of ``topic``; ``InvalidMessageError`` for any other handle."""
        try:
            version, handle_topic, offset, signature, message_id = (
                base64.urlsafe_b64decode(handle.encode()).decode().split(" ", 4))
            valid = (version == HANDLE_VERSION and handle_topic == topic and hmac.compare_digest(
                signature.encode(), self._sign(topic, int(offset), message_id).encode()))
        except (ValueError, binascii.Error, UnicodeError):
            valid = False
        if not valid:
            raise InvalidMessageError(f"{INVALID_HANDLE} for topic {topic!r}")
        return int(offset), message_id

    def recall(self, topic: str, handle: str) -> str:
        """Take back the delayed message of ``handle`` (from ``with_recall_handle``) before it
        is due: it is never delivered. Returns its message id; again for a message recalled
        already. ``InvalidMessageError`` when the handle is not one this broker issued for
        ``topic``, or the message was delivered already."""
        offset, message_id = self._verify(topic, handle)
        with self._moving:
            with self._lock:
                waiting = offset in self._waiting
            if not waiting:
                if self.store.stored_after(message_id, offset, (RECALL_TOPIC,)):
                    return message_id
                raise InvalidMessageError(f"message {message_id!r} was delivered already: too late to recall it")
            self.store.put(StoredRecord(RECALL_TOPIC, 0, b"",
                                        {PROPERTY_MESSAGE_ID: message_id, RECALLED_OFFSET: str(offset)}))
            with self._lock:
                self._waiting.pop(offset, None)
                if len(self._heap) > 2 * len(self._waiting) + HEAP_SLACK:
                    self._heap = [entry for entry in self._heap if entry[1] in self._waiting]
                    heapq.heapify(self._heap)
        log.info("delayed message %s of topic %s recalled", message_id, topic)
        return message_id

    def rebuild(self, read_all: Callable[[str, int, int], Iterator[StoredRecord]]) -> None:
        """Watch every stored delayed message not yet delivered or recalled (from the
        snapshot's marks on)."""
        marks = self._load_marks()
        for queue_id in range(self.store.queues().get(SCHEDULE_TOPIC, 0)):
            for record in read_all(SCHEDULE_TOPIC, queue_id, marks.get(queue_id, 0)):
                message_id = record.properties.get(PROPERTY_MESSAGE_ID, "")
                topic = record.properties.get(REAL_TOPIC, "")
                if self.store.stored_after(message_id, record.commit_log_offset, (topic, RECALL_TOPIC)):
                    with self._lock:
                        self._applied[queue_id] = max(self._applied.get(queue_id, 0), record.queue_offset + 1)
                else:
                    self._add(record)

    def _marks(self) -> dict[int, int]:
        """Per schedule queue, the lowest queue offset that may still be waiting."""
        with self._lock:
            marks = dict(self._applied)
            for queue_id, queue_offset in self._waiting.values():
                marks[queue_id] = min(marks[queue_id], queue_offset)
        return marks

    def write_snapshot(self, write: Callable[[Path, bytes], None]) -> None:
        write(self._snapshot_path, json.dumps(self._marks()).encode())

    def _load_marks(self) -> dict[int, int]:
        try:
            return {int(q): int(o) for q, o in json.loads(self.store.fs.read_bytes(self._snapshot_path)).items()}
        except FileNotFoundError:
            return {}
        except (ValueError, AttributeError):
            log.warning("unreadable %s: re-reading every delayed message", self._snapshot_path)
            return {}

    def oldest_offset(self) -> int | None:
        """The lowest commit log offset still waiting (retention must keep it)."""
        with self._lock:
            return min(self._waiting, default=None)

    def __len__(self) -> int:
        return len(self._waiting)


def _load_key(fs: FileSystem, path: Path) -> bytes:
    """The broker's key for recall handles, made on first use (handles outlive restarts)."""
    key = fs.read_bytes(path) if fs.exists(path) else b""
    if len(key) < 32:
        key = secrets.token_bytes(32)
        write_atomically(path, key, fs)
    return key


def _unusable(record: StoredRecord) -> bool:
    """Whether a delayed message has no destination to deliver to (logged; it stays in
    the schedule topic, where an operator can read it)."""
    try:
        target_of(record)
    except PropertyError as exc:
        log.error("delayed message at commit log offset %d cannot be delivered (%s); left in %s",
                  record.commit_log_offset, exc, SCHEDULE_TOPIC)
        return True
    return False


def _due(record: StoredRecord) -> int:
    try:
        return int(record.properties[DUE_AT])
    except (KeyError, ValueError):
        log.warning("delayed message at %d has no readable due time; delivering it now", record.commit_log_offset)
        return 0
