"""The index: message ids and (topic, key) pairs to commit log offsets, on disk.

RocketMQ's IndexFile: hash tables in files under ``index/``, read with ``pread`` and written
with ``pwrite`` as records are dispatched, so memory holds a few fields per file however
many messages are indexed. Files are named by a sequence number (10 digits); each is::

    header   64 bytes: magic u32, version u16, 0 u16, slot count u32, entry capacity u32,
             entry count u32, lowest and highest commit log offset of its entries i64 (-1:
             none), the commit log offset through which records were indexed i64, zeros
    slots    slot count x u32: the number of the newest entry whose hash falls in the slot
             (entries are numbered from 1; 0: empty)
    entries  capacity x 20 bytes: key hash u64, commit log offset u64, the previous entry
             of the same slot u32 (0: end of the chain)

Big-endian. A key's hash is 8 bytes of blake2b over its kind (``i`` message id, ``k`` a key
of a topic), topic and key, never 0 (an unwritten entry). A lookup reads the key's slot in
every file, newest first, follows the chain and keeps offsets whose entry has the key's
hash. Different keys can share a hash, and after a crash entries can point past the
recovered commit log, so the store confirms each offset against the record there.

``add_many`` writes the entries of a batch of records with one ``pwrite`` per file and no
read: the slot table of the file taking entries is kept in memory (loaded with one
``pread`` when an existing file first takes entries), so the previous entry of a chain is
known without reading. The slots the batch changed are written back at checkpoints
(``persist``), a 4 KiB page of the table at a time, with the headers, after an fsync that
makes the entries they point to durable; then the files are fsync'd again, so even after
a power loss no slot or count on disk points at an entry that is not there. After a crash a header's entry count may lag and the slots may not yet point to
the newest entries: opening counts on over the non-zero entries after the header's count
and links each into its slot again, in order, which restores exactly the chains they were
written with (each entry holds its predecessor). The store drops and re-adds every entry
from its checkpoint on anyway, so only entries below it must be linked on disk, and the
checkpoint's ``persist`` wrote their slots.
A full file is followed by a new one, created complete and fsync'd before it is renamed
into place. Each file has a Bloom filter of its keys (``index_filter.py``), which a lookup
asks before it reads the file's slot: a key no file holds is read for in the ~0.8 % of
files whose filter lets it through, however many files the retained log has. The index
is derived data: unreadable files are deleted and the store rebuilds it from the commit
log.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import logging
import struct
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

from .files import make_directories
from .filesystem import REAL, FileSystem
from .index_filter import SUFFIX, FilterFileError, KeyFilter, filter_path, probe

log = logging.getLogger(__name__)

MAGIC = 0x484D4958  # "HMIX"
VERSION = 1
_HEADER = struct.Struct(">IHHIIIqqq")
HEADER_SIZE = 64
_SLOT = struct.Struct(">I")
_ENTRY = struct.Struct(">QQI")
ENTRY_SIZE = _ENTRY.size  # 20
_COUNT_CHUNK = 4096  # entries read per pread when counting entries past the header's count
_SLOT_PAGE = 4096  # slot table bytes written back together
#: The newest file's filter is written at a checkpoint once this fraction of its room was
#: added since it last was (a crash costs the next open the keys of at most that many).
FILTER_WRITES = 8


class IndexFileError(ValueError):
    """An index file whose header is not one this version wrote."""


def key_hash(kind: str, topic: str, key: str) -> int:
    """The 64-bit hash of a key (``kind`` ``i``: a message id, topic ``""``; ``k``: a key)."""
    digest = hashlib.blake2b(f"{kind}{len(topic)}:{topic}{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def salvaged_id(message_id: str | None, own: Collection[int],
                held_elsewhere: Callable[[str], bool] | None = None) -> str | None:
    """The id a damaged record's salvaged header says (``message_id``) if it names the record,
    by what the record's own index entries (``own``: the hashes of those at its offset) say.
    Its id entry is written before its keys', so any of its entries that reached the disk
    holds the id: entries holding others but not it deny it (a flipped bit made the header
    say another message's id; naming that would have the wrong message resent, or one not
    sent yet stand as lost), entries holding it confirm it. With none left, the id names the
    record unless ``held_elsewhere`` (if asked) says intact records elsewhere hold it.
    Recovery's cut-off tail, fsck and the scrub all name records by this rule."""
    if message_id is None:
        return None
    if own:
        return message_id if key_hash("i", "", message_id) in own else None
    return None if held_elsewhere is not None and held_elsewhere(message_id) else message_id


