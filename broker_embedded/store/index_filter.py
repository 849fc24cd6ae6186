"""The index's key filters: per index file, a Bloom filter of the key hashes it holds.

A lookup of a key no file holds (the usual one: is this new transaction's id an ended
transaction's?) would read a slot and a hash chain in every index file, so the reads of
each new transaction would grow with the retained log. A lookup asks each file's filter
first and reads the slots and chains of the files whose filter may hold the key only.

The filter is blocked: a key sets three bits of one 64-bit word, chosen by its hash, so a
probe touches one word. ``BITS_PER_ENTRY`` bits per entry a file has room for let ~0.8 %
of absent keys through a full file's filter (five bits: 0.4 %, but adding a key costs a
third more, on every record's way to the index); a filter never misses a key added to it.
The file taking entries keeps its filter in memory and adds its entries' keys to it; a
full file's filter is written next to it before the next file is created, and read from
then on through a read-only memory map (the kernel keeps the probed pages, nothing grows
in the process's heap). The newest file's filter is also written at checkpoints, once an
eighth of the file's room was added since the last time, and at a clean close; the next
open reads it back (then deletes it: what that run drops or adds is not in it) and adds
the keys of the entries written after it (~0.6 s per million entries). A filter file
``<index file number>.filter`` is::

    header 32 bytes: magic u32, version u16, 0 u16, word count u32, entries covered u32,
           the index file's lowest commit log offset i64, CRC32C of the words u32, zeros
    words  word count x u64, little-endian

Big-endian header. A filter file that does not match its index file (words, lowest
offset, CRC; a full file's covering fewer entries than the file has, the newest file's
more) is not used: a full file is then looked up without a filter, as are the files of a
version that wrote none, and the newest file's is built again from its entries.
"""

from __future__ import annotations

import mmap
import struct
import sys
from array import array
from collections.abc import Iterable
from pathlib import Path

import crc32c

from .files import write_atomically
from .filesystem import FileSystem

MAGIC = 0x484D4946  # "HMIF"
VERSION = 1
_HEADER = struct.Struct(">IHHIIqI")
HEADER_SIZE = 32
BITS_PER_ENTRY = 16
SUFFIX = ".filter"


class FilterFileError(ValueError):
    """A filter file that is not the one of its index file."""


def words_for(capacity: int) -> int:
    """The words of the filter of an index file with room for ``capacity`` entries."""
    return max(1, capacity * BITS_PER_ENTRY // 64)


_BITS = [1 << bit for bit in range(64)]


def _mask(hash_: int) -> int:
    """The bits a key sets in its word: three 6-bit fields of the hash's low 18 bits (its
    word is chosen by the bits above 32)."""
    low = hash_ & 0x3FFFF  # one digit of a Python int: cheaper to shift than the whole hash
    return _BITS[low & 63] | _BITS[low >> 6 & 63] | _BITS[low >> 12]


#: A key hash as the filters test it: the bits that choose its word, and its mask there.
Probe = tuple[int, int]


def probe(hash_: int) -> Probe:
    """What ``KeyFilter.passes`` tests of a hash, computed once for every file's filter."""
    return hash_ >> 32, _mask(hash_)


class KeyFilter:
    """The filter of one index file: in memory while the file takes entries (``empty``),
    memory-mapped from its filter file once full (``open``)."""

    def __init__(self, words: array[int] | memoryview, mapped: mmap.mmap | None = None, covered: int = 0) -> None:
        self._words = words
        self._count = len(words)
        self._mapped = mapped
        #: The entries of its index file it held when it was written (read from its file).
        self.covered = covered

    @property
    def mapped(self) -> bool:
        """Whether it is read from its file (a full index file's), not held in memory."""
        return self._mapped is not None

    @classmethod
    def empty(cls, capacity: int) -> KeyFilter:
        """A filter holding no key, for an index file with room for ``capacity`` entries."""
        return cls(array("Q", [0]) * words_for(capacity))

    def add(self, entries: Iterable[tuple[int, int]]) -> None:
        """Add the key hashes of index entries ``(hash, commit log offset)`` (a filter in
        memory only)."""
        words, count, mask = self._words, self._count, _mask
        for hash_, _ in entries:
            words[(hash_ >> 32) % count] |= mask(hash_)

    def passes(self, probe: Probe) -> bool:
        """False if no key of the ``probe``'s hash was added; True for every added one (and
        a few others)."""
        high, mask = probe
        return self._words[high % self._count] & mask == mask

    def may_contain(self, hash_: int) -> bool:
        """``passes`` for one hash."""
        return self.passes(probe(hash_))

    def write(self, path: Path, covered: int, low_offset: int, fs: FileSystem) -> None:
        """Write the filter of the index file at ``path`` (holding ``covered`` entries from
        commit log offset ``low_offset`` on), durable under its name."""
        words = array("Q", self._words)
        if sys.byteorder != "little":
            words.byteswap()
        body = words.tobytes()
        header = _HEADER.pack(MAGIC, VERSION, 0, len(words), covered, low_offset, crc32c.crc32c(body))
        write_atomically(filter_path(path), header.ljust(HEADER_SIZE, b"\0") + body, fs)

    @classmethod
    def open(cls, path: Path, capacity: int, count: int, low_offset: int, fs: FileSystem,
             *, in_memory: bool = False) -> KeyFilter:
        """The filter of the index file at ``path`` (room for ``capacity`` entries, ``count``
        of them there, the lowest at ``low_offset``), mapped (it must cover them all), or
        read into memory to take more keys (``in_memory``: the newest file's, covering its
        first ``covered`` entries, those durable when it was written); ``FilterFileError``
        if it is not that file's, ``FileNotFoundError`` if it has none."""
        fd = fs.open(filter_path(path), read_only=True)
        try:
            size = fs.fsize(fd)
            if size < HEADER_SIZE:
                raise FilterFileError("short header")
            mapped = fs.map_read(fd, size)
        finally:
            fs.close(fd)
        try:
            magic, version, _, words, covered, low, crc = _HEADER.unpack_from(mapped)
            if magic != MAGIC or version != VERSION:
                raise FilterFileError(f"bad magic {magic:#x} or version {version}")
            if words != words_for(capacity) or size != HEADER_SIZE + 8 * words:
                raise FilterFileError(f"{words} words in {size} bytes, not the {words_for(capacity)} of its file")
            if (covered > count if in_memory else covered < count) or low != low_offset:
                raise FilterFileError(f"it covers {covered} entries from commit log offset {low}, "
                                      f"its file has {count} from {low_offset}")
            copied = array("Q")
            with memoryview(mapped) as whole, whole[HEADER_SIZE:] as body:
                if crc32c.crc32c(body) != crc:
                    raise FilterFileError("its words do not match their CRC")
                if sys.byteorder == "little" and not in_memory:
                    return cls(body.cast("Q"), mapped, covered)  # a view of its own: the map stays open
                copied.frombytes(body)
        except BaseException:
            mapped.close()
            raise
        mapped.close()
        if sys.byteorder != "little":
            copied.byteswap()
        return cls(copied, covered=covered)

    def close(self) -> None:
        """Release the memory map (a filter in memory: nothing to do)."""
        if self._mapped is not None:
            words, self._words = self._words, array("Q", [0])
            assert isinstance(words, memoryview)
            words.release()  # the map's only export: it can close
            self._mapped.close()
            self._mapped = None


def filter_path(index_path: Path) -> Path:
    """The filter file of the index file at ``index_path``."""
    return index_path.with_name(index_path.name + SUFFIX)
