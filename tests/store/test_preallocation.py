"""Zeros written ahead of the last segment's records: appends overwrite them (their sync
writes no file size), a clean close cuts them, a crash leaves them for recovery to cut,
and a disk that refuses them refuses no append."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded.cli.main import main
from broker_embedded.store import commitlog
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import OsFileSystem
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.damage import crash_image, segments

STORE = StoreConfig(checkpoint_interval_s=3600, scrub_bytes_per_s=0)
AHEAD = commitlog.PREALLOCATE_BYTES


def record(n: int, size: int = 300) -> StoredRecord:
    return StoredRecord("orders", 0, f"{n:06d}".encode().ljust(size, b"."), {"UNIQ_KEY": f"id{n}"})


def log_end(stored: list[StoredRecord]) -> int:
    return stored[-1].commit_log_offset + stored[-1].size


def test_appends_overwrite_the_zeros_ahead_and_a_clean_close_cuts_them(tmp_path: Path) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = [store.put(record(0))]
        last = segments(tmp_path)[-1]
        size = last.stat().st_size
        assert size == log_end(stored) + AHEAD  # zeros written ahead, synced with the record
        assert last.read_bytes()[log_end(stored):] == bytes(AHEAD)
        stored += [store.put(record(n)) for n in range(1, 200)]
        assert last.stat().st_size == size  # 200 appends, the file's size never changed
    assert last.stat().st_size == log_end(stored)  # closed: the log ends with its last record
    with MessageStore(tmp_path, STORE) as store:
        assert [r.body for r in store.read_queue("orders", 0, 0, 1000)] == [r.body for r in stored]
        assert store.put(record(200)).commit_log_offset == log_end(stored)


def test_more_zeros_are_written_once_half_of_them_are_used(tmp_path: Path) -> None:
    body = 64 * 1024
    with MessageStore(tmp_path, replace(STORE, segment_size=64 << 20)) as store:
        stored = [store.put(record(0, body))]
        last = segments(tmp_path)[-1]
        sizes = {last.stat().st_size}
        while log_end(stored) < 3 * AHEAD:
            stored.append(store.put(record(len(stored), body)))
            sizes.add(last.stat().st_size)
            # never fewer than half of them left ahead, never more than all of them
            assert log_end(stored) + AHEAD // 2 <= last.stat().st_size <= log_end(stored) + AHEAD
        assert 4 <= len(sizes) <= 7  # extended in steps of half or more, not per append


def test_a_segment_is_never_written_past_its_size_and_closed_ones_are_whole(tmp_path: Path) -> None:
    """Segments smaller than the zeros ahead: each is filled to its size at most, the
    closed ones exactly (their blank filler over the zeros), and a crash image of the
    store opens with every record."""
    config = replace(STORE, segment_size=64 * 1024)
    with MessageStore(tmp_path / "live", config) as store:
        stored = [store.put(record(n, 1000)) for n in range(300)]
        files = segments(tmp_path / "live")
        assert len(files) > 3
        assert all(f.stat().st_size == config.segment_size for f in files)  # the last too: zeros to its end
        crashed = crash_image(tmp_path / "live", tmp_path / "crashed")
    assert all(f.stat().st_size == config.segment_size for f in segments(tmp_path / "live")[:-1])
    for data in (tmp_path / "live", crashed):
        with MessageStore(data, config) as store:
            assert [r.body for r in store.read_queue("orders", 0, 0, 1000)] == [r.body for r in stored]
            assert store.put(record(300, 1000)).commit_log_offset >= log_end(stored)


CHILD = r"""
import json, sys, time
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
store = MessageStore(sys.argv[1], StoreConfig(checkpoint_interval_s=3600, scrub_bytes_per_s=0))
ends = []
for n in range(int(sys.argv[2])):
    stored = store.put(StoredRecord("orders", 0, b"%06d" % n, {"UNIQ_KEY": f"id{n}"}))
    ends.append(stored.commit_log_offset + stored.size)