def _write(fs: FileSystem, fd: int, data: bytes | memoryview, position: int) -> None:
    if fs.pwrite(fd, data, position) != len(data):
        raise OSError(errno.ENOSPC, "short write")


class IndexFile:
    """One file of the index: its header fields in memory, slots and entries on disk."""

    def __init__(self, path: Path, fd: int, slots: int, capacity: int, fs: FileSystem = REAL) -> None:
        self.path = path
        self.fd = fd
        self.fs = fs
        self.slots = slots
        self.capacity = capacity
        self.count = 0
        self.low_offset = -1
        self.high_offset = -1
        self.indexed_through = -1
        #: The slot table as on disk (big-endian u32s) while the file takes entries or has
        #: slots not yet written back; None: slots are read from the file.
        self._table: bytearray | None = None
        #: Pages of ``_table`` (by number) changed since they were last written back.
        self.dirty_pages: set[int] = set()
        #: The keys of its entries (``MessageIndex`` sets it); None: look up without one.
        self.filter: KeyFilter | None = None

    @classmethod
    def create(cls, path: Path, slots: int, capacity: int, indexed_through: int,
               fs: FileSystem = REAL) -> IndexFile:
        """A new, empty file (sparse), durable under its name before it is used."""
        tmp = path.with_name(path.name + ".tmp")
        fd = fs.open(tmp, create=True, truncate=True)
        try:
            fs.ftruncate(fd, HEADER_SIZE + 4 * slots + ENTRY_SIZE * capacity)
            file = cls(path, fd, slots, capacity, fs)
            file.indexed_through = indexed_through
            file._table = bytearray(4 * slots)  # the sparse file's slots: all zero
            file.write_header()
            fs.fsync(fd)
            fs.replace(tmp, path)
            fs.fsync_directory(path.parent)
        except OSError:
            fs.close(fd)
            fs.unlink(tmp, missing_ok=True)
            raise
        return file

    @classmethod
    def open(cls, path: Path, fs: FileSystem = REAL) -> IndexFile:
        """An existing file; ``IndexFileError`` if its header is not valid."""
        fd = fs.open(path)
        try:
            raw = fs.pread(fd, _HEADER.size, 0)
            if len(raw) < _HEADER.size:
                raise IndexFileError("short header")
            magic, version, _, slots, capacity, count, low, high, through = _HEADER.unpack(raw)
            if magic != MAGIC or version != VERSION:
                raise IndexFileError(f"bad magic {magic:#x} or version {version}")
            size = HEADER_SIZE + 4 * slots + ENTRY_SIZE * capacity
            if not slots or not capacity or count > capacity or fs.fsize(fd) != size:
                raise IndexFileError("sizes do not match the header")
            file = cls(path, fd, slots, capacity, fs)
            file.count, file.low_offset, file.high_offset, file.indexed_through = count, low, high, through
            file._count_unheaded_entries()
        except BaseException:
            fs.close(fd)
            raise
        return file

    def _count_unheaded_entries(self) -> None:
        """Count the entries written after the header was (a crash between checkpoints) and
        link each into its slot, which may not have been written back. The count stops at
        the first entry that is not the next link of its slot's chain: past a power loss
        the entries there may be of several lives of the file (a dropped write, then the
        same numbers written again), and an entry of an older life would link its slot
        past newer entries, which lookups would then never find."""
        while self.count < self.capacity:
            chunk = min(_COUNT_CHUNK, self.capacity - self.count)
            raw = self.fs.pread(self.fd, chunk * ENTRY_SIZE, self._entry_position(self.count + 1))
            for hash_, offset, previous in _ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY_SIZE]):
                if not hash_ or previous != self._head_as_of_count(hash_ % self.slots):
                    return
                self._counted(offset)
                self._set_slot(hash_ % self.slots, self.count)
            if len(raw) < chunk * ENTRY_SIZE:
                return

    def _head_as_of_count(self, slot: int) -> int:
        """The newest counted entry of ``slot`` (-1: unknown). Its slot on disk may point past
        the count (a checkpoint's slot pages kept, its header lost), at entries the
        checkpoint made durable first: their chain leads back to it."""
        number = self._slot(slot)
        while number > self.count:
            hash_, _, previous = self._entry(number)
            if not hash_ or previous >= number:
                return -1
            number = previous
        return number

    def _counted(self, offset: int) -> None:
        self.count += 1
        self.low_offset = offset if self.low_offset < 0 else min(self.low_offset, offset)
        self.high_offset = max(self.high_offset, offset)

    def _entry(self, number: int) -> tuple[int, int, int]:
        """``(hash, offset, previous)`` of entry ``number`` (counted from 1)."""
        return _ENTRY.unpack(self.fs.pread(self.fd, ENTRY_SIZE, self._entry_position(number)))  # type: ignore[no-any-return]

    def _entry_position(self, number: int) -> int:
        return HEADER_SIZE + 4 * self.slots + ENTRY_SIZE * (number - 1)

    def _slot(self, slot: int) -> int:
        table = self._table
        if table is not None:
            return int(_SLOT.unpack_from(table, 4 * slot)[0])
        raw = self.fs.pread(self.fd, 4, HEADER_SIZE + 4 * slot)
        return _SLOT.unpack(raw)[0] if len(raw) == 4 else 0

    def _loaded_table(self) -> bytearray:
        """The slot table in memory, read from the file the first time."""
        if self._table is None:
            table = bytearray(4 * self.slots)  # read in place: no 4 MiB copies to fragment the heap
            self.fs.preadinto(self.fd, table, HEADER_SIZE)
            self._table = table
        return self._table

    def _set_slot(self, slot: int, number: int) -> None:
        _SLOT.pack_into(self._loaded_table(), 4 * slot, number)
        self.dirty_pages.add(4 * slot // _SLOT_PAGE)

    def add(self, entries: list[tuple[int, int]]) -> None:
        """Append entries ``(hash, commit log offset)``, in commit log order, with one
        ``pwrite`` and link them into their slots in memory (the caller leaves room:
        ``len(entries) <= capacity - count``; ``write_slots`` writes the slots back)."""
        table = self._loaded_table()
        first = self.count + 1
        heads: dict[int, int] = {}
        packed = []
        for number, (hash_, offset) in enumerate(entries, first):
            slot = hash_ % self.slots
            previous = heads.get(slot)
            if previous is None:
                previous = _SLOT.unpack_from(table, 4 * slot)[0]
            packed.append(_ENTRY.pack(hash_, offset, previous))
            heads[slot] = number
        _write(self.fs, self.fd, b"".join(packed), self._entry_position(first))
        if self.filter is not None:
            self.filter.add(entries)
        self.count += len(entries)  # before the slots: a slot never points past the count
        low = entries[0][1]
        self.low_offset = low if self.low_offset < 0 else min(self.low_offset, low)
        self.high_offset = max(self.high_offset, entries[-1][1])
        pack_into, dirty = _SLOT.pack_into, self.dirty_pages
        for slot, number in heads.items():
            pack_into(table, 4 * slot, number)
            dirty.add(4 * slot // _SLOT_PAGE)

    def write_slots(self, pages: Iterable[int]) -> None:
        """Write back the slot table's ``pages`` (not fsync'd), adjacent pages together."""
        table = self._table
        if table is None:
            return
        with memoryview(table) as view:  # written from the table itself, no copy
            for first, end in consecutive_runs(sorted(pages)):
                start = first * _SLOT_PAGE
                _write(self.fs, self.fd, view[start : end * _SLOT_PAGE], HEADER_SIZE + start)

    def release_table(self) -> None:
        """Forget the slot table once it is written back (the file takes no more entries)."""
        if not self.dirty_pages:
            self._table = None

    def lookup(self, hash_: int) -> list[int]:
        """Commit log offsets of the entries with ``hash_``, newest first."""
        found = []
        number = self._slot(hash_ % self.slots)
        while 0 < number <= self.count:
            entry_hash, offset, previous = self._entry(number)
            if entry_hash == hash_:
                found.append(offset)
            if previous >= number:
                break  # not a chain (a damaged file): stop rather than loop
            number = previous
        return found

    def tail(self, start: int) -> list[tuple[int, int, int, int]]:
        """``(number, hash, offset, previous)`` of the newest entries pointing at commit log
        offset ``start`` or beyond, newest first (entries are in commit log order, so these
        are the records dispatched from ``start`` on; an older entry past ``start``, left by
        an earlier crash, is not among them)."""
        found = []
        for number in range(self.count, 0, -1):
            hash_, offset, previous = self._entry(number)
            if offset < start:
                break
            found.append((number, hash_, offset, previous))
        return found

    def hashes_at(self, offset: int) -> set[int]:
        """The hashes of the entries pointing at commit log ``offset``: a binary search by
        offset (entries are in commit log order), then the neighbours with the same one.
        Past a ``rewind`` the replayed entries repeat offsets, and a search there may find
        none (as for a record never indexed)."""
        first = bisect.bisect_left(range(1, self.count + 1), offset, key=lambda number: self._entry(number)[1])
        found = set()
        for number in range(first + 1, self.count + 1):
            hash_, at, _ = self._entry(number)
            if at != offset:
                break
            found.add(hash_)
        return found

    def entries(self) -> list[tuple[int, int]]:
        """``(hash, commit log offset)`` of every entry, oldest first."""
        return [(hash_, offset) for hash_, offset, _ in self._each_entry()]

    def completed_filter(self, kept: KeyFilter | None) -> KeyFilter:
        """A filter in memory of the keys of its entries: ``kept`` (covering the first
        ``kept.covered``) with the keys of the entries after those, or a new one with all
        (read a chunk at a time)."""
        built = kept if kept is not None else KeyFilter.empty(self.capacity)
        built.add((hash_, offset) for hash_, offset, _ in self._each_entry(built.covered + 1))
        return built

    def _each_entry(self, start: int = 1) -> Iterator[tuple[int, int, int]]:
        for first in range(start, self.count + 1, _COUNT_CHUNK):
            raw = self.fs.pread(self.fd, min(_COUNT_CHUNK, self.count + 1 - first) * ENTRY_SIZE, self._entry_position(first))
            yield from _ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY_SIZE])

    def drop_tail(self, start: int) -> list[tuple[int, int]]:
        """Remove the ``tail`` entries from ``start`` on, unlinking them from their slots;
        returns their ``(hash, offset)``. Slots and header are made durable before the
        entries are zeroed, so no slot on disk ever points at a zeroed entry."""
        dropped = self.tail(start)
        if not dropped:
            return []
        for number, hash_, _, previous in dropped:  # newest first
            slot = hash_ % self.slots
            if self._slot(slot) == number:
                self._set_slot(slot, previous)
        self.count = dropped[-1][0] - 1
        pages, self.dirty_pages = self.dirty_pages, set()
        self.write_slots(pages)
        self.write_header()
        self.fs.fsync(self.fd)
        _write(self.fs, self.fd, bytes(ENTRY_SIZE * len(dropped)), self._entry_position(self.count + 1))
        self.fs.fsync(self.fd)
        return [(hash_, offset) for _, hash_, offset, _ in dropped]

    def write_header(self) -> None:
        """Write the in-memory header fields (not fsync'd)."""
        header = _HEADER.pack(
            MAGIC, VERSION, 0, self.slots, self.capacity, self.count,
            self.low_offset, self.high_offset, self.indexed_through,
        )
        _write(self.fs, self.fd, header.ljust(HEADER_SIZE, b"\0"), 0)

    def close(self) -> None:
        """Close the file descriptor and the filter."""
        if self.filter is not None:
            self.filter.close()
        self.fs.close(self.fd)


