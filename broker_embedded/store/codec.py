"""The commit log's record format: encode, decode and verify one record.

Layout (big-endian), RocketMQ's fields in a compact order::

    total_length u32   length of the whole record, this field included
    magic        u32   RECORD_MAGIC, or BLANK_MAGIC for the filler at a segment's end
    crc          u32   crc32c of every byte after this field
    queue_id     u32
    flags        u32
    queue_offset u64
    born_ms      u64
    store_ms     u64
    topic_len    u16   then the topic, UTF-8
    props_len    u32   then the properties, msgpack map of str -> str
    body_len     u32   then the body
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import NamedTuple

import crc32c
import msgspec

from .record import StoredRecord

RECORD_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
_HEAD = struct.Struct(">III")  # total_length, magic, crc
_FIXED = struct.Struct(">IIQQQH")  # queue_id, flags, queue_offset, born, store, topic_len
_U32 = struct.Struct(">I")
HEAD_SIZE = _HEAD.size
MIN_RECORD_SIZE = _HEAD.size + _FIXED.size + 2 * _U32.size
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
    """The bytes of one record."""
    topic_bytes = topic.encode()
    props = _encode_props(properties if type(properties) is dict else dict(properties)) if properties else b""
    rest = b"".join(
        (
            _FIXED.pack(queue_id, flags, queue_offset, born_ms, store_ms, len(topic_bytes)),
            topic_bytes,
            _U32.pack(len(props)),
            props,
            _U32.pack(len(body)),
            body,
        )
    )
    return _HEAD.pack(HEAD_SIZE + len(rest), RECORD_MAGIC, crc32c.crc32c(rest)) + rest


def encode_blank(length: int) -> bytes:
    """Filler of ``length`` bytes: it closes a segment whose remaining space cannot hold the
    next record, and ``repair`` puts it where damaged bytes were. Under ``HEAD_SIZE`` bytes
    it is plain zeros, valid only at the end of a segment."""
    if length < HEAD_SIZE:
        return b"\0" * length
    return _HEAD.pack(length, BLANK_MAGIC, 0) + b"\0" * (length - HEAD_SIZE)


def blank_length(buf: bytes, pos: int) -> int:
    """The length of the intact blank filler at ``pos`` (magic, length within ``buf``,
    zeros after it), or 0 if there is none."""
    if len(buf) - pos < HEAD_SIZE:
        return 0
    total, magic, crc = _HEAD.unpack_from(buf, pos)
    if magic != BLANK_MAGIC or crc or not HEAD_SIZE <= total <= len(buf) - pos:
        return 0
    zeros = total - HEAD_SIZE
    return total if buf.count(0, pos + HEAD_SIZE, pos + total) == zeros else 0


def peek_length(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(total_length, magic)`` of the record at ``pos``; (0, 0) when fewer bytes remain."""
    if len(buf) - pos < HEAD_SIZE:
        return 0, 0
    total, magic, _ = _HEAD.unpack_from(buf, pos)
    return total, magic


def decode_head(read: Callable[[int, int], bytes], salvage: bool = False) -> RecordHead:
    """Topic, properties and place of a record, its body left unread (no crc check).

    ``read(position, length)`` returns the record's bytes; ``RecordError`` if no record
    starts there. ``salvage=True`` ignores the length and magic (a damaged record whose
    other fields may still say what it was; ``size`` is then 0)."""
    head = read(0, _PEEK_SIZE)
    if len(head) < MIN_RECORD_SIZE:
        raise RecordError("truncated header")
    total, magic, _ = _HEAD.unpack_from(head, 0)
    queue_id, _, queue_offset, _, _, topic_len = _FIXED.unpack_from(head, HEAD_SIZE)
    props_at = HEAD_SIZE + _FIXED.size + topic_len + _U32.size
    if salvage:
        total = props_at + _U32.size + _SALVAGE_PROPERTIES  # the length field may be damaged
    elif magic != RECORD_MAGIC or props_at + _U32.size > total:
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
        topic = head[HEAD_SIZE + _FIXED.size : props_at - _U32.size].decode()
        properties = _decode_props(head[props_at:end]) if props_len else {}
        if salvage and not topic:
            raise RecordError("no topic")
        return RecordHead(topic, properties, queue_id, queue_offset, 0 if salvage else total)
    except (struct.error, UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from exc


def decode(buf: bytes | memoryview, pos: int, commit_log_offset: int) -> StoredRecord:
    """Decode and verify the record at ``pos`` of ``buf``; ``RecordError`` if torn or corrupt."""
    if len(buf) - pos < MIN_RECORD_SIZE:
        raise RecordError("truncated header")
    total, magic, crc = _HEAD.unpack_from(buf, pos)
    if magic != RECORD_MAGIC:
        raise RecordError(f"bad magic {magic:#x}")
    if total < MIN_RECORD_SIZE or pos + total > len(buf):
        raise RecordError(f"bad length {total}")
    rest = bytes(buf[pos + HEAD_SIZE : pos + total])
    if crc32c.crc32c(rest) != crc:
        raise RecordError("crc mismatch")
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