print(json.dumps(ends), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("restarts", [1, 3])
def test_a_store_killed_with_zeros_ahead_restarts_after_its_last_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], restarts: int) -> None:
    """SIGKILL leaves the zeros ahead in the file (no close cut them): ``fsck`` finds the
    log whole (no torn tail to report, nothing for ``repair`` to move aside), the next start
    cuts them without a warning, keeps every acknowledged record and appends right after
    the last one; again after several kills in a row."""
    count = 0
    for _ in range(restarts):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), "40"], stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        try:
            assert child.stdout is not None
            ends = json.loads(child.stdout.readline())
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        count += 40
        last = segments(tmp_path)[-1]
        assert ends[-1] + AHEAD // 2 <= last.stat().st_size <= ends[-1] + AHEAD  # the zeros are still there
        assert main(["fsck", "--data-dir", str(tmp_path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] and report["torn_tail"] is None and not report["gaps"], report
        assert any("bytes of zeros after the last record" in note for note in report["notes"]), report["notes"]
    with caplog.at_level(logging.INFO, logger="broker_embedded.store.commitlog"), MessageStore(tmp_path, STORE) as store:
        bodies = [r.body for r in store.read_queue("orders", 0, 0, 1000)]
        assert bodies == [b"%06d" % (n % 40) for n in range(count)]
        assert store.put(record(count)).commit_log_offset == ends[-1]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "bytes of zeros after the commit log's last record" in caplog.text


class _NoRoomAhead(OsFileSystem):
    """The real file system, except that it refuses any write of zeros alone (ENOSPC): a
    disk with room for records, not for zeros ahead of them."""

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if not bytes(data).strip(b"\0"):
            raise OSError(errno.ENOSPC, "no space left on device")
        return super().pwrite(fd, data, position)


def test_a_disk_that_refuses_the_zeros_ahead_refuses_no_append(tmp_path: Path) -> None:
    config = replace(STORE, filesystem=_NoRoomAhead())
    with MessageStore(tmp_path, config) as store:
        stored = [store.put(record(n)) for n in range(50)]
        assert segments(tmp_path)[-1].stat().st_size == log_end(stored)
    with MessageStore(tmp_path, STORE) as store:
        assert len(store.read_queue("orders", 0, 0, 1000)) == 50


WRITER = r"""
import sys
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
store = MessageStore(sys.argv[1], StoreConfig(segment_size=4 << 20, checkpoint_interval_s=0.2, scrub_bytes_per_s=0))
n = int(sys.argv[2])
while True:  # until SIGKILLed: batches of several records, bodies past the zeros ahead and the segments
    bodies = [b"%08d" % n * (256 << 10), *(b"%08d" % (n + i) for i in range(1, 6)), b"%08d" % (n + 6) * (192 << 10)]
    store.put_batch([StoredRecord("orders", 0, body, {"UNIQ_KEY": f"id{n + i}"}) for i, body in enumerate(bodies)])
    print(n + len(bodies), flush=True)  # acknowledged: the batch is durable
    n += len(bodies)
"""


def test_a_store_killed_while_writing_mib_batches_over_zeros_ahead_keeps_every_acknowledged_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Batches of several records with bodies of 2 MiB and 1.5 MiB (longer than the zeros
    ahead, rolling 4 MiB segments), SIGKILLed while writing, three times in a row: every
    acknowledged record is there, in order, fsck finds the log whole, appends go on."""
    config = replace(STORE, segment_size=4 << 20)
    acknowledged = 0
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(acknowledged)],
                                 stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        try:
            assert child.stdout is not None
            for _ in range(5):
                acknowledged = int(child.stdout.readline())
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        assert main(["fsck", "--data-dir", str(tmp_path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] and not report["gaps"], report
        with MessageStore(tmp_path, config) as store:
            ids = [r.properties["UNIQ_KEY"] for r in store.read_queue("orders", 0, 0, 10_000, max_bytes=1 << 40)]
            assert ids[:acknowledged] == [f"id{n}" for n in range(acknowledged)]
            acknowledged = len(ids)  # a batch written whole before the kill counts too
    with MessageStore(tmp_path, config) as store:
        assert store.put(record(acknowledged)).queue_offset == acknowledged