def consecutive_runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Ascending ``numbers`` as ``(first, end)`` runs of consecutive ones (``end`` excluded)."""
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number:
            runs[-1] = (runs[-1][0], number + 1)
        else:
            runs.append((number, number + 1))
    return runs


#: What ``MessageIndex.unpersisted`` hands to ``persist``: each file with its slot pages.
Unpersisted = list[tuple[IndexFile, set[int]]]
#: A record as the index takes it: topic, message id, keys, commit log offset.
IndexedRecord = tuple[str, "str | None", list[str], int]


class MessageIndex:
    """Message id -> offsets and (topic, key) -> offsets, in index files under ``directory``;
    new files get ``slots`` hash slots and room for ``entries`` entries."""

    def __init__(self, directory: Path, slots: int, entries: int, fs: FileSystem = REAL) -> None:
        self.directory = directory
        self.slots = slots
        self.capacity = entries
        self.fs = fs
        make_directories(directory, fs)
        self._lock = threading.Lock()  # lookups against deleting and closing files
        #: A full file's filter written as it is sealed, against a checkpoint's write of it.
        self._filter_writes = threading.Lock()
        self._stale_headers: set[IndexFile] = set()
        self.files = self._open_files()
        self.max_indexed = self.files[-1].indexed_through if self.files else -1
        #: The first record an add failed to index (disk full): the store's checkpoint
        #: stays below it, so the next open indexes it again.
        self.failed_from: int | None = None
        if not self.files:
            self.files.append(self._create(0))

    def _open_files(self) -> list[IndexFile]:
        names = self.fs.listdir(self.directory)
        for leftover in [*(name for name in names if name.endswith(".tmp")), "index.log"]:
            self.fs.unlink(self.directory / leftover, missing_ok=True)  # an interrupted roll; the old line format
        paths = sorted(self.directory / name for name in names if name.isdigit())
        files: list[IndexFile] = []
        try:
            for path in paths:
                files.append(IndexFile.open(path, self.fs))
                if int(path.name) != int(paths[0].name) + len(files) - 1:
                    raise IndexFileError(f"the files before {path.name} are missing")
        except (OSError, IndexFileError) as exc:
            log.warning("index file %s is unreadable (%s); rebuilding the index", path, exc)
            self._delete(files)
            return []
        for name in names:  # the filters of deleted files (a crash between the two unlinks)
            if name.endswith(SUFFIX) and self.directory / name.removesuffix(SUFFIX) not in paths:
                self.fs.unlink(self.directory / name)
        for file in files[:-1]:
            file.filter = self._mapped_filter(file)
        if unfiltered := [file.path.name for file in files[:-1] if file.filter is None]:
            log.info("%d index files (%s to %s) have no filter (an older version wrote them, or theirs was "
                     "not usable): their lookups read them until retention deletes them",
                     len(unfiltered), unfiltered[0], unfiltered[-1])
        if files:
            files[-1].filter = self._newest_filter(files[-1])
        return files

    def _newest_filter(self, file: IndexFile) -> KeyFilter:
        """The newest file's filter in memory: the one a checkpoint or the clean close wrote,
        with the keys of the entries written since, else one built from all its entries.
        The written one is deleted once read: what this run drops or adds is not in it."""
        path = filter_path(file.path)
        try:
            kept = KeyFilter.open(file.path, file.capacity, file.count, file.low_offset, self.fs, in_memory=True)
        except FileNotFoundError:
            return file.completed_filter(None)
        except (OSError, FilterFileError) as exc:
            log.info("index file %s: its filter is built again (%s)", file.path.name, exc)
            kept = None
        self.fs.unlink(path)
        self.fs.fsync_directory(self.directory)
        completed = file.completed_filter(kept)
        completed.covered = 0  # its file is gone
        return completed

    def _mapped_filter(self, file: IndexFile) -> KeyFilter | None:
        """The filter a full file's filter file holds; None (looked up without one) if it has
        none or another's."""
        try:
            return KeyFilter.open(file.path, file.capacity, file.count, file.low_offset, self.fs)
        except FileNotFoundError:
            pass
        except (OSError, FilterFileError) as exc:
            log.warning("the filter of index file %s is not used (%s): its lookups read it", file.path.name, exc)
        return None

    def _seal(self, file: IndexFile) -> None:
        """Write the filter of a full file and map it (the one in memory is dropped; a file
        whose filter cannot be written is looked up without one)."""
        with self._filter_writes:
            if file.filter is None:
                return
            try:
                file.filter.write(file.path, file.count, file.low_offset, self.fs)
            except OSError:
                log.exception("cannot write the filter of index file %s: its lookups read it", file.path.name)
                file.filter = None
                return
            file.filter = self._mapped_filter(file)

    def _delete(self, files: list[IndexFile]) -> None:
        for file in files:
            file.close()
        for name in self.fs.listdir(self.directory):
            if name.isdigit() or name.endswith(SUFFIX):
                self.fs.unlink(self.directory / name)

    def clear(self) -> None:
        """Delete every file and start anew (the store then indexes the whole log again)."""
        with self._lock:
            self._delete(self.files)
            self._stale_headers.clear()
            self.max_indexed = -1
            self.files = [self._create(0)]

    @property
    def file_numbers(self) -> tuple[int, int]:
        """The numbers of the oldest and the newest index file."""
        return int(self.files[0].path.name), int(self.files[-1].path.name)

    def _create(self, number: int, indexed_through: int | None = None) -> IndexFile:
        file = IndexFile.create(
            self.directory / f"{number:010d}", self.slots, self.capacity,
            self.max_indexed if indexed_through is None else indexed_through, self.fs,
        )
        file.filter = KeyFilter.empty(self.capacity)
        return file

    def rewind(self, offset: int) -> None:
        """Index records from ``offset`` on again when they are re-added (recovery replays
        them from the checkpoint; entries already there are duplicates lookups drop)."""
        self.max_indexed = min(self.max_indexed, offset - 1)

    def add(self, topic: str, message_id: str | None, keys: list[str], offset: int) -> None:
        """Index one record (see ``add_many``)."""
        self.add_many([(topic, message_id, keys, offset)])

    def add_many(self, records: Iterable[IndexedRecord]) -> None:
        """Index records ``(topic, message id, keys, commit log offset)`` in commit log order
        with one ``pwrite`` per file (idempotent: a replayed record is not indexed twice)."""
        entries: list[tuple[int, int]] = []
        for topic, message_id, keys, offset in records:
            if offset <= self.max_indexed:
                continue
            self.max_indexed = offset
            if message_id:
                entries.append((key_hash("i", "", message_id), offset))
            if keys:
                entries += [(key_hash("k", topic, key), offset) for key in dict.fromkeys(keys)]
        try:
            while entries:
                file = self.files[-1]
                if file.count == file.capacity:
                    self._seal(file)
                    file = self._create(int(file.path.name) + 1, entries[0][1])
                    self.files.append(file)
                room = file.capacity - file.count
                file.add(entries[:room])
                self._stale_headers.add(file)
                entries = entries[room:]
        except OSError:
            if self.failed_from is None:
                log.exception("cannot index the record at commit log offset %d", entries[0][1])
                self.failed_from = entries[0][1]

    def drop_tail(self, start: int) -> list[tuple[int, int]]:
        """Remove the newest entries pointing at commit log offset ``start`` or beyond
        (recovery indexes the records it keeps there again); returns their ``(hash,
        offset)``, newest first: what the index knew of the records dispatched from
        ``start`` on."""
        dropped: list[tuple[int, int]] = []
        with self._lock:
            for file in reversed(self.files):
                dropped += file.drop_tail(start)
                if file is not self.files[-1]:
                    file.release_table()
                if file.count:
                    break
        self.max_indexed = min(self.max_indexed, start - 1)
        return dropped

    def lookup_id(self, message_id: str) -> list[int]:
        """Candidate offsets of a message id, in commit log order."""
        return self.lookup_hash(key_hash("i", "", message_id))

    def lookup_key(self, topic: str, key: str) -> list[int]:
        """Candidate offsets of a key of a topic, in commit log order."""
        return self.lookup_hash(key_hash("k", topic, key))

    def lookup_hash(self, hash_: int) -> list[int]:
        """Candidate offsets of a ``key_hash``, in commit log order."""
        found: set[int] = set()
        with self._lock:
            tested = probe(hash_)
            for file in reversed(self.files):
                if file.filter is None or file.filter.passes(tested):
                    found.update(file.lookup(hash_))
        return sorted(found)

    def hashes_at(self, offset: int) -> set[int]:
        """The hashes of the entries of the record at commit log ``offset`` (for
        ``salvaged_id``)."""
        with self._lock:
            return {hash_ for file in self.files if file.low_offset <= offset <= file.high_offset
                    for hash_ in file.hashes_at(offset)}

    def delete_below(self, commit_log_min: int) -> int:
        """Delete the oldest files whose entries all point below ``commit_log_min`` (never
        the newest); returns how many."""
        deleted = 0
        with self._lock:
            while len(self.files) > 1 and self.files[0].high_offset < commit_log_min:
                file = self.files.pop(0)
                self._stale_headers.discard(file)
                file.close()
                self.fs.unlink(filter_path(file.path), missing_ok=True)
                self.fs.unlink(file.path)
                deleted += 1
        return deleted

    def unpersisted(self) -> Unpersisted:
        """The files whose header or slots are behind, with the slot pages to write (call
        while no record is added; write them with ``persist`` while records are added)."""
        stale, self._stale_headers = self._stale_headers, set()
        stale.update(file for file in self.files if file.dirty_pages)
        newest = self.files[-1]
        if newest.indexed_through != self.max_indexed:
            stale.add(newest)  # the newest file carries ``max_indexed``
        unpersisted: Unpersisted = []
        for file in sorted(stale, key=lambda file: file.path):  # a deterministic order
            pages, file.dirty_pages = file.dirty_pages, set()
            unpersisted.append((file, pages))
        return unpersisted

    def persist(self, files: Unpersisted) -> None:
        """Make the entries of ``files`` durable, then write their slot pages and headers and
        fsync again (no slot or count on disk points at an entry that is not); a file that
        takes no more entries then forgets its slot table."""
        for file, pages in files:
            durable = file.count  # entries written before the fsync
            self.fs.fsync(file.fd)
            file.write_slots(pages)
            if file is self.files[-1]:
                file.indexed_through = self.max_indexed
            file.write_header()
            self.fs.fsync(file.fd)
            if file is not self.files[-1]:
                file.release_table()
            elif file.filter is not None and durable - file.filter.covered >= max(1, file.capacity // FILTER_WRITES):
                self._write_newest_filter(file, durable)

    def restore(self, files: Unpersisted) -> None:
        """Take back files whose ``persist`` failed, to retry at the next checkpoint."""
        for file, pages in files:
            if file in self.files:
                self._stale_headers.add(file)
                file.dirty_pages |= pages

    def _write_newest_filter(self, file: IndexFile, covered: int) -> None:
        """Write the newest file's filter as covering its first ``covered`` entries (durable
        ones), for the next open to start from (a failure costs that open a longer build)."""
        with self._filter_writes:
            kept = file.filter
            if kept is None or kept.mapped or file is not self.files[-1]:
                return  # sealed meanwhile: its whole filter is written
            try:
                kept.write(file.path, covered, file.low_offset, self.fs)
            except OSError:
                log.exception("cannot write the filter of index file %s: the next open builds it", file.path.name)
                return
            kept.covered = covered

    def close(self) -> None:
        """Close every file (``persist`` first to keep what was added), writing the newest
        file's filter for the next open."""
        with self._lock:
            newest = self.files[-1] if self.files else None
            if newest is not None and newest.filter is not None:
                self._write_newest_filter(newest, newest.count)
            for file in self.files:
                file.close()
            self.files = []

