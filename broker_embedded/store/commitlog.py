"""The commit log: every record of every topic, appended to fixed-size segment files.

A segment is named by the commit log offset of its first byte, zero-padded to 20 digits.
A record never straddles two segments: when the next record does not fit, the rest of the
segment is closed with a blank filler and the record starts the next segment. A blank
filler may also stand where ``repair`` moved damaged bytes aside; readers skip it.
Appends are sequential and happen under the caller's lock; reads are random (``pread``).

The last segment's file holds zeros written ahead of its records (``PREALLOCATE_BYTES``,
extended by half of it at a time: RocketMQ preallocates and warms its mapped files the
same way): an append then overwrites bytes the file already has, so its ``fdatasync``
writes the data alone, no file size and no block allocation (on ext4 no journal commit:
about a third off the sync's time and CPU, ``benchmarks/results/issue24-preallocate.txt``).
Zeros after the last record are what recovery already cuts as a torn tail, so a crash
leaves nothing new to recover from; a clean close cuts them itself. Segments are synced
with ``fdatasync``, not ``fsync`` (Redis does the same for its AOF): fdatasync(2) flushes
the data and "metadata needed in order to allow a subsequent data retrieval to be
correctly handled", which includes the file size (and the block allocation) it changed;
what it leaves to the kernel's writeback is metadata that no read needs, such as
``st_mtime``. The only reader of a segment's mtime is retention
(``delete_segments_before``), for which an mtime a few seconds stale after a power cut is
harmless next to ``retention_hours``. A new segment's directory entry is fsync'd when the
segment is created.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import BrokerClosedError, CorruptLogError, StoreFullError
from . import codec
from .files import make_directories
from .filesystem import REAL, UNREADABLE_BYTE, FileSystem, read_salvaging
from .record import StoredRecord

log = logging.getLogger(__name__)

#: How many bytes of zeros the last segment's file holds past its records at most; more are
#: written once fewer than half of them are left.
PREALLOCATE_BYTES = 1 << 20
_ZEROS = memoryview(bytes(PREALLOCATE_BYTES))
#: The longest stretch of a segment ``read_many`` reads with one ``pread`` for the records
#: lying in it (a queue's records, with other queues' between them).
READ_SPAN_BYTES = 256 * 1024


class Segment:
    """One segment file, opened for reading and, if it is the last, for appending."""

    def __init__(self, path: Path, base_offset: int, size: int, fs: FileSystem = REAL, truncate: bool = False) -> None:
        self.path = path
        self.base_offset = base_offset
        self.size = size
        self.fs = fs
        self.fd = fs.open(path, create=True, truncate=truncate)
        #: How long the file is (records and the zeros written ahead of them), None until
        #: an append needs it.
        self.allocated: int | None = None

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    def pread(self, position: int, length: int) -> bytes:
        """The segment's bytes ``[position, position + length)``; an unreadable page (EIO)
        reads as damaged bytes (``read_salvaging``)."""
        return read_salvaging(self.fs, self.fd, length, position, self.path)

    def close(self) -> None:
        """Close its descriptor, once: a number closed twice may be another file's by then."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            self.fs.close(fd)


