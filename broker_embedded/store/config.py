"""Settings of the message store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..clock import WALL, Clock
from .filesystem import REAL, FileSystem


@dataclass(frozen=True)
class StoreConfig:
    """How the store lays out, flushes and keeps its files.

    ``flush_mode="sync"`` acknowledges a put only after fsync (group commit);
    ``"async"`` fsyncs every ``async_flush_interval_s``. ``consume_queue_file_entries``
    is the number of 20-byte entries per consume queue file (300,000: 6 MB). Each index
    file has ``index_slots`` hash slots and room for ``index_entries`` entries (4 + 20
    bytes each, sparse until used); sizes apply to index files created after a change.
    The slots of the index file taking entries are also held in memory (4 MiB at the
    default), so that indexing a batch reads nothing.

    The scrub (``scrub.py``) re-reads the commit log in the background and verifies every
    record's CRC: a pass starts when the store opens and then every ``scrub_interval_s``,
    reading at most ``scrub_bytes_per_s`` (0: no scrub thread; damage is then found only by
    the readers that meet it).

    ``filesystem`` is the file layer every file of the store goes through (``filesystem.py``):
    the real one, or the deterministic simulator's in tests. ``clock`` (``broker_embedded.clock``)
    stamps stored records and drives the broker's timers: the wall clock, or a simulation's.
    """

    segment_size: int = 64 * 1024 * 1024
    flush_mode: Literal["sync", "async"] = "sync"
    async_flush_interval_s: float = 0.2
    checkpoint_interval_s: float = 2.0
    max_record_size: int = 4 * 1024 * 1024 + 64 * 1024
    retention_hours: float = 72.0
    min_free_disk_bytes: int = 0
    consume_queue_file_entries: int = 300_000
    index_slots: int = 1 << 20
    index_entries: int = 1 << 22
    scrub_bytes_per_s: int = 16 * 1024 * 1024
    scrub_interval_s: float = 24 * 3600.0
    filesystem: FileSystem = field(default=REAL, compare=False, repr=False)
    clock: Clock = field(default=WALL, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.scrub_bytes_per_s < 0:
            raise ValueError(f"scrub_bytes_per_s must be 0 (off) or positive, got {self.scrub_bytes_per_s}")
        if self.scrub_interval_s <= 0:
            raise ValueError(f"scrub_interval_s must be positive, got {self.scrub_interval_s}")
