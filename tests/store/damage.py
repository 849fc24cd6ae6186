"""Real damage to data directories a real store or broker wrote, for the recovery tests.

A *crash image* is a copy of a data directory taken while its store is open and idle:
every write is in the files (the page cache a SIGKILL leaves behind), the checkpoint is
wherever the store last wrote it, and nothing was closed cleanly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from broker_embedded import EmbeddedBroker
from broker_embedded.store.record import StoredRecord


def crash_image(source: Path, target: Path) -> Path:
    """Copy ``source`` as a crash would leave it (call while the store writes no records).
    The store's background scrub may still replace its progress file (a temporary file
    renamed over it): a file gone between the listing and its copy is left out, as a crash
    at that moment would leave it."""
    shutil.copytree(source, target, copy_function=_copy_if_there)
    return target


def _copy_if_there(source: str, target: str) -> None:
    try:
        shutil.copy2(source, target)
    except FileNotFoundError:
        pass


def segments(data_dir: Path) -> list[Path]:
    """The commit log segment files, oldest first."""
    return sorted(p for p in (data_dir / "commitlog").iterdir() if p.name.isdigit())


def index_files(data_dir: Path) -> list[Path]:
    """The index files (not their filters), oldest first."""
    return sorted(p for p in (data_dir / "index").iterdir() if p.name.isdigit())


def locate(data_dir: Path, commit_log_offset: int) -> tuple[Path, int]:
    """The segment file holding ``commit_log_offset`` and the position in it."""
    segment = [p for p in segments(data_dir) if int(p.name) <= commit_log_offset][-1]
    return segment, commit_log_offset - int(segment.name)


def overwrite(data_dir: Path, commit_log_offset: int, data: bytes) -> None:
    """Write ``data`` over the commit log at ``commit_log_offset`` (one segment)."""
    path, position = locate(data_dir, commit_log_offset)
    with path.open("r+b") as f:
        f.seek(position)
        f.write(data)


def zero(data_dir: Path, commit_log_offset: int, length: int) -> None:
    """Zero ``length`` bytes of the commit log from ``commit_log_offset`` (one segment)."""
    overwrite(data_dir, commit_log_offset, b"\0" * length)


def retype(data_dir: Path, record: StoredRecord, old: bytes, new: bytes) -> None:
    """Overwrite the first ``old`` in ``record``'s bytes with ``new``, as long: a flipped
    bit that turns its id into another message's, say."""
    path, position = locate(data_dir, record.commit_log_offset)
    with path.open("r+b") as f:
        f.seek(position)
        at = f.read(record.size).index(old)
        f.seek(position + at)
        f.write(new)


def flip(data_dir: Path, commit_log_offset: int) -> None:
    """Invert one byte of the commit log."""
    path, position = locate(data_dir, commit_log_offset)
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def cut(path: Path, length: int) -> None:
    """Remove the last ``length`` bytes of a file."""
    os.truncate(path, path.stat().st_size - length)


def fingerprint(data_dir: Path) -> dict[str, str]:
    """A digest of every file under ``data_dir``: equal before and after a read-only tool."""
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*")) if p.is_file()
    }


def drain(broker: EmbeddedBroker, group: str, topic: str) -> list[bytes]:
    """Receive and ack everything ``group`` can get from ``topic`` now."""
    bodies: list[bytes] = []
    while batch := broker.receive(group, topic, max_messages=64):
        for received in batch:
            broker.ack(group, received.receipt_handle)
            bodies.append(received.message.body)
    return bodies


def read_topic(broker: EmbeddedBroker, topic: str, queues: int) -> list[bytes]:
    """Every body of ``topic``'s queues, by replay from offset 0 (no consumer group)."""
    bodies: list[bytes] = []
    for queue_id in range(queues):
        offset = 0
        while batch := broker.read(topic, queue_id, offset, 64):
            bodies.extend(m.message.body for m in batch)
            offset = batch[-1].queue_offset + 1
    return bodies
