"""The write path's cost: syscalls per batch, record objects per message, the group commit's sync."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker_embedded.errors import MessageTooLargeError
from broker_embedded.store import codec
from broker_embedded.store.commitlog import CommitLog
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import OsFileSystem
from broker_embedded.store.index import MessageIndex
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord

QUIET = StoreConfig(checkpoint_interval_s=3600, scrub_bytes_per_s=0)


def batch(start: int, count: int = 64) -> list[StoredRecord]:
    return [
        StoredRecord("orders", n % 8, b"x" * 256, {"UNIQ_KEY": f"id{n}", "KEYS": f"k{n % 5} all", "TAGS": "t"})
        for n in range(start, start + count)
    ]


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, *names: str) -> Iterator[dict[str, int]]:
    """Count calls of the ``os`` functions ``names`` (they still run)."""
    calls = dict.fromkeys(names, 0)

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls[name] += 1
            return real(*args)
        return call

    for name in names:
        monkeypatch.setattr(os, name, counting(name, getattr(os, name)))
    yield calls
    monkeypatch.undo()


def test_a_batch_costs_one_write_per_file_and_no_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with MessageStore(tmp_path, QUIET) as store:
        store.put_batch(batch(0))
    with MessageStore(tmp_path, QUIET) as store:  # an index file that existed before the open
        store.put_batch(batch(64))  # loads the file's slot table, once
        with counted(monkeypatch, "pwrite", "pread", "fsync", "fdatasync") as calls:
            stored = store.put_batch(batch(128))
        # the commit log once, the index's entries once; consume queue entries wait in memory
        assert calls == {"pwrite": 2, "pread": 0, "fsync": 0, "fdatasync": 1}
        assert [store.lookup_message_id(f"id{n}") for n in range(128, 192)] == [
            [r.commit_log_offset] for r in stored
        ]
        assert len(store.lookup_key("orders", "all")) == 192


def test_the_record_put_is_the_record_returned_and_a_stored_one_is_copied(tmp_path: Path) -> None:
    with MessageStore(tmp_path, QUIET) as store:
        records = batch(0, 3)
        stored = store.put_batch(records)
        assert all(a is b for a, b in zip(stored, records, strict=True))
        assert [r.queue_offset for r in stored] == [0, 0, 0] and stored[0].size > 256
        first = stored[0]
        place = (first.commit_log_offset, first.queue_offset)
        again, twice = store.put_batch([first, first])  # put again: two copies, the original kept
        assert (first.commit_log_offset, first.queue_offset) == place
        assert again is not first and twice is not first and again is not twice
        assert [again.queue_offset, twice.queue_offset] == [1, 2]
        assert store.get(twice.commit_log_offset) == twice


def test_a_refused_batch_leaves_its_records_unstored(tmp_path: Path) -> None:
    with MessageStore(tmp_path, StoreConfig(segment_size=4096, scrub_bytes_per_s=0)) as store:
        records = [StoredRecord("orders", 0, b"x" * 100), StoredRecord("orders", 0, b"y" * 5000)]
        with pytest.raises(MessageTooLargeError):
            store.put_batch(records)
        assert not any(r.is_stored for r in records)
        assert store.put(records[0]).queue_offset == 0


def test_chains_past_the_last_written_slots_are_linked_again_on_open(tmp_path: Path) -> None:
    crashed = MessageIndex(tmp_path, slots=3, entries=7)
    crashed.add_many([("t", f"id{n}", [f"k{n % 2}"], n) for n in range(10)])
    crashed.persist(crashed.unpersisted())  # a checkpoint: slots and headers written
    crashed.add_many([("t", f"id{n}", [f"k{n % 2}"], n) for n in range(10, 25)])
    # No persist, no close: the newest slots were only in memory, as after a crash.
    index = MessageIndex(tmp_path, slots=3, entries=7)
    assert [index.lookup_id(f"id{n}") for n in range(25)] == [[n] for n in range(25)]
    assert index.lookup_key("t", "k1") == list(range(1, 25, 2))
    index.add_many([("t", "id25", ["k1"], 25)])
    assert index.lookup_key("t", "k1") == [*range(1, 25, 2), 25]
    crashed.close()
    index.close()


class _FailingNewSegments(OsFileSystem):
    """The real file system, except that, once ``armed``, a write to a segment created
    after arming and every unlink fail with EIO (a disk that failed under a segment roll)."""

    def __init__(self) -> None:
        self.armed = False
        self.new: set[int] = set()

    def open(self, path: Path, *, create: bool = False, truncate: bool = False, read_only: bool = False) -> int:
        fd = super().open(path, create=create, truncate=truncate, read_only=read_only)
        self.new.discard(fd)
        if self.armed and path.name.isdigit():
            self.new.add(fd)
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if self.armed and fd in self.new:
            super().pwrite(fd, data[: len(data) // 2], position)  # part of it reached the file
            raise OSError(errno.EIO, "input/output error")
        return super().pwrite(fd, data, position)

    def unlink(self, path: Path, missing_ok: bool = False) -> None:
        if self.armed:
            raise OSError(errno.EIO, "input/output error")
        super().unlink(path, missing_ok=missing_ok)


def test_a_rolled_back_segment_that_cannot_be_deleted_is_never_used_or_closed_again(tmp_path: Path) -> None:
    """An append that rolls into a new segment and fails there is rolled back: the new
    segment is closed and deleted. When the delete fails too, the closed segment must not
    stay in the log: its descriptor number, reused by another file, would be written to by
    the next append and closed under its owner when the log closes."""
    fs = _FailingNewSegments()
    log = CommitLog(tmp_path / "commitlog", 4096, fs)
    first = log.append_many([codec.encode("t", 0, 0, 0, 1, 1, {}, b"a" * 3000)])
    fs.armed = True
    with pytest.raises(OSError):
        log.append_many([codec.encode("t", 0, 1, 0, 1, 1, {}, b"b" * 3000)])  # into a second segment
    fs.armed = False
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    victim_fd = os.open(victim, os.O_RDWR)  # takes the lowest free number: the closed segment's
    try:
        again = log.append_many([codec.encode("t", 0, 1, 0, 1, 1, {}, b"c" * 3000)])
        log.flush()
        assert os.pread(victim_fd, 100, 0) == b"untouched"
        log.close()
        os.fstat(victim_fd)  # still open: the log closed only its own descriptors
    finally:
        os.close(victim_fd)
    reopened = CommitLog(tmp_path / "commitlog", 4096)
    try:
        assert again == [4096]
        assert [reopened.read_at(offset).body for offset in (*first, *again)] == [b"a" * 3000, b"c" * 3000]
    finally:
        reopened.close()


class _FailingSecondNewSegment(_FailingNewSegments):
    """Once ``armed``: the write to the second segment created after arming reaches the
    file whole and then fails with EIO; every unlink fails."""

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        written = OsFileSystem.pwrite(self, fd, data, position)
        if self.armed and fd in self.new and len(self.new) >= 2 and fd == max(self.new):
            raise OSError(errno.EIO, "input/output error")
        return written


def test_every_rolled_back_segment_that_cannot_be_deleted_is_emptied_before_reuse(tmp_path: Path) -> None:
    """An append that rolled into two new segments fails in the second; neither file can be
    deleted. Both are emptied when their offsets are used again: a record rolled back in the
    second, left whole behind the new ones, would otherwise be read back after a reopen as
    if it had been written."""
    fs = _FailingSecondNewSegment()
    log = CommitLog(tmp_path / "commitlog", 4096, fs)
    overhead = codec.SEAL_SIZE + len(codec.encode("t", 0, 0, 0, 1, 1, {}, b""))
    filling = b"f" * (4096 - overhead)  # a record that fills a segment
    first = log.append_many([codec.encode("t", 0, 0, 0, 1, 1, {}, filling)])
    fs.armed = True
    with pytest.raises(OSError):  # segment 2 written, segment 3 written whole, then EIO
        log.append_many([codec.encode("t", 0, 1, 0, 1, 1, {}, filling),
                         codec.encode("t", 0, 2, 0, 1, 1, {}, b"rolled back 1"),
                         codec.encode("t", 0, 3, 0, 1, 1, {}, b"rolled back 2")])
    fs.armed = False
    again = log.append_many([codec.encode("t", 0, 1, 0, 1, 1, {}, filling),
                             codec.encode("t", 0, 2, 0, 1, 1, {}, b"written again")])  # as long as the first
    log.flush()
    log.close()
    reopened = CommitLog(tmp_path / "commitlog", 4096)
    try:
        assert again == [4096, 8192]
        assert [record.body for record in reopened.recover(0)] == [filling, filling, b"written again"]
        assert reopened.write_offset == 8192 + overhead + len(b"written again")
        assert first == [0]
    finally:
        reopened.close()
