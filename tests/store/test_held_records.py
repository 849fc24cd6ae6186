"""Records put with ``hold`` (oneway ENDs) that cannot be written: the held batch is
dropped, not held again, so that it never blocks the writes that come after it."""

from __future__ import annotations

import dataclasses
import errno
import logging
from pathlib import Path

import pytest

from broker_embedded.errors import MessageTooLargeError
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import OsFileSystem
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord

#: 4 KiB segments (a record can outgrow one), no background flush or checkpoint.
SMALL = StoreConfig(segment_size=4096, async_flush_interval_s=3600, checkpoint_interval_s=3600,
                    scrub_bytes_per_s=0)


def record(body: bytes) -> StoredRecord:
    return StoredRecord("orders", 0, body, {})


class FailingWrites(OsFileSystem):
    """The real file system, except that the next ``failures`` writes fail with EIO (a disk
    that fails and recovers)."""

    def __init__(self) -> None:
        self.failures = 0

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EIO, "injected write error")
        return super().pwrite(fd, data, position)


def bodies(data_dir: Path) -> list[bytes]:
    with MessageStore(data_dir, SMALL) as store:
        return [r.body for r in store.read_queue("orders", 0, 0, 100)]


def dropped_warning(caplog: pytest.LogCaptureFixture) -> str:
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "held" in r.getMessage()]
    return warning


def test_a_held_record_that_cannot_be_written_is_dropped_and_the_next_put_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dropped: list[str] = []
    with MessageStore(tmp_path, SMALL) as store:
        store.put(record(b"before"))
        too_big = record(b"h" * 5000)  # fits max_record_size, not a 4 KiB segment
        store.put_batch([too_big], hold=True, on_dropped=lambda: dropped.append("held"))
        assert store.unsynced and dropped == []

        after = store.put(record(b"after"))  # was: MessageTooLargeError, and for every later put
        assert after.queue_offset == 1 and dropped == ["held"]
        assert not store.unsynced
        assert "1 held record" in dropped_warning(caplog) and "exceeds the segment size" in dropped_warning(caplog)
        assert store.put(record(b"later")).queue_offset == 2
    assert bodies(tmp_path) == [b"before", b"after", b"later"]


def test_flush_drops_a_held_record_that_cannot_be_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dropped: list[str] = []
    with MessageStore(tmp_path, SMALL) as store:
        store.put_batch([record(b"h" * 5000)], hold=True, on_dropped=lambda: dropped.append("held"))
        durable: list[str] = []
        lost: list[Exception] = []
        store.when_durable(lambda: durable.append("held"), lost.append)  # waits for the held record
        store.flush()  # was: MessageTooLargeError, from every flush and checkpoint after it
        assert dropped == ["held"] and not store.unsynced
        assert [type(exc) for exc in lost] == [MessageTooLargeError]
        assert "1 held record" in dropped_warning(caplog)
        store.checkpoint()
        assert store.put(record(b"after")).queue_offset == 0
        assert durable == []  # the next fsync does not pass the dropped record off as durable
    assert bodies(tmp_path) == [b"after"]


def test_a_failed_write_drops_the_held_records_and_writes_the_new_ones_alone(tmp_path: Path) -> None:
    fs = FailingWrites()
    dropped: list[str] = []
    with MessageStore(tmp_path, dataclasses.replace(SMALL, filesystem=fs)) as store:
        store.put(record(b"before"))
        store.put_batch([record(b"end-1"), record(b"end-2")], hold=True, on_dropped=lambda: dropped.append("held"))
        fs.failures = 1  # the disk fails the write of held + new: not the held records' fault
        after = store.put(record(b"after"))
        assert dropped == ["held"]
        assert after.queue_offset == 1 and store.get(after.commit_log_offset).body == b"after"
    assert bodies(tmp_path) == [b"before", b"after"]


def test_a_put_that_fails_alone_too_keeps_the_held_records_for_the_next(tmp_path: Path) -> None:
    fs = FailingWrites()
    dropped: list[str] = []
    with MessageStore(tmp_path, dataclasses.replace(SMALL, filesystem=fs)) as store:
        store.put(record(b"before"))
        end = store.commitlog.write_offset
        store.put_batch([record(b"end")], hold=True, on_dropped=lambda: dropped.append("held"))
        fs.failures = 2  # held + new, then new alone: the held record may not be at fault
        with pytest.raises(OSError, match="injected"):
            store.put(record(b"refused"))
        assert store.commitlog.write_offset == end  # all or nothing, twice
        assert dropped == [] and store.unsynced
        with pytest.raises(MessageTooLargeError):  # refused for its own record, not the held one
            store.put(record(b"r" * 5000))
        assert dropped == [] and store.unsynced
        after = store.put(record(b"after"))  # the disk is back: the held record goes first
        assert (after.queue_offset, dropped) == (2, []) and not store.unsynced
    assert bodies(tmp_path) == [b"before", b"end", b"after"]
