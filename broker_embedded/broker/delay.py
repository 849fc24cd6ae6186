"""Delayed delivery: RocketMQ's 18 delay levels and exact delivery times.

A delayed message is stored in ``SCHEDULE_TOPIC_XXXX`` (queue = its delay level, 0 for
an exact time) with its real topic and due time in properties, and written to the real
topic when due. A transactional message's delay starts at its commit: the half message
is never delayed (RocketMQ 4.5.2 lost such messages, issue #1540).

Only the messages still waiting are in memory. A small snapshot keeps, per schedule queue,
the lowest queue offset not yet delivered, so a restart re-reads the waiting messages
only, each checked (by message id) for a delivery that a crash left unrecorded.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ..errors import InvalidTopicError
from ..message import DELAY_LEVELS_S, now_ms
from ..store.message_store import MessageStore
from ..store.record import PROPERTY_MESSAGE_ID, StoredRecord
from ..topics import MAX_QUEUES, SCHEDULE_TOPIC, validate_user_topic
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
                 delay_from_ms: int, born_ms: int = 0) -> StoredRecord:
    """The record for a message bound to ``topic``: there, or via the delay topic."""
    if DELAY_LEVEL not in props and DELIVER_AT not in props and DUE_AT not in props:
        return StoredRecord(topic, queue_id, body, props, born_timestamp_ms=born_ms)  # not delayed: as it is
    message_due = due_at_ms(props, delay_from_ms)
    if message_due is not None and message_due > now_ms():
        props = {**props, REAL_TOPIC: topic, REAL_QUEUE_ID: str(queue_id), DUE_AT: str(message_due)}
        return StoredRecord(SCHEDULE_TOPIC, delay_level_property(props), body, props,
                            born_timestamp_ms=born_ms)
    props = without(props, DELAY_LEVEL, DELIVER_AT, DUE_AT)
    return StoredRecord(topic, queue_id, body, props, born_timestamp_ms=born_ms)


class DelayService:
    """The delayed messages still waiting, soonest first, and their delivery (thread-safe)."""

    def __init__(self, store: MessageStore, snapshot_path: Path) -> None:
        self.store = store
        self._snapshot_path = snapshot_path
        self._heap: list[tuple[int, int]] = []  # (due ms, commit log offset)
        self._waiting: dict[int, tuple[int, int]] = {}  # commit log offset -> (queue id, queue offset)
        self._applied: dict[int, int] = {}  # queue id -> next queue offset seen
        self._lock = threading.Lock()

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
        """Write every due message to its real topic."""
        moment = now_ms() if now is None else now
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > moment:
                    return
                due_ms, offset = heapq.heappop(self._heap)
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

    def rebuild(self, read_all: Callable[[str, int, int], Iterator[StoredRecord]]) -> None:
        """Watch every stored delayed message not yet delivered (from the snapshot's marks on)."""
        marks = self._load_marks()
        for queue_id in range(self.store.queues().get(SCHEDULE_TOPIC, 0)):
            for record in read_all(SCHEDULE_TOPIC, queue_id, marks.get(queue_id, 0)):
                message_id = record.properties.get(PROPERTY_MESSAGE_ID, "")
                topic = record.properties.get(REAL_TOPIC, "")
                if self.store.stored_after(message_id, record.commit_log_offset, (topic,)):
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
