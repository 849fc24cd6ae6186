"""Consume queues: per topic and queue, fixed 20-byte entries pointing into the commit log.

File layout (RocketMQ's ConsumeQueue mapped files, read with ``pread`` instead of mmap)::

    consumequeue/<topic>/<queue_id>/<first queue offset:020d>

Each file holds ``entries_per_file`` entries (commit log offset u64, size u32, tag hash
u64); file ``k`` starts at queue offset ``k * entries_per_file``, so queue offset N is in
file ``N // entries_per_file`` at byte ``20 * (N % entries_per_file)``: O(1). The files of a
queue are contiguous; only the last one is partly filled. Retention deletes whole files
from the front (never the last one, whose name and size give ``max_offset``); a queue
rebuilt after retention deleted its head starts with a hole of zero entries in its first
file. The files are derived data: the store rebuilds them from the commit log when they
are missing or behind.

An entry of size 0 is a *hole*: a queue offset whose record is gone (damage that
``halfmoon-broker repair`` moved aside, or the head retention deleted). Its commit log
offset is that of the next record of the queue (or of the last one, for holes at the end),
so entries stay in commit log order; readers skip holes.

Memory does not grow with the queue: entries appended since the last checkpoint wait in a
``bytearray`` (already packed) and are written and fsync'd by ``persist``; a failed write
(disk full) is undone and retried at the next checkpoint, so a file never holds a partial
entry. Persisted entries are read with ``pread`` through a few cached descriptors.

An old single-file queue (``consumequeue/<topic>/<queue_id>`` a regular file, entry N at
byte 20·N) is converted on open: the files are built in ``<queue_id>.converting/``, then
the old file is removed and the directory renamed into place; a crash in between is
finished on the next open.
"""

from __future__ import annotations

import bisect
import errno
import logging
import struct
import threading
from collections import OrderedDict
from pathlib import Path

from ..filters import tag_hash
from .files import make_directories
from .filesystem import REAL, FileSystem

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">QIQ")
ENTRY_SIZE = ENTRY.size  # 20
_OPEN_FILES = 2  # descriptors cached per queue: the tail file and one a lagging reader uses
_CONVERTING = ".converting"


def file_name(first_offset: int) -> str:
    """The name of the queue file whose first entry is ``first_offset``."""
    return f"{first_offset:020d}"


class _File:
    """An open queue file, closed when the last reference goes (a reader may still hold it
    after retention or the cache dropped it)."""

    __slots__ = ("fd", "fs")

    def __init__(self, fd: int, fs: FileSystem) -> None:
        self.fd = fd
        self.fs = fs

    def __del__(self) -> None:
        self.fs.close(self.fd)


