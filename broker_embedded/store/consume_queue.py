"""Consume queues: per topic and queue, fixed 20-byte entries pointing into the commit log.

Entry ``n`` (commit log offset u64, size u32, tag hash u64) sits at byte ``20 * n`` of
``consumequeue/<topic>/<queue_id>``, so reading queue offset N is O(1). The files are
derived data: the store rebuilds them from the commit log when they are missing or behind.
Entries are mirrored in memory (``array``) because they are small and read constantly.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from pathlib import Path

ENTRY = struct.Struct(">QIQ")
ENTRY_SIZE = ENTRY.size  # 20


def tag_hash(tag: str) -> int:
    """The 64-bit tag code stored in an entry (0 for no tag)."""
    return zlib.crc32(tag.encode()) if tag else 0


class ConsumeQueue:
    """One queue's entries; ``min_offset`` rises when retention drops old segments."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        raw = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        whole = len(raw) - len(raw) % ENTRY_SIZE
        if whole != len(raw):
            os.ftruncate(self.fd, whole)
        self.offsets = array("q")
        self.sizes = array("i")
        for commit_offset, size, _tag in ENTRY.iter_unpack(raw[:whole]):
            self.offsets.append(commit_offset)
            self.sizes.append(size)
        self.min_offset = 0
        self._dirty = False

    @property
    def max_offset(self) -> int:
        """The next queue offset to be assigned."""
        return len(self.offsets)

    def append(self, queue_offset: int, commit_offset: int, size: int, tag: str) -> bool:
        """Add the entry for ``queue_offset``; False if it is already there (replay)."""
        if queue_offset < len(self.offsets):
            return False
        if queue_offset != len(self.offsets):
            raise ValueError(
                f"{self.path}: queue offset {queue_offset} after {len(self.offsets)} entries"
            )
        os.pwrite(self.fd, ENTRY.pack(commit_offset, size, tag_hash(tag)), queue_offset * ENTRY_SIZE)
        self.offsets.append(commit_offset)
        self.sizes.append(size)
        self._dirty = True
        return True

    def truncate_beyond(self, commit_log_end: int) -> None:
        """Drop entries that point at or past the end of the commit log (a torn tail)."""
        keep = len(self.offsets)
        while keep > 0 and self.offsets[keep - 1] >= commit_log_end:
            keep -= 1
        if keep != len(self.offsets):
            del self.offsets[keep:]
            del self.sizes[keep:]
            os.ftruncate(self.fd, keep * ENTRY_SIZE)

    def entry(self, queue_offset: int) -> tuple[int, int]:
        """``(commit log offset, size)`` of a queue offset."""
        return self.offsets[queue_offset], self.sizes[queue_offset]

    def flush(self) -> None:
        if self._dirty:
            os.fsync(self.fd)
            self._dirty = False

    def close(self) -> None:
        self.flush()
        os.close(self.fd)