class CommitLog:
    """Segmented append-only log; ``write_offset`` is where the next record goes."""

    def __init__(self, directory: Path, segment_size: int, fs: FileSystem = REAL) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.fs = fs
        make_directories(directory, fs)
        self.segments: list[Segment] = [
            Segment(directory / name, int(name), segment_size, fs)
            for name in sorted(fs.listdir(directory))
            if name.isdigit()
        ]
        self.write_offset = self.segments[0].base_offset if self.segments else 0
        self._dirty: set[Segment] = set()
        #: Segment files a roll-back could not delete (``_roll_back``).
        self._left_behind: set[Path] = set()
        #: The torn tail ``recover`` truncated: its start offset and its bytes (what may
        #: still name a record that was cut there); None if there was none.
        self.truncated: tuple[int, bytes] | None = None
        #: Why a roll-back could not make its cut durable: the bytes of the failed append may
        #: come back after a power loss, so no append follows them until a restart's recovery.
        self._cut_failed: OSError | None = None

    # -- recovery -------------------------------------------------------------------------
    def check_layout(self, verified_offset: int) -> None:
        """``LogDamageError`` if checkpointed records are missing: a segment file, the end of
        a closed segment (shorter than ``segment_size``), or the log ends before
        ``verified_offset``. One ``fstat`` per segment."""
        gaps = layout_gaps(
            [(segment.base_offset, self.fs.fsize(segment.fd)) for segment in self.segments],
            self.segment_size, verified_offset,
        )
        if gaps:
            raise LogDamageError(self.directory, gaps[0], fs=self.fs)

    def recover(self, verified_offset: int) -> Iterator[StoredRecord]:
        """Verify records from ``verified_offset`` on (after ``check_layout``), truncate a
        torn tail, yield the good records.

        A bad record (or zeros) in the last segment with nothing intact after it is a torn
        tail (an append the crash interrupted, never acknowledged): it and everything after
        are truncated. A bad record in a closed segment, one followed by an intact record, or
        one whose chain of lengths shows records written whole (``damage_in_chain``), is damage to
        acknowledged data: ``LogDamageError``, and nothing is truncated.

        First the segments past ``verified_offset`` and the directory are synced: after a
        crash of the process alone, what it wrote and never synced is still in the page
        cache, readable but not on disk. Recovery takes for durable what it reads (it
        dispatches it, the next checkpoint counts it, later appends follow it), so it makes
        it so; a power loss after the restart would otherwise take records from under a
        checkpoint, or leave a hole before intact records.
        """
        if not self.segments:
            return
        offset = self.write_offset = max(verified_offset, self.segments[0].base_offset)
        for segment in self.segments:
            if segment.end_offset > offset:
                self.fs.fdatasync(segment.fd)
        self.fs.fsync_directory(self.directory)
        for index, segment in enumerate(self.segments):
            if segment.end_offset <= offset:
                continue
            data = segment.pread(0, segment.size)
            end = segment.base_offset + len(data)
            torn: Gap | None = None  # the first bad range, a torn tail unless a record follows
            for item in walk(data, segment.base_offset, offset - segment.base_offset, segment.size):
                if isinstance(item, StoredRecord):
                    if torn is not None:
                        raise LogDamageError(self.directory, torn, "followed by intact records", self.fs)
                    yield item
                elif index < len(self.segments) - 1:
                    raise LogDamageError(self.directory, item, "a closed segment", self.fs)
                else:
                    torn = torn or item
            if torn is not None and damage_in_chain(data, torn.start - segment.base_offset, segment.base_offset):
                raise LogDamageError(self.directory, torn, "records written whole, damaged since", self.fs)
            if torn is not None:  # nothing after it but fillers (of the same interrupted append)
                if written_ahead(torn, end):
                    log.info("cutting %d bytes of zeros after the commit log's last record, at offset %d",
                             end - torn.start, torn.start)
                else:
                    log.warning("truncating a torn tail at commit log offset %d (%s, %d bytes)",
                                torn.start, torn.detail, end - torn.start)
                self.truncated = (torn.start, data[torn.start - segment.base_offset:])
                self._zero_from(segment, torn.start - segment.base_offset)
                end = torn.start
            offset = self.write_offset = end

    def _zero_from(self, segment: Segment, position: int) -> None:
        segment.allocated = None
        self.fs.ftruncate(segment.fd, position)
        self.fs.fsync(segment.fd)

    # -- appending ------------------------------------------------------------------------
    def append_many(self, records: list[bytes]) -> list[int]:
        """Write records in order, each ``codec.encode``d and sealed here with the offset
        it is written at (``codec.seal``), one ``pwrite`` per segment touched; returns their
        commit log offsets. All or nothing: on ``StoreFullError`` or an ``OSError`` (EIO)
        everything this call wrote is removed again, so that the next append does not leave
        a hole behind it; if that removal cannot be made durable, every later append raises
        ``BrokerClosedError`` (as after a failed fsync: a restart recovers). Not thread-safe
        (the caller holds the store's write lock)."""
        if self._cut_failed is not None:
            raise BrokerClosedError(f"a failed append could not be undone durably ({self._cut_failed}); "
                                    "the commit log takes no more appends until the broker restarts")
        start_offset, start_segments = self.write_offset, len(self.segments)
        offsets: list[int] = []
        chunk: list[bytes] = []
        segment: Segment | None = None
        position = 0
        try:
            for fields in records:
                length = codec.SEAL_SIZE + len(fields)
                if length > self.segment_size:
                    raise ValueError(f"record of {length} bytes exceeds the segment size")
                if segment is None or segment.end_offset - self.write_offset < length:
                    if segment is not None and chunk:
                        self._write_all(segment, position, b"".join(chunk))
                        chunk = []
                    segment = self._segment_for_append(length)
                    position = self.write_offset - segment.base_offset
                    self._dirty.add(segment)
                chunk.append(codec.seal(fields, self.write_offset))
                offsets.append(self.write_offset)
                self.write_offset += length
            if segment is not None and chunk:
                self._write_all(segment, position, b"".join(chunk))
        except (StoreFullError, OSError):
            self._roll_back(start_offset, start_segments)
            raise
        if segment is not None:
            self._preallocate(segment)
        return offsets

    def _preallocate(self, segment: Segment) -> None:
        """Keep zeros written ahead of the last segment's records (``PREALLOCATE_BYTES``):
        they reach the disk with this append's sync, and the appends that overwrite them
        change no file size. A write of zeros that fails leaves the file as it was, not
        the append: the next append tries again."""
        end = self.write_offset - segment.base_offset
        if segment.allocated is None:
            segment.allocated = self.fs.fsize(segment.fd)
        stop = min(end + PREALLOCATE_BYTES, segment.size)
        start = max(segment.allocated, end)
        if stop <= start or (stop < segment.size and stop - start < PREALLOCATE_BYTES // 2):
            return  # nothing left to the segment's end, or more than half of them still ahead
        try:
            written = self.fs.pwrite(segment.fd, _ZEROS[:stop - start], start)
        except OSError as exc:  # no room for them, or the disk refused them: appends go on as before
            log.debug("no zeros written ahead in %s: %s", segment.path, exc)
            segment.allocated = None
            return
        segment.allocated = start + written

    def _roll_back(self, offset: int, segment_count: int) -> None:
        """Undo appends back to ``offset``: drop segments created since, cut the last one.
        The dropped segments leave the log and are closed first, whatever fails after: a
        file that cannot be deleted is left behind, out of use (``_new_segment`` empties it
        when its offset comes again: its rolled-back records must not look written), never a
        closed descriptor in the log."""
        self.write_offset = offset  # even if a cut fails: the next append writes over it
        dropped = self.segments[segment_count:]
        del self.segments[segment_count:]
        for segment in dropped:
            self._dirty.discard(segment)
            segment.close()
        failure: OSError | None = None
        for segment in dropped:  # each one tried: every file not deleted must be known
            try:
                self.fs.unlink(segment.path)
            except OSError as exc:
                self._left_behind.add(segment.path)
                failure = failure or exc
        if failure is not None:
            raise failure
        if dropped:
            # gone for good before the segment before them is cut: else a crash could leave
            # that one short, a closed segment with a hole, behind them
            self.fs.fsync_directory(self.directory)
        if self.segments and offset < self.segments[-1].end_offset:
            last = self.segments[-1]
            # durable at once: else a power loss before the next sync of the segment could
            # bring back part of what the failed append wrote, damage followed by intact
            # records, which recovery must take for damage to acknowledged ones
            try:
                self._zero_from(last, offset - last.base_offset)
            except OSError as exc:
                self._cut_failed = exc
                raise

    def _segment_for_append(self, length: int) -> Segment:
        if not self.segments:
            return self._new_segment(self.write_offset)
        segment = self.segments[-1]
        remaining = segment.end_offset - self.write_offset
        if remaining >= length:
            return segment
        if remaining > 0:
            self._write_all(segment, segment.size - remaining, codec.encode_blank(remaining, self.write_offset))
        # The closed segment is whole on disk before the next one exists: else a crash could
        # leave it short (or torn) behind a newer segment, which recovery must take for
        # damage to acknowledged records, not for a torn tail.
        self.fs.fdatasync(segment.fd)
        self._dirty.discard(segment)
        self.write_offset = segment.end_offset
        return self._new_segment(self.write_offset)

    def _new_segment(self, base_offset: int) -> Segment:
        """The segment starting at ``base_offset``, the log's end; emptied first if a
        rolled-back append left its file behind (``_roll_back``)."""
        path = self.directory / f"{base_offset:020d}"
        try:
            segment = Segment(path, base_offset, self.segment_size, self.fs, truncate=path in self._left_behind)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"disk full while creating {path}") from exc
            raise
        self._left_behind.discard(path)
        self.segments.append(segment)
        self.fs.fsync_directory(self.directory)
        return segment

    def _write_all(self, segment: Segment, position: int, data: bytes) -> None:
        try:
            written = self.fs.pwrite(segment.fd, data, position)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"disk full while appending to {segment.path}") from exc
            raise

    def take_dirty(self) -> list[Segment]:
        """The segments written since the last flush, oldest first (a deterministic order of
        calls, which the simulated disk's replay needs); the caller fdatasyncs them."""
        dirty = sorted(self._dirty, key=lambda segment: segment.base_offset)
        self._dirty.clear()
        return dirty

    def flush(self) -> None:
        """fdatasync every segment written since the last flush."""
        for segment in sorted(self._dirty, key=lambda segment: segment.base_offset):
            self.fs.fdatasync(segment.fd)
            self._dirty.discard(segment)

    # -- reading --------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> StoredRecord:
        """The record at ``offset`` (``size`` bytes long)."""
        segment = self._segment_of(offset)
        return _decoded(segment.pread(offset - segment.base_offset, size), offset)

    def read_many(self, entries: list[tuple[int, int]]) -> list[StoredRecord | CorruptLogError]:
        """The records at ``entries`` (commit log offset, size), in commit log order, each
        as ``read`` returns it or the ``CorruptLogError`` that refused it: those lying within
        ``READ_SPAN_BYTES`` of each other in one segment with one ``pread`` of the stretch
        they cover (a receive's batch of a queue is one system call, not one a record)."""
        results: list[StoredRecord | CorruptLogError] = []
        first = 0
        while first < len(entries):
            start = entries[first][0]
            try:
                segment = self._segment_of(start)
            except CorruptLogError as exc:
                results.append(exc)
                first += 1
                continue
            limit = min(segment.end_offset, start + READ_SPAN_BYTES)
            stop = start + entries[first][1]  # where the stretch read ends
            end = first + 1
            while end < len(entries):
                offset, size = entries[end]
                if offset < stop or offset + size > limit:
                    break
                stop, end = offset + size, end + 1
            with memoryview(segment.pread(start - segment.base_offset, stop - start)) as span:
                for offset, size in entries[first:end]:
                    try:
                        results.append(_decoded(span[offset - start:offset - start + size], offset))
                    except CorruptLogError as exc:
                        results.append(exc)
            first = end
        return results

    def read_at(self, offset: int) -> StoredRecord:
        """The record at ``offset`` when its size is not known."""
        segment = self._segment_of(offset)
        head = segment.pread(offset - segment.base_offset, codec.HEAD_SIZE)
        total, _ = codec.peek_length(head, 0)
        return self.read(offset, total)

    def read_head(self, offset: int) -> codec.RecordHead | None:
        """Topic, properties and place of the record at ``offset``, body unread; None when
        no record written there starts there."""
        segment = self._segment_of(offset)
        position = offset - segment.base_offset
        try:
            return codec.decode_head(lambda start, length: segment.pread(position + start, length), offset)
        except codec.RecordError:
            return None

    def scan(self, from_offset: int, to_offset: int, gaps: list[Gap] | None = None) -> Iterator[StoredRecord]:
        """Every record in ``[from_offset, to_offset)``, in order; ``LogDamageError`` at
        bytes that are neither a record nor a filler.

        With ``gaps`` (recovery's replay below the checkpoint, where nothing is truncated),
        such bytes are passed instead: each damaged range is appended to ``gaps`` before the
        records after it are yielded. The walk then starts at the beginning of
        ``from_offset``'s segment (records before ``from_offset`` are not yielded), so the
        ranges are those the scrub and ``fsck`` find, whatever record it starts from."""
        for segment in list(self.segments):
            if segment.end_offset <= from_offset or segment.base_offset >= to_offset:
                continue
            start = 0 if gaps is not None else max(from_offset, segment.base_offset) - segment.base_offset
            end = min(to_offset, segment.end_offset) - segment.base_offset
            data = segment.pread(start, end - start)
            for item in walk(data, segment.base_offset + start, 0, segment.size - start):
                if isinstance(item, StoredRecord):
                    if item.commit_log_offset >= from_offset:
                        yield item
                elif gaps is None:
                    raise LogDamageError(self.directory, item, fs=self.fs)
                else:
                    gaps.append(item)

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
        while self.first_expired(offset, older_than_ms):
            segment = self.segments[0]
            segment.close()
            self.fs.unlink(segment.path)
            self.segments.pop(0)
            deleted += 1
        return deleted

    def first_expired(self, offset: int, older_than_ms: int) -> bool:
        """Whether ``delete_segments_before`` would delete the first segment."""
        if len(self.segments) < 2:
            return False
        segment = self.segments[0]
        return segment.end_offset <= offset and self.fs.mtime_ms(segment.path) < older_than_ms

    def close(self) -> None:
        """Flush, cut the zeros written ahead of the last records (a closed store's log ends
        with its last record), close the files."""
        self.flush()
        if self.segments:
            last = self.segments[-1]
            end = self.write_offset - last.base_offset
            if last.allocated is not None and last.allocated > end:
                try:
                    self._zero_from(last, end)
                except OSError as exc:  # left for the next start, which cuts them as a torn tail
                    log.warning("could not cut the zeros after the commit log's end in %s: %s", last.path, exc)
        for segment in self.segments:
            segment.close()
        self.segments = []


