"""The commit log's record format: encode, decode and verify one record.

Layout (big-endian), RocketMQ's fields in a compact order::

    total_length u32   length of the whole record, this field included
    magic        u32   RECORD_MAGIC, LEGACY_MAGIC (the format before the record's own offset),
                       or BLANK_MAGIC for the filler at a segment's end
    crc          u32   crc32c of every byte after this field (a blank's: ``blank_tag``)
    commit_log_offset u64   where the record was written (RocketMQ's PHYSICALOFFSET);
                       not in LEGACY_MAGIC records
    queue_id     u32
    flags        u32
    queue_offset u64
    born_ms      u64
    store_ms     u64
    topic_len    u16   then the topic, UTF-8
    props_len    u32   then the properties, msgpack map of str -> str
    body_len     u32   then the body

The record's own offset, under its crc, tells an intact record read where it was written
from an intact copy of it somewhere else (a misdirected write): such a copy does not decode
(``RecordError``), as damage; a blank filler's tag does the same for it. Records and fillers
of the legacy format, written before, are read as they were; the store writes only the
current one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import crc32c
import msgspec

from .record import StoredRecord

RECORD_MAGIC = 0xDAA320A8
LEGACY_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
_HEAD = struct.Struct(">III")  # total_length, magic, crc
_OFFSET = struct.Struct(">Q")  # commit_log_offset, in RECORD_MAGIC records
_FIXED = struct.Struct(">IIQQQH")  # queue_id, flags, queue_offset, born, store, topic_len
_PLACED_FIXED = struct.Struct(">QIIQQQH")  # commit_log_offset, then _FIXED's
_U32 = struct.Struct(">I")
HEAD_SIZE = _HEAD.size
#: The smallest record of either format (a legacy one; the current one is 8 bytes longer).
MIN_RECORD_SIZE = _HEAD.size + _FIXED.size + 2 * _U32.size
_FIXED_AT = {RECORD_MAGIC: HEAD_SIZE + _OFFSET.size, LEGACY_MAGIC: HEAD_SIZE}  # where _FIXED starts
#: What ``seal`` puts before a record's ``encode``d fields.
SEAL_SIZE = _FIXED_AT[RECORD_MAGIC]
_PLACED_MIN = MIN_RECORD_SIZE + _OFFSET.size  # the smallest record of the current format
_MAGIC_BYTES = tuple(magic.to_bytes(4, "big") for magic in (*_FIXED_AT, BLANK_MAGIC))
_PEEK_SIZE = 512  # bytes read first by decode_head: the header, topic and properties mostly
_SALVAGE_PROPERTIES = 64 * 1024  # the most property bytes decode_head reads from a damaged record

_encode_props = msgspec.msgpack.Encoder().encode
_decode_props = msgspec.msgpack.Decoder(dict[str, str]).decode


class RecordError(ValueError):
    """The bytes at an offset are not a complete, intact record."""


class RecordHead(NamedTuple):
    """What a record's header says about it, its body unread."""

    topic: str
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    size: int


def encode(
    topic: str,
    queue_id: int,
    queue_offset: int,
    flags: int,
    born_ms: int,
    store_ms: int,
    properties: Mapping[str, str],
    body: bytes,
) -> bytes:
    """A record's fields, from its queue id on: ``seal`` makes them a record at an offset
    (``SEAL_SIZE`` bytes more)."""
    topic_bytes = topic.encode()
    props = _encode_props(properties if type(properties) is dict else dict(properties)) if properties else b""
    return b"".join(
        (
            _FIXED.pack(queue_id, flags, queue_offset, born_ms, store_ms, len(topic_bytes)),
            topic_bytes,
            _U32.pack(len(props)),
            props,
            _U32.pack(len(body)),
            body,
        )
    )


def seal(fields: bytes, commit_log_offset: int) -> bytes:
    """The record of ``encode``d ``fields`` written at ``commit_log_offset``: its length,
    magic, crc and offset before them (the crc over the offset and the fields, computed
    without joining them first)."""
    offset = _OFFSET.pack(commit_log_offset)
    crc = crc32c.crc32c(fields, crc32c.crc32c(offset))
    return b"".join((_HEAD.pack(SEAL_SIZE + len(fields), RECORD_MAGIC, crc), offset, fields))


