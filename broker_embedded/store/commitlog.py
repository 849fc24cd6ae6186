"""The commit log: every record of every topic, appended to fixed-size segment files.

A segment is named by the commit log offset of its first byte, zero-padded to 20 digits.
A record never straddles two segments: when the next record does not fit, the rest of the
segment is closed with a blank filler and the record starts the next segment.
Appends are sequential and happen under the caller's lock; reads are random (``pread``).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import CorruptLogError, StoreFullError
from . import codec
from .record import StoredRecord

log = logging.getLogger("broker_embedded.store.commitlog")


class Segment:
    """One segment file, opened for reading and, if it is the last, for appending."""

    def __init__(self, path: Path, base_offset: int, size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.size = size
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    def pread(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, length, position)

    def close(self) -> None:
        os.close(self.fd)


class CommitLog:
    """Segmented append-only log; ``write_offset`` is where the next record goes."""

    def __init__(self, directory: Path, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        directory.mkdir(parents=True, exist_ok=True)
        self.segments: list[Segment] = [
            Segment(path, int(path.name), segment_size)
            for path in sorted(directory.iterdir())
            if path.name.isdigit()
        ]
        self.write_offset = self.segments[0].base_offset if self.segments else 0
        self._dirty: set[Segment] = set()

    # -- recovery -------------------------------------------------------------------------
    def recover(self, verified_offset: int) -> Iterator[StoredRecord]:
        """Verify records from ``verified_offset`` on, truncate a torn tail, yield the good ones.

        A record that fails its check in the last segment with nothing intact after it is a
        torn tail (an append the crash interrupted, never acknowledged): it and everything
        after are truncated. A bad record in an earlier, closed segment, or one followed by
        an intact record, is corruption of acknowledged data: ``CorruptLogError``.
        """
        if not self.segments:
            return
        offset = max(verified_offset, self.segments[0].base_offset)
        for index, segment in enumerate(self.segments):
            if segment.end_offset <= offset:
                continue
            is_last = index == len(self.segments) - 1
            data = segment.pread(0, segment.size)
            pos = offset - segment.base_offset
            while pos < len(data):
                if segment.size - pos < codec.HEAD_SIZE:
                    pos = segment.size  # zero filler too short for a blank header
                    break
                total, magic = codec.peek_length(data, pos)
                if magic == codec.BLANK_MAGIC and pos + total == segment.size:
                    pos = segment.size
                    break
                if total == 0 and magic == 0 and not any(data[pos : pos + codec.HEAD_SIZE]):
                    break  # zeros: the end of what was written
                try:
                    record = codec.decode(data, pos, segment.base_offset + pos)
                except codec.RecordError as exc:
                    if not is_last or _intact_record_after(data, pos + 1, segment.base_offset):
                        raise CorruptLogError(
                            f"corrupt record at commit log offset {segment.base_offset + pos} "
                            f"in segment {segment.path.name} ({exc}), "
                            + ("followed by intact records" if is_last else "a closed segment")
                        ) from exc
                    log.warning(
                        "truncating torn tail at commit log offset %d (%s)",
                        segment.base_offset + pos, exc,
                    )
                    self._zero_from(segment, pos)
                    break
                yield record
                pos += total
            offset = segment.base_offset + pos
            if is_last:
                self.write_offset = offset
            elif pos < segment.size:
                raise CorruptLogError(f"closed segment {segment.path.name} ends early at {offset}")
        self.write_offset = max(self.write_offset, offset)

    def _zero_from(self, segment: Segment, position: int) -> None:
        os.ftruncate(segment.fd, position)
        os.fsync(segment.fd)

    # -- appending ------------------------------------------------------------------------
    def append_many(self, records: list[bytes]) -> list[int]:
        """Write encoded records in order, one ``pwrite`` per segment touched; returns their
        commit log offsets. All or nothing: on ``StoreFullError`` everything this call wrote
        is removed again. Not thread-safe (the caller holds the store's write lock)."""
        start_offset, start_segments = self.write_offset, len(self.segments)
        offsets: list[int] = []
        chunk: list[bytes] = []
        segment: Segment | None = None
        position = 0
        try:
            for data in records:
                if len(data) > self.segment_size:
                    raise ValueError(f"record of {len(data)} bytes exceeds the segment size")
                if segment is None or segment.end_offset - self.write_offset < len(data):
                    if segment is not None and chunk:
                        self._write_all(segment, position, b"".join(chunk))
                        chunk = []
                    segment = self._segment_for_append(len(data))
                    position = self.write_offset - segment.base_offset
                    self._dirty.add(segment)
                chunk.append(data)
                offsets.append(self.write_offset)
                self.write_offset += len(data)
            if segment is not None and chunk:
                self._write_all(segment, position, b"".join(chunk))
        except StoreFullError:
            self._roll_back(start_offset, start_segments)
            raise
        return offsets

    def _roll_back(self, offset: int, segment_count: int) -> None:
        """Undo appends back to ``offset``: drop segments created since, cut the last one."""
        for segment in self.segments[segment_count:]:
            segment.close()
            segment.path.unlink()
            self._dirty.discard(segment)
        del self.segments[segment_count:]
        if self.segments and offset < self.segments[-1].end_offset:
            last = self.segments[-1]
            os.ftruncate(last.fd, offset - last.base_offset)
        self.write_offset = offset

    def _segment_for_append(self, length: int) -> Segment:
        if not self.segments:
            return self._new_segment(self.write_offset)
        segment = self.segments[-1]
        remaining = segment.end_offset - self.write_offset
        if remaining >= length:
            return segment
        if remaining > 0:
            self._write_all(segment, segment.size - remaining, codec.encode_blank(remaining))
            self._dirty.add(segment)  # fsynced with the records that made it roll over
        self.write_offset = segment.end_offset
        return self._new_segment(self.write_offset)

    def _new_segment(self, base_offset: int) -> Segment:
        path = self.directory / f"{base_offset:020d}"
        try:
            segment = Segment(path, base_offset, self.segment_size)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"disk full while creating {path}") from exc
            raise
        self.segments.append(segment)
        fsync_directory(self.directory)
        return segment

    def _write_all(self, segment: Segment, position: int, data: bytes) -> None:
        try:
            written = os.pwrite(segment.fd, data, position)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"disk full while appending to {segment.path}") from exc
            raise

    def take_dirty(self) -> list[Segment]:
        """The segments written since the last flush; the caller fsyncs them."""
        dirty = list(self._dirty)
        self._dirty.clear()
        return dirty

    def flush(self) -> None:
        """fsync every segment written since the last flush."""
        for segment in list(self._dirty):
            os.fsync(segment.fd)
            self._dirty.discard(segment)

    # -- reading --------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> StoredRecord:
        """The record at ``offset`` (``size`` bytes long)."""
        segment = self._segment_of(offset)
        data = segment.pread(offset - segment.base_offset, size)
        try:
            return codec.decode(data, 0, offset)
        except codec.RecordError as exc:
            raise CorruptLogError(f"unreadable record at commit log offset {offset}: {exc}") from exc

    def read_at(self, offset: int) -> StoredRecord:
        """The record at ``offset`` when its size is not known."""
        segment = self._segment_of(offset)
        head = segment.pread(offset - segment.base_offset, codec.HEAD_SIZE)
        total, _ = codec.peek_length(head, 0)
        return self.read(offset, total)

    def read_head(self, offset: int) -> tuple[str, dict[str, str]] | None:
        """Topic and properties of the record at ``offset``, body unread; None when no
        record starts there."""
        segment = self._segment_of(offset)
        position = offset - segment.base_offset
        try:
            return codec.decode_head(lambda start, length: segment.pread(position + start, length))
        except codec.RecordError:
            return None

    def scan(self, from_offset: int, to_offset: int) -> Iterator[StoredRecord]:
        """Every record in ``[from_offset, to_offset)``, in order."""
        for segment in list(self.segments):
            if segment.end_offset <= from_offset or segment.base_offset >= to_offset:
                continue
            start = max(from_offset, segment.base_offset) - segment.base_offset
            end = min(to_offset, segment.end_offset) - segment.base_offset
            data = segment.pread(start, end - start)
            pos = 0
            while pos < len(data):
                total, magic = codec.peek_length(data, pos)
                if magic != codec.RECORD_MAGIC:
                    break
                yield codec.decode(data, pos, segment.base_offset + start + pos)
                pos += total
            from_offset = segment.end_offset

    def _segment_of(self, offset: int) -> Segment:
        for segment in reversed(self.segments):
            if segment.base_offset <= offset < segment.end_offset:
                return segment
        raise CorruptLogError(f"commit log offset {offset} is not in any segment")

    @property
    def min_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else self.write_offset

    def delete_segments_before(self, offset: int, older_than_ms: int) -> int:
        """Delete closed segments ending at or before ``offset`` and last modified before
        ``older_than_ms``; returns how many were deleted."""
        deleted = 0
        while len(self.segments) > 1:
            segment = self.segments[0]
            if segment.end_offset > offset:
                break
            if os.stat(segment.path).st_mtime * 1000 >= older_than_ms:
                break
            segment.close()
            segment.path.unlink()
            self.segments.pop(0)
            deleted += 1
        return deleted

    def close(self) -> None:
        self.flush()
        for segment in self.segments:
            segment.close()
        self.segments = []


def _intact_record_after(data: bytes, start: int, base_offset: int) -> bool:
    """Whether an intact record begins anywhere in ``data`` at or after ``start``.

    Runs only when recovery meets a bad record; the C-level ``find`` for the magic keeps
    it fast even over a whole segment.
    """
    magic = codec.RECORD_MAGIC.to_bytes(4, "big")
    found = data.find(magic, start + 4)
    while found >= 0:
        try:
            codec.decode(data, found - 4, base_offset + found - 4)
            return True
        except codec.RecordError:
            found = data.find(magic, found + 1)
    return False


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
