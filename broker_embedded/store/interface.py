"""What the broker core needs from the message store (implemented by ``MessageStore``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from .record import StoredRecord

#: Called once per record, in commit log order, after the record is durable and
#: dispatched to its consume queue (also for records replayed during recovery).
DispatchListener = Callable[[StoredRecord], None]


class Store(Protocol):
    """A durable commit log with per-(topic, queue) consume queues and an index."""

    def put(self, record: StoredRecord) -> StoredRecord:
        """Append one record; returns once durable per flush mode. Thread-safe.

        Concurrent callers in sync mode share one fsync (group commit).
        Raises ``StoreFullError`` (nothing partial is left) or ``BrokerClosedError``.
        """
        ...

    def get(self, commit_log_offset: int) -> StoredRecord:
        """Read one record by its commit log offset."""
        ...

    def read_queue(self, topic: str, queue_id: int, offset: int, max_records: int) -> list[StoredRecord]:
        """Records of a consume queue from ``offset`` (empty past the end)."""
        ...

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be assigned (0 for an empty or unknown queue)."""
        ...

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still readable (after retention)."""
        ...

    def queues(self) -> dict[str, int]:
        """Every topic that has records, with its number of queues (max queue id + 1)."""
        ...

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset with store time >= ``timestamp_ms``."""
        ...

    def lookup_message_id(self, message_id: str) -> list[int]:
        """Commit log offsets of records whose ``UNIQ_KEY`` property is ``message_id``."""
        ...

    def lookup_key(self, topic: str, key: str) -> list[int]:
        """Commit log offsets of records of ``topic`` with ``key`` among ``KEYS``."""
        ...

    def scan(self, from_commit_log_offset: int = 0) -> Iterator[StoredRecord]:
        """Every record from an offset in commit log order (recovery, export)."""
        ...

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Be told of every record once it is durable (used by the broker core)."""
        ...

    def flush(self) -> None:
        """fsync everything written so far."""
        ...

    def close(self) -> None:
        """Flush, write checkpoints, release the data directory lock."""
        ...