def encode_blank(length: int, commit_log_offset: int) -> bytes:
    """Filler of ``length`` bytes at ``commit_log_offset``: it closes a segment whose
    remaining space cannot hold the next record, and ``repair`` puts it where damaged bytes
    were. Its crc field holds ``blank_tag`` of its place and length (a misdirected write's
    copy of it is no filler where it lands). Under ``HEAD_SIZE`` bytes it is plain zeros,
    valid only at the end of a segment."""
    if length < HEAD_SIZE:
        return b"\0" * length
    return _HEAD.pack(length, BLANK_MAGIC, blank_tag(commit_log_offset, length)) + b"\0" * (length - HEAD_SIZE)


def blank_tag(commit_log_offset: int, length: int) -> int:
    """What the crc field of a blank filler at ``commit_log_offset`` holds (0 in the legacy
    format, which is read anywhere)."""
    return crc32c.crc32c(_OFFSET.pack(commit_log_offset) + _U32.pack(length))


def blank_length(buf: bytes, pos: int, commit_log_offset: int) -> int:
    """The length of the intact blank filler at ``pos`` of ``buf``, read at
    ``commit_log_offset`` (magic, length within ``buf``, the tag of this place or none,
    zeros after it), or 0 if there is none."""
    if len(buf) - pos < HEAD_SIZE:
        return 0
    total, magic, crc = _HEAD.unpack_from(buf, pos)
    if magic != BLANK_MAGIC or not HEAD_SIZE <= total <= len(buf) - pos \
            or crc not in (0, blank_tag(commit_log_offset, total)):
        return 0
    zeros = total - HEAD_SIZE
    return total if buf.count(0, pos + HEAD_SIZE, pos + total) == zeros else 0