@dataclass(frozen=True, slots=True)
class Gap:
    """Commit log bytes ``[start, end)`` that hold no intact record: ``kind`` is
    ``"damaged"`` (bytes that are not a record), ``"unreadable"`` (damaged, and at least
    one page of them failed with EIO, a latent sector error: how many records it held no
    byte may tell), ``"zeros"`` or ``"missing"`` (the bytes are not there: a deleted
    segment, a closed segment or a log cut short)."""

    start: int
    end: int
    kind: str
    detail: str


class LogDamageError(CorruptLogError):
    """The commit log lost or damaged records that may have been acknowledged: the store
    refuses to open (it would drop them, and append over them)."""

    def __init__(self, directory: Path, gap: Gap, context: str = "", fs: FileSystem = REAL) -> None:
        self.gap = gap
        self.segment = directory / f"{segment_base(gap.start, directory, fs):020d}"
        data_dir = directory.parent
        where = f"segment {self.segment.name}" + (f", {context}" if context else "")
        super().__init__(
            f"commit log damaged at offset {gap.start} in {where} "
            f"({gap.detail}, {gap.end - gap.start} bytes {gap.kind}); the store refuses to open "
            f"rather than drop or overwrite acknowledged records: see `halfmoon-broker fsck "
            f"--data-dir {data_dir}`, salvage with `halfmoon-broker repair --data-dir {data_dir}`"
        )


