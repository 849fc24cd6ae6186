"""Consume queues: per topic and queue, fixed 20-byte entries pointing into the commit log.

Entry ``n`` (commit log offset u64, size u32, tag hash u64) sits at byte ``20 * n`` of
``consumequeue/<topic>/<queue_id>``, so reading queue offset N is O(1). The files are
derived data: the store rebuilds them from the commit log when they are missing or behind.
Entries live in memory (``array``) because they are small and read constantly; the file
is written at checkpoints (``persist``), and a failed write (disk full) is undone and
retried at the next checkpoint, so the file never holds a hole or a partial entry.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from array import array
from pathlib import Path

ENTRY = struct.Struct(">QIQ")
ENTRY_SIZE = ENTRY.size  # 20
_LOAD_CHUNK = 65536  # entries unpacked per struct call when a queue file is opened


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
        self.tags = array("Q")
        for start in range(0, whole, _LOAD_CHUNK * ENTRY_SIZE):
            chunk = raw[start : min(whole, start + _LOAD_CHUNK * ENTRY_SIZE)]
            fields = struct.unpack(">" + ENTRY.format[1:] * (len(chunk) // ENTRY_SIZE), chunk)
            self.offsets.extend(fields[0::3])
            self.sizes.extend(fields[1::3])
            self.tags.extend(fields[2::3])
        self.persisted = len(self.offsets)
        self.min_offset = 0

    @property
    def max_offset(self) -> int:
        """The next queue offset to be assigned."""
        return len(self.offsets)

    def append(self, queue_offset: int, commit_offset: int, size: int, tag: str) -> bool:
        """Add the entry for ``queue_offset``; False if it is already there (replay)."""
        if queue_offset < len(self.offsets):
            return False
        if queue_offset != len(self.offsets):
            if self.offsets:
                raise ValueError(
                    f"{self.path}: queue offset {queue_offset} after {len(self.offsets)} entries"
                )
            # Rebuilt after retention deleted the head: placeholders for the deleted
            # entries (commit log offset 0, below the log's minimum, so never readable).
            self.offsets.extend([0] * queue_offset)
            self.sizes.extend([0] * queue_offset)
            self.tags.extend([0] * queue_offset)
        self.offsets.append(commit_offset)
        self.sizes.append(size)
        self.tags.append(tag_hash(tag))
        return True

    def truncate_beyond(self, commit_log_end: int) -> None:
        """Drop entries that point at or past the end of the commit log (a torn tail)."""
        keep = len(self.offsets)
        while keep > 0 and self.offsets[keep - 1] >= commit_log_end:
            keep -= 1
        if keep != len(self.offsets):
            del self.offsets[keep:]
            del self.sizes[keep:]
            del self.tags[keep:]
        if keep < self.persisted:
            os.ftruncate(self.fd, keep * ENTRY_SIZE)
            self.persisted = keep

    def drop_below(self, commit_log_min: int) -> None:
        """Raise ``min_offset`` past entries whose record retention deleted."""
        while self.min_offset < len(self.offsets) and self.offsets[self.min_offset] < commit_log_min:
            self.min_offset += 1

    def entry(self, queue_offset: int) -> tuple[int, int]:
        """``(commit log offset, size)`` of a queue offset."""
        return self.offsets[queue_offset], self.sizes[queue_offset]

    def unpersisted(self) -> tuple[int, bytes]:
        """``(first entry, bytes)`` of the entries not yet in the file (call under the
        store's write lock; write them with ``persist`` outside it)."""
        start = self.persisted
        pack = ENTRY.pack
        data = b"".join(
            pack(self.offsets[n], self.sizes[n], self.tags[n]) for n in range(start, len(self.offsets))
        )
        return start, data

    def persist(self, start: int, data: bytes) -> None:
        """Write and fsync entries from ``unpersisted``; on failure the file is unchanged."""
        if data:
            try:
                written = os.pwrite(self.fd, data, start * ENTRY_SIZE)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(self.fd)
            except OSError:
                os.ftruncate(self.fd, start * ENTRY_SIZE)
                raise
            self.persisted = max(self.persisted, start + len(data) // ENTRY_SIZE)

    def close(self) -> None:
        os.close(self.fd)