def peek_length(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(total_length, magic)`` of the record at ``pos``; (0, 0) when fewer bytes remain."""
    if len(buf) - pos < HEAD_SIZE:
        return 0, 0
    total, magic, _ = _HEAD.unpack_from(buf, pos)
    return total, magic


def is_record_magic(magic: int) -> bool:
    """Whether ``magic`` starts a record (of either format)."""
    return magic in _FIXED_AT


def magic_positions(buf: bytes, start: int, end: int | None = None) -> Iterator[int]:
    """Where a record's magic (of either format) or a blank filler's stands in
    ``buf[start:end]``, in order (the record begins 4 bytes before): found with the C-level
    ``find``."""
    following = [buf.find(magic, start, end) for magic in _MAGIC_BYTES]
    while (live := [at for at in following if at >= 0]):
        at = min(live)
        yield at
        following = [buf.find(magic, at + 1, end) if found == at else found
                     for magic, found in zip(_MAGIC_BYTES, following, strict=True)]


def _misplaced(stored: int, commit_log_offset: int) -> RecordError:
    return RecordError(f"misplaced: a record written at commit log offset {stored}, "
                       f"read at {commit_log_offset} (a misdirected write's copy)")


def decode_head(read: Callable[[int, int], bytes], commit_log_offset: int, salvage: bool = False) -> RecordHead:
    """Topic, properties and place of the record at ``commit_log_offset``, its body left
    unread (no crc check).

    ``read(position, length)`` returns the record's bytes; ``RecordError`` if no record
    starts there, or one written at another offset does (a misdirected write's copy).
    ``salvage=True`` ignores the length and magic (a damaged record whose other fields may
    still say what it was; ``size`` is then 0): the layout is the magic's, else the
    current format's, else the legacy one's."""
    head = read(0, _PEEK_SIZE)
    if len(head) < MIN_RECORD_SIZE:
        raise RecordError("truncated header")
    total, magic, _ = _HEAD.unpack_from(head, 0)
    if magic in _FIXED_AT:
        return _decode_head(read, head, commit_log_offset, total, magic, salvage)
    if not salvage:
        raise RecordError(f"no record (magic {magic:#x}, length {total})")
    try:
        return _decode_head(read, head, commit_log_offset, total, RECORD_MAGIC, salvage)
    except RecordError:
        return _decode_head(read, head, commit_log_offset, total, LEGACY_MAGIC, salvage)


def _decode_head(read: Callable[[int, int], bytes], head: bytes, commit_log_offset: int, total: int,
                 magic: int, salvage: bool) -> RecordHead:
    fixed_at = _FIXED_AT[magic]
    if len(head) < fixed_at + _FIXED.size:
        raise RecordError("truncated header")
    if magic == RECORD_MAGIC:
        (stored,) = _OFFSET.unpack_from(head, HEAD_SIZE)
        if stored != commit_log_offset:
            raise _misplaced(stored, commit_log_offset)
    queue_id, _, queue_offset, _, _, topic_len = _FIXED.unpack_from(head, fixed_at)
    props_at = fixed_at + _FIXED.size + topic_len + _U32.size
    if salvage:
        total = props_at + _U32.size + _SALVAGE_PROPERTIES  # the length field may be damaged
    elif props_at + _U32.size > total:
        raise RecordError(f"no record (magic {magic:#x}, length {total})")
    try:
        if len(head) < props_at:
            head = read(0, props_at)
        (props_len,) = _U32.unpack_from(head, props_at - _U32.size)
        end = props_at + props_len
        if end + _U32.size > total:
            raise RecordError("inconsistent field lengths")
        if len(head) < end:
            head = read(0, end)
        if len(head) < end:
            raise RecordError("truncated properties")
        topic = head[fixed_at + _FIXED.size : props_at - _U32.size].decode()
        properties = _decode_props(head[props_at:end]) if props_len else {}
        if salvage and not topic:
            raise RecordError("no topic")
        return RecordHead(topic, properties, queue_id, queue_offset, 0 if salvage else total)
    except (struct.error, UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from exc


def decode(buf: bytes | memoryview, pos: int, commit_log_offset: int) -> StoredRecord:
    """Decode and verify the record at ``pos`` of ``buf``, read at ``commit_log_offset``;
    ``RecordError`` if torn or corrupt, or if it was written at another offset."""
    if len(buf) - pos < MIN_RECORD_SIZE:
        raise RecordError("truncated header")
    total, magic, crc = _HEAD.unpack_from(buf, pos)
    placed = magic == RECORD_MAGIC
    if not placed and magic != LEGACY_MAGIC:
        raise RecordError(f"bad magic {magic:#x}")
    if total < (_PLACED_MIN if placed else MIN_RECORD_SIZE) or pos + total > len(buf):
        raise RecordError(f"bad length {total}")
    rest = bytes(buf[pos + HEAD_SIZE : pos + total])
    if crc32c.crc32c(rest) != crc:
        raise RecordError("crc mismatch")
    if placed:
        stored, queue_id, flags, queue_offset, born, store, topic_len = _PLACED_FIXED.unpack_from(rest, 0)
        if stored != commit_log_offset:
            raise _misplaced(stored, commit_log_offset)
        cursor = _PLACED_FIXED.size
    else:
        queue_id, flags, queue_offset, born, store, topic_len = _FIXED.unpack_from(rest, 0)
        cursor = _FIXED.size
    topic = rest[cursor : cursor + topic_len].decode()
    cursor += topic_len
    (props_len,) = _U32.unpack_from(rest, cursor)
    cursor += 4
    properties = _decode_props(rest[cursor : cursor + props_len]) if props_len else {}
    cursor += props_len
    (body_len,) = _U32.unpack_from(rest, cursor)
    cursor += 4
    if cursor + body_len != len(rest):
        raise RecordError("inconsistent field lengths")
    return StoredRecord(
        topic=topic,
        queue_id=queue_id,
        body=rest[cursor : cursor + body_len],
        properties=properties,
        flags=flags,
        born_timestamp_ms=born,
        store_timestamp_ms=store,
        queue_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        size=total,
    )