def segment_bases(directory: Path, fs: FileSystem = REAL) -> list[int]:
    """The start offsets of the segment files in ``directory``, ascending (none if it is missing)."""
    return sorted(int(name) for name in fs.listdir(directory) if name.isdigit()) if fs.exists(directory) else []


def segment_base(offset: int, directory: Path, fs: FileSystem = REAL) -> int:
    """The start offset of the segment file in ``directory`` holding ``offset`` (that of
    the first segment if it lies before all of them)."""
    bases = segment_bases(directory, fs)
    return max((base for base in bases if base <= offset), default=bases[0] if bases else 0)


def layout_gaps(segments: list[tuple[int, int]], segment_size: int, verified: int) -> list[Gap]:
    """Where records are missing from a log of ``segments`` (start offset, file size):
    between segments, at the end of a closed segment, and before ``verified`` (the
    checkpoint) at the end of the log."""
    gaps: list[Gap] = []
    for index, (base, size) in enumerate(segments):
        if index + 1 < len(segments):
            if size != segment_size:
                gaps.append(Gap(base + size, base + segment_size, "missing",
                                f"closed segment {base:020d} is {size} bytes, not {segment_size}"))
            following = segments[index + 1][0]
            if following != base + segment_size:
                gaps.append(Gap(base + segment_size, following, "missing",
                                f"segment files missing from {base + segment_size:020d}"))
        elif base + size < verified:
            gaps.append(Gap(base + size, verified, "missing",
                            f"the log ends at {base + size}, shorter than the checkpoint ({verified})"))
    if not segments and verified > 0:
        gaps.append(Gap(0, verified, "missing",
                        f"no segment files, shorter than the checkpoint ({verified})"))
    return gaps


