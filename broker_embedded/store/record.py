"""The unit the store keeps: one record of the commit log.

The store knows topics, queues, offsets, flags, timestamps, properties and a body, and
nothing of transactions, delays or consumers: the broker core encodes those as
properties (RocketMQ's way) and as system topics.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class StoredRecord(msgspec.Struct):
    """A commit log record.

    On ``MessageStore.put`` the caller fills ``topic``, ``queue_id``, ``flags``,
    ``born_timestamp_ms``, ``properties`` and ``body``; the store assigns
    ``queue_offset``, ``commit_log_offset``, ``store_timestamp_ms`` and ``size`` and
    returns the completed record: the same object (one object per message on the write
    path), or a copy when the record given was already stored (``is_stored``). Treat a
    record as read-only once stored; ``msgspec.structs.replace`` makes a changed copy. (A
    ``msgspec.Struct``: built and copied in C, in half a slotted dataclass's time.)
    """

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = {}
    flags: int = 0
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    queue_offset: int = -1
    commit_log_offset: int = -1
    size: int = 0

    @property
    def is_stored(self) -> bool:
        """Whether the store has assigned this record its place."""
        return self.commit_log_offset >= 0

    def without_body(self) -> StoredRecord:
        """A copy with an empty body (what a reader keeps of a record it reads again later)."""
        return StoredRecord(self.topic, self.queue_id, b"", self.properties, self.flags, self.born_timestamp_ms,
                            self.store_timestamp_ms, self.queue_offset, self.commit_log_offset, self.size)


#: Property names the store itself reads when it dispatches a record to the index.
PROPERTY_MESSAGE_ID = "UNIQ_KEY"
PROPERTY_KEYS = "KEYS"  # space-separated, as in RocketMQ
PROPERTY_TAG = "TAGS"