class ConsumeQueue:
    """One queue's entries; ``min_offset`` rises when retention drops old segments."""

    def __init__(self, directory: Path, entries_per_file: int, fs: FileSystem = REAL) -> None:
        if entries_per_file < 1:
            raise ValueError("entries_per_file must be at least 1")
        self.directory = directory
        self.fs = fs
        self.entries_per_file = entries_per_file
        self._lock = threading.Lock()  # guards _low/_persisted/_pending against readers
        self._files_lock = threading.Lock()  # guards _files (taken after _lock, never before)
        self._files: OrderedDict[int, _File] = OrderedDict()
        converting = directory.with_name(directory.name + _CONVERTING)
        if fs.is_dir(converting):
            if fs.exists(directory):  # the conversion did not finish: the old file is intact
                fs.rmtree(converting)
            else:  # crashed between removing the old file and the rename
                fs.replace(converting, directory)
                fs.fsync_directory(directory.parent)
        if fs.is_file(directory):
            self._convert_single_file(converting)
        numbers = self._numbers()
        self._low = numbers[0] if numbers else 0  # first file number
        self._persisted = self._low * entries_per_file  # queue offset where the files end
        if numbers:
            last = self._file(numbers[-1])
            size = fs.fsize(last.fd)
            if size % ENTRY_SIZE:
                fs.ftruncate(last.fd, size - size % ENTRY_SIZE)
            self._persisted = numbers[-1] * entries_per_file + size // ENTRY_SIZE
        self._pending = bytearray()  # packed entries from _persisted on
        self.min_offset = self._low * entries_per_file

    # -- state ----------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        """The next queue offset to be assigned."""
        return self._persisted + len(self._pending) // ENTRY_SIZE

    @property
    def persisted(self) -> int:
        """The queue offset up to which entries are written to the files."""
        return self._persisted

    # -- writing --------------------------------------------------------------------------
    def append(self, queue_offset: int, commit_offset: int, size: int, tag: str) -> bool:
        """Add the entry for ``queue_offset``; False if it is already there (replay).

        Offsets skipped since the last entry become holes (their records are gone)."""
        with self._lock:
            end = self.max_offset
            if queue_offset < end:
                return False
            if queue_offset != end:
                if end:
                    log.warning("%s: queue offsets %d to %d have no record in the commit log; "
                                "left as holes", self.directory, end, queue_offset - 1)
                    self._pending += ENTRY.pack(commit_offset, 0, 0) * (queue_offset - end)
                else:
                    self._start_at(queue_offset)
            self._pending += ENTRY.pack(commit_offset, size, tag_hash(tag))
            return True

    def _start_at(self, queue_offset: int) -> None:
        """Make an empty queue start at ``queue_offset`` (rebuilt after retention deleted
        its head: the entries before stay a hole, zeros once written; under ``_lock``)."""
        self._delete_files(self._low, queue_offset // self.entries_per_file)
        self._low = queue_offset // self.entries_per_file
        self._persisted = self.min_offset = queue_offset

    def reserve(self, next_offset: int) -> None:
        """Raise ``max_offset`` to ``next_offset`` with holes, so that queue offsets whose
        records were lost are never given to new records (written at the next ``persist``)."""
        end = self.max_offset
        if next_offset <= end:
            return
        last = self.entry(end - 1)[0] if self.min_offset < end else 0
        with self._lock:
            if not end:
                self._start_at(next_offset - 1)  # one hole entry, so that a file holds the end
            self._pending += ENTRY.pack(last, 0, 0) * (next_offset - self.max_offset)

    def unpersisted(self) -> tuple[int, bytes]:
        """``(first entry, bytes)`` of the entries not yet in the files (write them with
        ``persist``; appends may continue meanwhile)."""
        with self._lock:
            return self._persisted, bytes(self._pending)

    def persist(self, start: int, data: bytes) -> None:
        """Write and fsync entries from ``unpersisted``, then free them from memory.

        On failure every file is cut back to its size before the call (no partial entry)
        and the entries stay pending for the next attempt."""
        if not data:
            return
        per_file = self.entries_per_file
        written: list[tuple[_File, int, Path | None]] = []  # file, old size, path if created
        try:
            offset, pos = start, 0
            while pos < len(data):
                number, index = divmod(offset, per_file)
                path = self.directory / file_name(number * per_file)
                is_new = not self.fs.exists(path)
                if is_new:
                    make_directories(self.directory, self.fs)  # else it would pass for a queue whose head retention deleted
                file = self._file(number, create=True)
                written.append((file, self.fs.fsize(file.fd), path if is_new else None))
                chunk = data[pos : pos + (per_file - index) * ENTRY_SIZE]
                if self.fs.pwrite(file.fd, chunk, index * ENTRY_SIZE) != len(chunk):
                    raise OSError(errno.ENOSPC, "short write")
                pos += len(chunk)
                offset += len(chunk) // ENTRY_SIZE
            for file, _, _ in written:
                self.fs.fsync(file.fd)
            if any(created for _, _, created in written):
                self.fs.fsync_directory(self.directory)
        except OSError:
            for file, size, created in written:
                self.fs.ftruncate(file.fd, size)
                if created is not None:
                    self._forget(int(created.name) // per_file)
                    self.fs.unlink(created)
            raise
        done = start + len(data) // ENTRY_SIZE
        with self._lock:
            if done > self._persisted:
                self._pending = self._pending[(done - self._persisted) * ENTRY_SIZE :]
                self._persisted = done

    def truncate_beyond(self, commit_log_end: int) -> None:
        """Drop entries that point at or past the end of the commit log (a torn tail)."""
        self.truncate_to(self._first_at_or_above(commit_log_end))

    def truncate_to(self, keep: int) -> None:
        """Drop the entries from queue offset ``keep`` (at least ``min_offset``) on."""
        if keep >= self.max_offset:
            return
        with self._lock:
            if keep >= self._persisted:
                del self._pending[(keep - self._persisted) * ENTRY_SIZE :]
                return
            per_file = self.entries_per_file
            last = max(self._low, (self._persisted - 1) // per_file)
            kept = max(self._low, (keep - 1) // per_file)  # the lowest file stays, maybe empty
            self._delete_files(kept + 1, last + 1)
            self.fs.ftruncate(self._file(kept, create=True).fd, (keep - kept * per_file) * ENTRY_SIZE)
            self._pending = bytearray()
            self._persisted = keep
            self.min_offset = min(self.min_offset, keep)

    def reset(self) -> None:
        """Drop every entry and file, to rebuild the queue from the commit log."""
        with self._lock:
            for number in self._numbers():
                self._delete_files(number, number + 1)
            self._low = self._persisted = self.min_offset = 0
            self._pending = bytearray()

    def intact_end(self) -> int:
        """The queue offset up to which the files are whole: where the first missing or
        short file before the last one starts (``max_offset`` if there is none)."""
        per_file = self.entries_per_file
        present = set(self._numbers())
        for number in range(self._low, (self._persisted - 1) // per_file):
            path = self.directory / file_name(number * per_file)
            if number not in present or self.fs.size(path) != per_file * ENTRY_SIZE:
                return max(number * per_file, self.min_offset)
        return self.max_offset

    def drop_below(self, commit_log_min: int) -> None:
        """Raise ``min_offset`` past entries whose record retention deleted, and delete the
        files that lie wholly below it (all but the last file)."""
        self.min_offset = self._first_at_or_above(commit_log_min)
        per_file = self.entries_per_file
        with self._lock:
            last = max(self._low, (self._persisted - 1) // per_file)
            first_kept = min(self.min_offset // per_file, last)
            self._delete_files(self._low, first_kept)
            self._low = max(self._low, first_kept)

    # -- reading --------------------------------------------------------------------------
    def entry(self, queue_offset: int) -> tuple[int, int]:
        """``(commit log offset, size)`` of a queue offset in ``[min_offset, max_offset)``,
        a hole (size 0) included."""
        start, data = self._read_from(queue_offset, 1)
        if start != queue_offset or not data:  # also when retention just passed it
            raise IndexError(f"queue offset {queue_offset} is not in {self.directory}")
        offset, size, _ = ENTRY.unpack(data)
        return offset, size

    def entries(self, start: int, count: int) -> list[tuple[int, int]]:
        """``(commit log offset, size)`` of up to ``count`` entries from ``start`` (from
        ``min_offset`` if below it), holes skipped: one ``pread`` per file, the rest from
        memory."""
        found: list[tuple[int, int]] = []
        while len(found) < count:
            start, data = self._read_from(start, count - len(found))
            if not data:
                break
            found += [(offset, size) for offset, size, _ in ENTRY.iter_unpack(data) if size]
            start += len(data) // ENTRY_SIZE
        return found

    def tagged_entries(self, start: int, count: int) -> list[tuple[int, int, int]]:
        """``(queue offset, size, tag hash)`` of up to ``count`` entries from ``start`` (from
        ``min_offset`` if below it), holes (size 0) included: what a tag filter reads to pass
        over messages without reading their records; one ``pread`` per file."""
        first, data = self._read_from(start, count)
        return [(first + index, size, hashed)
                for index, (_, size, hashed) in enumerate(ENTRY.iter_unpack(data))]

    def offset_after(self, commit_offset: int) -> int:
        """The first queue offset whose entry points past ``commit_offset``."""
        return self._first_at_or_above(commit_offset + 1)

    def entries_pointing_into(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``(queue offset, commit log offset, size)`` of the entries whose record starts in
        commit log ``[start, end)``, holes left out: a binary search, then one read each."""
        found: list[tuple[int, int, int]] = []
        queue_offset = self._first_at_or_above(start)
        while queue_offset < self.max_offset:
            offset, size = self.entry(queue_offset)
            if offset >= end:
                break
            if size:
                found.append((queue_offset, offset, size))
            queue_offset += 1
        return found

    def _read_from(self, start: int, count: int) -> tuple[int, bytes]:
        """``(first, entries)``: up to ``count`` packed entries from ``start`` or, below
        ``min_offset``, from ``first`` = ``min_offset``."""
        while True:
            start = max(start, self.min_offset)
            try:
                return start, self._read(start, count)
            except FileNotFoundError:  # retention deleted the file under us: start higher
                if start >= self.min_offset:
                    raise

    def _read(self, start: int, count: int) -> bytes:
        with self._lock:
            persisted, pending = self._persisted, self._pending
        end = min(start + count, persisted + len(pending) // ENTRY_SIZE)
        parts: list[bytes] = []
        per_file = self.entries_per_file
        offset = start
        while offset < min(end, persisted):
            number, index = divmod(offset, per_file)
            length = min(end, persisted, (number + 1) * per_file) - offset
            part = self.fs.pread(self._file(number).fd, length * ENTRY_SIZE, index * ENTRY_SIZE)
            parts.append(part[: len(part) - len(part) % ENTRY_SIZE])
            if len(part) < length * ENTRY_SIZE:  # cut short by a concurrent truncation
                return b"".join(parts)
            offset += length
        if offset < end:
            first, stop = offset - persisted, end - persisted
            parts.append(bytes(pending[first * ENTRY_SIZE : stop * ENTRY_SIZE]))
        return b"".join(parts)

    def _first_at_or_above(self, commit_offset: int) -> int:
        """The first queue offset from ``min_offset`` whose entry points at or past
        ``commit_offset`` (entries rise within a queue): a binary search, one pread a step."""
        queue_offsets = range(self.min_offset, self.max_offset)
        return self.min_offset + bisect.bisect_left(queue_offsets, commit_offset, key=lambda at: self.entry(at)[0])

    # -- files ----------------------------------------------------------------------------
    def _numbers(self) -> list[int]:
        """The numbers of the queue's files, ascending."""
        directory = self.directory
        names = self.fs.listdir(directory) if self.fs.is_dir(directory) else []
        firsts = sorted(int(name) for name in names if name.isdigit())
        if any(first % self.entries_per_file for first in firsts):
            raise ValueError(f"{directory}: files not made with {self.entries_per_file} entries each")
        return [first // self.entries_per_file for first in firsts]

    def _file(self, number: int, create: bool = False) -> _File:
        """File ``number`` from the small descriptor cache, opening it if needed."""
        with self._files_lock:
            file = self._files.get(number)
            if file is None:
                path = self.directory / file_name(number * self.entries_per_file)
                file = _File(self.fs.open(path, create=create), self.fs)
                self._files[number] = file
                while len(self._files) > _OPEN_FILES:
                    self._files.popitem(last=False)
            else:
                self._files.move_to_end(number)
            return file

    def _forget(self, number: int) -> None:
        with self._files_lock:
            self._files.pop(number, None)

    def _delete_files(self, first: int, end: int) -> None:
        """Delete files ``first`` to ``end - 1`` (under ``_lock``); a reader holding one
        keeps reading it until done. The deletions are made durable at once: a file of the
        same name created later (a queue rebuilt) must not be the one a crash takes back,
        leaving the newer files behind a gap that reads as retention's."""
        deleted = False
        for number in range(first, end):
            self._forget(number)
            path = self.directory / file_name(number * self.entries_per_file)
            if self.fs.exists(path):
                self.fs.unlink(path)
                deleted = True
        if deleted:
            self.fs.fsync_directory(self.directory)

    def _convert_single_file(self, converting: Path) -> None:
        """Rewrite today's single file as per-offset files in ``converting``, then put
        them in its place (see the module docstring)."""
        fs = self.fs
        fs.mkdir(converting)
        chunk = self.entries_per_file * ENTRY_SIZE
        old = fs.open(self.directory, read_only=True)
        try:
            number = 0
            while data := fs.pread(old, chunk, number * chunk):
                data = data[: len(data) - len(data) % ENTRY_SIZE]
                new = fs.open(converting / file_name(number * self.entries_per_file), create=True, truncate=True)
                try:
                    if fs.pwrite(new, data, 0) != len(data):
                        raise OSError(errno.ENOSPC, "short write")
                    fs.fsync(new)
                finally:
                    fs.close(new)
                number += 1
        finally:
            fs.close(old)
        fs.fsync_directory(converting)
        fs.unlink(self.directory)
        fs.replace(converting, self.directory)
        fs.fsync_directory(self.directory.parent)

    def close(self) -> None:
        """Release the file descriptors."""
        with self._files_lock:
            self._files.clear()