def walk(data: bytes, base: int, pos: int, size: int) -> Iterator[StoredRecord | Gap]:
    """The intact records of a segment's ``data`` from ``pos`` on, and a ``Gap`` for each
    run of bytes between them that is neither a record nor a blank filler (``base``: the
    segment's start offset; ``size``: its full size). After a gap the walk goes on at the
    next intact record or filler, found by its magic and crc (or tag)."""
    length = len(data)
    while pos < length:
        if size - pos < codec.HEAD_SIZE and data.count(0, pos) == length - pos:
            return  # the zero filler of a segment's last few bytes
        filler = codec.blank_length(data, pos, base + pos)
        if filler:
            pos += filler
            continue
        try:
            record = codec.decode(data, pos, base + pos)
        except codec.RecordError as exc:
            # a gap is never shorter than a blank header, so that repair can fill it
            resume = next_intact(data, pos + codec.HEAD_SIZE, base)
            yield Gap(base + pos, base + resume, damage_kind(data, pos, resume), str(exc))
            pos = resume
            continue
        yield record
        pos += record.size


#: A sector's worth of what ``read_salvaging`` reads for an unreadable page: a gap holding
#: it is (at least partly) a latent sector error, not bytes that read back wrong.
_UNREADABLE_SECTOR = bytes([UNREADABLE_BYTE]) * 512
#: The start of a header on an unreadable page, as ``read_salvaging`` reads it.
_UNREADABLE_HEAD = _UNREADABLE_SECTOR[:4]


