"""Delayed delivery: RocketMQ's 18 delay levels and exact delivery times.

A delayed message is stored in ``SCHEDULE_TOPIC_XXXX`` (queue = its delay level, 0 for
an exact time) with its real topic and due time in properties, and written to the real
topic when due. A transactional message's delay starts at its commit: the half message
is never delayed (RocketMQ 4.5.2 lost such messages, issue #1540). On start the broker
re-schedules every stored delayed message not yet written to its real topic.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Mapping

from .codec import DELAY_LEVEL, DELIVER_AT
from .errors import InvalidMessageError
from .message import DELAY_LEVELS_S, Message

DUE_AT = "DUE_AT"


def due_at_ms(properties: Mapping[str, str], from_ms: int) -> int | None:
    """When a message (its record properties) is due, counted from ``from_ms``; None if
    it is not delayed."""
    if DELIVER_AT in properties:
        return int(properties[DELIVER_AT])
    level = int(properties.get(DELAY_LEVEL, "0"))
    if level:
        return from_ms + DELAY_LEVELS_S[level - 1] * 1000
    return None


def validate_delay(message: Message) -> None:
    """``InvalidMessageError`` for a delay level outside 1..18 or both delay kinds at once."""
    if not 0 <= message.delay_level <= len(DELAY_LEVELS_S):
        raise InvalidMessageError(
            f"delay level {message.delay_level} is not in 1..{len(DELAY_LEVELS_S)}"
        )
    if message.delay_level and message.deliver_at_ms is not None:
        raise InvalidMessageError("give either delay_level or deliver_at_ms, not both")


class DelaySchedule:
    """Due times of stored delayed messages, soonest first (thread-safe)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def add(self, due_ms: int, commit_log_offset: int) -> None:
        with self._lock:
            heapq.heappush(self._heap, (due_ms, commit_log_offset))

    def pop_due(self, now_ms: int | None = None) -> list[tuple[int, int]]:
        """(due time, commit log offset) of the delayed messages due by now, in due order."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        due: list[tuple[int, int]] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap))
        return due

    def oldest_offset(self) -> int | None:
        """The lowest commit log offset still waiting (retention must keep it)."""
        with self._lock:
            return min((offset for _, offset in self._heap), default=None)

    def __len__(self) -> int:
        return len(self._heap)