def unreadable_header(header: bytes) -> bool:
    """Whether a record header read back lies, whole or in part, on a page the disk could
    not read (``read_salvaging`` fills such a page with ``UNREADABLE_BYTE``)."""
    return _UNREADABLE_HEAD in header


def _decoded(data: bytes | memoryview, offset: int) -> StoredRecord:
    """The record ``data`` holds, read at commit log ``offset``; ``CorruptLogError`` if it
    is not one, intact and written there."""
    try:
        return codec.decode(data, 0, offset)
    except codec.RecordError as exc:
        raise CorruptLogError(f"unreadable record at commit log offset {offset}: {exc}") from exc


def written_ahead(tail: Gap, end: int) -> bool:
    """Whether ``tail``, the bad range after the last segment's last record, is zeros up to
    the file's ``end`` alone: most likely the zeros the log writes ahead of its records."""
    return tail.kind == "zeros" and tail.end == end


def damage_in_chain(data: bytes, start: int, base: int) -> bool:
    """Whether the records whose lengths chain from ``start`` in ``data`` (the last segment,
    based at commit log offset ``base``, from its first bad record on) were written whole and
    damaged since, not an append a crash cut short: the chain reaches an unreadable page (a
    header on one, or a record's bytes over one: a disk's latent sector error), or a record
    header at its own offset after the first bad record (bytes an append wrote after that
    record's, so that record was written whole: a bit flip, say). A torn append's chain ends
    in bytes never written (zeros, garbage), and an unreadable page past that is no record's.
    Blank fillers prove nothing: one is written apart from the records before it."""
    position = start
    while True:
        head = data[position:position + codec.HEAD_SIZE]
        if len(head) < codec.HEAD_SIZE or not any(head):
            return False  # the end of the segment, or zeros: nothing written here
        if unreadable_header(head):
            return True
        if position > start and _record_header_at(data, position, base + position):
            return True
        total, magic = codec.peek_length(data, position)
        if not (codec.is_record_magic(magic) or magic == codec.BLANK_MAGIC) or total < codec.HEAD_SIZE:
            return False  # no header: the chain ends
        if _UNREADABLE_SECTOR in data[position:position + total]:
            return True
        position += total


def _record_header_at(data: bytes, position: int, offset: int) -> bool:
    """Whether a record header written for commit log ``offset`` starts at ``position``
    (not a misdirected write's copy, whose own offset is another's)."""
    try:
        codec.decode_head(lambda at, length: data[position + at:position + at + length], offset)
    except codec.RecordError:
        return False
    return True


def damage_kind(data: bytes, start: int, end: int) -> str:
    """The ``Gap.kind`` of ``data[start:end]``, bytes that hold no intact record."""
    if _UNREADABLE_SECTOR in data[start:end]:
        return "unreadable"
    return "zeros" if data.count(0, start, end) == end - start else "damaged"


def next_intact(data: bytes, start: int, base: int) -> int:
    """Where the first intact record or blank filler at or after ``start`` begins in
    ``data`` (``len(data)`` if none does; a misdirected write's copy is neither). The C-level
    ``find`` for the magic keeps it fast over a whole segment."""
    for found in codec.magic_positions(data, start + 4):
        at = found - 4
        if codec.blank_length(data, at, base + at):
            return at
        try:
            codec.decode(data, at, base + at)
            return at
        except codec.RecordError:
            continue
    return len(data)

