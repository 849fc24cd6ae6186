"""The message store: round trips, rollover, recovery, rebuild, locking, group commit."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_embedded.errors import (
    BrokerClosedError,
    CorruptLogError,
    DataDirLockedError,
    MessageTooLargeError,
    StoreFullError,
)
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import OsFileSystem
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.load_writer import load_until_killed

SMALL = StoreConfig(segment_size=4096, checkpoint_interval_s=3600)


def record(topic: str = "orders", queue_id: int = 0, body: bytes = b"x" * 100, **props: str) -> StoredRecord:
    return StoredRecord(topic=topic, queue_id=queue_id, body=body, properties=props)


def test_put_then_read_back_by_queue_offset_and_commit_offset(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        first = store.put(record(body=b"one", UNIQ_KEY="m1", KEYS="k1 k2"))
        second = store.put(record(body=b"two", UNIQ_KEY="m2"))
        assert (first.queue_offset, second.queue_offset) == (0, 1)
        assert [r.body for r in store.read_queue("orders", 0, 0, 10)] == [b"one", b"two"]
        assert store.get(second.commit_log_offset).body == b"two"
        assert store.lookup_message_id("m1") == [first.commit_log_offset]
        assert store.lookup_key("orders", "k2") == [first.commit_log_offset]
        assert store.queue_max_offset("orders", 0) == 2
        assert store.queues() == {"orders": 1}


def test_records_roll_over_segments_and_survive_restart(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        for n in range(100):
            store.put(record(queue_id=n % 3, body=f"body-{n}".encode() * 10, UNIQ_KEY=f"id{n}"))
    assert len(list((tmp_path / "commitlog").iterdir())) >= 3
    with MessageStore(tmp_path, SMALL) as store:
        assert store.get(store.lookup_message_id("id42")[0]).body == b"body-42" * 10
        bodies = sorted(r.body for q in range(3) for r in store.read_queue("orders", q, 0, 1000))
        assert bodies == sorted(f"body-{n}".encode() * 10 for n in range(100))
        assert store.put(record(queue_id=0)).queue_offset == 34


def test_put_batch_spans_segments_in_order_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        fsynced: list[int] = []
        caller = threading.get_ident()
        def recording(real: Callable[[int], None]) -> Callable[[int], None]:
            def sync(fd: int) -> None:
                if threading.get_ident() == caller:  # not another thread's (which one added 4 in CI is not known)
                    fsynced.append(fd)
                real(fd)
            return sync

        for name in ("fsync", "fdatasync"):  # segments: fdatasync; the directory: fsync
            monkeypatch.setattr(os, name, recording(getattr(os, name)))
        stored = store.put_batch([record(queue_id=n % 2, body=f"b{n}".encode() * 100) for n in range(30)])
        monkeypatch.undo()
        segments = sorted((tmp_path / "commitlog").iterdir())
        assert len(segments) >= 3
        # each segment once, and the directory once per segment created (all three here)
        assert len(fsynced) <= 2 * len(segments)
        assert [r.queue_offset for r in stored if r.queue_id == 1] == list(range(15))
        assert all(a.commit_log_offset < b.commit_log_offset for a, b in zip(stored, stored[1:], strict=False))
        for item in stored:
            assert store.get(item.commit_log_offset).body == item.body
    with MessageStore(tmp_path, SMALL) as store:
        assert [r.body for r in store.read_queue("orders", 0, 0, 100)] == [
            f"b{n}".encode() * 100 for n in range(0, 30, 2)
        ]


def test_oversized_records_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        with pytest.raises(MessageTooLargeError):
            store.put_batch([record(body=b"ok"), record(body=b"x" * 5000)])
        assert store.put(record(body=b"first")).queue_offset == 0


def _last_segment(tmp_path: Path) -> Path:
    return sorted((tmp_path / "commitlog").iterdir())[-1]


def test_a_torn_tail_at_every_byte_is_truncated_and_never_resurrected(tmp_path: Path) -> None:
    original = tmp_path / "original"
    with MessageStore(original, SMALL) as store:
        for n in range(5):
            store.put(record(body=f"keep-{n}".encode()))
        last = store.put(record(body=b"torn", UNIQ_KEY="torn-id"))
    os.remove(original / "checkpoint")  # as after a crash between checkpoints
    start = last.commit_log_offset - int(_last_segment(original).name)
    for cut in range(last.size):
        data = tmp_path / f"cut{cut}"
        shutil.copytree(original, data)
        with _last_segment(data).open("r+b") as f:
            f.truncate(start + cut)
        with MessageStore(data, SMALL) as store:
            assert [r.body for r in store.read_queue("orders", 0, 0, 100)] == [
                f"keep-{n}".encode() for n in range(5)
            ], cut
            assert store.lookup_message_id("torn-id") == []
            again = store.put(record(body=b"after"))
            assert (again.queue_offset, again.commit_log_offset) == (5, last.commit_log_offset)
        with MessageStore(data, SMALL) as store:
            assert [r.body for r in store.read_queue("orders", 0, 5, 10)] == [b"after"]
        shutil.rmtree(data)


def test_garbage_after_the_last_record_is_truncated(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        store.put(record(body=b"keep"))
    with _last_segment(tmp_path).open("ab") as f:
        f.write(os.urandom(50))
    with MessageStore(tmp_path, StoreConfig(segment_size=4096)) as store:
        assert [r.body for r in store.read_queue("orders", 0, 0, 10)] == [b"keep"]


def test_corruption_in_a_closed_segment_is_an_error(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        stored = [store.put(record()) for _ in range(100)]
    os.remove(tmp_path / "checkpoint")
    first = sorted((tmp_path / "commitlog").iterdir())[0]
    with first.open("r+b") as f:
        f.seek(stored[1].commit_log_offset + 40)
        f.write(b"\xff\xff\xff")
    with pytest.raises(CorruptLogError, match=f"offset {stored[1].commit_log_offset} .*closed segment"):
        MessageStore(tmp_path, SMALL)
    with pytest.raises(CorruptLogError):  # refused again, not DataDirLockedError
        MessageStore(tmp_path, SMALL)


def test_corruption_followed_by_intact_records_in_the_last_segment_is_an_error(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        stored = [store.put(record(body=f"n{n}".encode())) for n in range(5)]
    os.remove(tmp_path / "checkpoint")
    segment = _last_segment(tmp_path)
    assert int(segment.name) <= stored[1].commit_log_offset
    with segment.open("r+b") as f:
        f.seek(stored[1].commit_log_offset - int(segment.name) + 30)
        f.write(b"\xff")
    with pytest.raises(CorruptLogError, match=f"offset {stored[1].commit_log_offset} "):
        MessageStore(tmp_path, SMALL)
    assert segment.stat().st_size > stored[4].commit_log_offset - int(segment.name)


def test_deleted_consume_queues_and_index_are_rebuilt_identically(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        for n in range(60):
            store.put(record(topic=f"t{n % 2}", queue_id=n % 4, UNIQ_KEY=f"id{n}", KEYS=f"k{n % 5}"))
    originals = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "consumequeue").rglob("*") if p.is_file()
    }
    index_files = {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()}
    subprocess.run(["rm", "-rf", str(tmp_path / "consumequeue"), str(tmp_path / "index")], check=True)
    with MessageStore(tmp_path, SMALL) as store:
        assert store.lookup_key("t1", "k3") and store.lookup_message_id("id59")
    rebuilt = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "consumequeue").rglob("*") if p.is_file()
    }
    assert rebuilt == originals
    assert {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()} == index_files


def test_a_second_store_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL):
        with pytest.raises(DataDirLockedError):
            MessageStore(tmp_path, SMALL)
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys; from broker_embedded.store.message_store import MessageStore\n"
             "try:\n MessageStore(sys.argv[1])\nexcept Exception as e: print(type(e).__name__)",
             str(tmp_path)],
            capture_output=True, text=True, check=True,
        )
        assert probe.stdout.strip() == "DataDirLockedError"


def test_concurrent_sync_puts_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        nonlocal calls
        calls += 1
        real_fdatasync(fd)

    store = MessageStore(tmp_path, StoreConfig(checkpoint_interval_s=3600))
    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    results: list[int] = []
    lock = threading.Lock()

    def producer(worker: int) -> None:
        for n in range(50):
            stored = store.put(record(queue_id=worker, body=f"{worker}:{n}".encode()))
            with lock:
                results.append(stored.commit_log_offset)

    threads = [threading.Thread(target=producer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    assert len(set(results)) == 400
    assert 0 < calls < 400
    for worker in range(8):
        assert [r.body for r in store.read_queue("orders", worker, 0, 100)] == [
            f"{worker}:{n}".encode() for n in range(50)
        ]
    store.close()


def test_listeners_hear_each_durable_record_once_in_order_and_not_on_reopen(tmp_path: Path) -> None:
    heard: list[tuple[int, int]] = []
    with MessageStore(tmp_path, SMALL) as store:
        store.add_dispatch_listener(lambda rs: heard.extend((r.commit_log_offset, r.queue_offset) for r in rs))
        stored = [store.put(record(body=f"{n}".encode() * 200)) for n in range(10)]
        stored += store.put_batch([record(queue_id=1) for _ in range(5)])
        assert heard == [(r.commit_log_offset, r.queue_offset) for r in stored]
    replayed: list[int] = []
    with MessageStore(tmp_path, SMALL) as store:
        store.add_dispatch_listener(lambda rs: replayed.extend(r.commit_log_offset for r in rs))
        assert [r.commit_log_offset for r in store.scan()] == [r.commit_log_offset for r in stored]
        later = store.put(record())
    assert replayed == [later.commit_log_offset]


def test_a_batch_listener_hears_the_records_made_durable_together_in_one_call_readable(tmp_path: Path) -> None:
    heard: list[list[int]] = []
    with MessageStore(tmp_path, SMALL) as store:
        def on_batch(records: list[StoredRecord]) -> None:
            heard.append([r.commit_log_offset for r in records])
            assert store.read_queue("orders", 1, 0, 10)[-1].commit_log_offset == records[-1].commit_log_offset

        store.add_dispatch_listener(on_batch)
        batch = store.put_batch([record(queue_id=1) for _ in range(5)])
        one = store.put(record(queue_id=1))
    assert heard == [[r.commit_log_offset for r in batch], [one.commit_log_offset]]


def test_async_mode_reads_at_once_and_survives_a_clean_close(tmp_path: Path) -> None:
    config = StoreConfig(segment_size=4096, flush_mode="async", async_flush_interval_s=0.05)
    with MessageStore(tmp_path, config) as store:
        stored = [store.put(record(body=f"a{n}".encode())) for n in range(50)]
        assert store.read_queue("orders", 0, 49, 5)[0].body == b"a49"
        store.flush()
    with MessageStore(tmp_path, config) as store:
        assert [r.body for r in store.read_queue("orders", 0, 0, 100)] == [r.body for r in stored]
        moment = stored[20].store_timestamp_ms
        first = store.offset_for_timestamp("orders", 0, moment)
        assert stored[first].store_timestamp_ms == moment
        assert first == 0 or stored[first - 1].store_timestamp_ms < moment
        assert store.offset_for_timestamp("orders", 0, stored[-1].store_timestamp_ms + 1) == 50


def test_a_closed_store_refuses_puts_and_closing_twice_is_harmless(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, SMALL)
    store.put(record())
    store.close()
    store.close()
    with pytest.raises(BrokerClosedError):
        store.put(record())
    with MessageStore(tmp_path, SMALL) as again:  # the lock was released
        assert again.queue_max_offset("orders", 0) == 1


def test_free_space_floor_refuses_writes_and_keeps_the_log_intact(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        store.put(record(body=b"before"))
    with MessageStore(tmp_path, StoreConfig(segment_size=4096, min_free_disk_bytes=1 << 62)) as store:
        with pytest.raises(StoreFullError):
            store.put(record(body=b"refused"))
    with MessageStore(tmp_path, SMALL) as store:
        assert [r.body for r in store.read_queue("orders", 0, 0, 10)] == [b"before"]
        assert store.put(record(body=b"after")).queue_offset == 1


def test_retention_deletes_old_segments_below_the_guard_only(tmp_path: Path) -> None:
    with MessageStore(tmp_path, SMALL) as store:
        stored = [store.put(record(UNIQ_KEY=f"id{n}", KEYS="same")) for n in range(100)]
        guard = stored[50].commit_log_offset
        assert store.delete_expired_segments(now_ms=0, guard_offset=guard) == 0  # nothing is old yet
        deleted = store.delete_expired_segments(now_ms=2**62, guard_offset=guard)
        assert deleted > 0
        assert 0 < store.commitlog.min_offset <= guard
        assert store.get(guard).commit_log_offset == guard
        low = store.queue_min_offset("orders", 0)
        remaining = store.read_queue("orders", 0, 0, 1000)
        assert remaining[0].queue_offset == low > 0
        assert remaining[-1].queue_offset == 99
        assert store.lookup_message_id("id0") == []  # deleted records are not found
        assert store.lookup_key("orders", "same") == [r.commit_log_offset for r in remaining]
    with MessageStore(tmp_path, SMALL) as store:
        assert store.queue_min_offset("orders", 0) == low
        assert store.delete_expired_segments(now_ms=2**62) > 0  # unguarded: all but the last
        assert len(list((tmp_path / "commitlog").iterdir())) == 1
    subprocess.run(["rm", "-rf", str(tmp_path / "consumequeue")], check=True)
    with MessageStore(tmp_path, SMALL) as store:  # rebuilt from what retention kept
        kept = store.read_queue("orders", 0, 0, 1000)
        assert kept and kept[0].queue_offset == store.queue_min_offset("orders", 0)
        assert kept[-1].queue_offset == 99


def test_a_queue_whose_every_record_retention_took_continues_after_them_on_restart(tmp_path: Path) -> None:
    """The queue's files go with its records; a restart must not give its offsets again
    (a consumer past them would skip the new records; the transaction book, replaying its
    op queue from the offset it had applied, would skip a commit: simulation seed 126,
    profile clock)."""
    with MessageStore(tmp_path, SMALL) as store:
        store.put(record("rare"))
        for _ in range(60):
            store.put(record())
        assert store.delete_expired_segments(now_ms=2**62) > 0
        assert store.queue_max_offset("rare", 0) == 1
    with MessageStore(tmp_path, SMALL) as store:
        assert store.queue_max_offset("rare", 0) == 1
        assert store.put(record("rare")).queue_offset == 1
        assert [r.queue_offset for r in store.read_queue("rare", 0, 0, 10)] == [1]


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (needs root and mount permission; skipped otherwise)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_refuses_the_write_and_leaves_no_partial_record(tiny_filesystem: Path) -> None:
    ballast = tiny_filesystem / "ballast"
    ballast.write_bytes(b"b" * 96 * 1024)
    data_dir = tiny_filesystem / "store"
    config = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600)
    acknowledged: list[StoredRecord] = []
    with MessageStore(data_dir, config) as store:
        with pytest.raises(StoreFullError):
            for n in range(10_000):
                acknowledged.append(store.put(record(body=f"{n}".encode() * 300)))
        assert len(acknowledged) > 10
        with pytest.raises(StoreFullError):
            store.put(record(body=b"y" * 3000))
        with pytest.raises(StoreFullError):  # a batch spanning segments: all or nothing
            store.put_batch([record(body=b"z" * 3000) for _ in range(40)])
        ballast.unlink()  # the operator frees space: appends resume where they stopped
        after = store.put(record(body=b"after"))
        assert after.queue_offset == len(acknowledged)
    with MessageStore(data_dir, config) as store:
        bodies = [r.body for r in store.read_queue("orders", 0, 0, 10**6)]
        assert bodies == [r.body for r in acknowledged] + [b"after"]
        assert store.get(after.commit_log_offset).body == b"after"


@pytest.mark.slow
def test_sigkill_during_sync_load_loses_no_acknowledged_record(tmp_path: Path) -> None:
    acknowledged = load_until_killed(tmp_path, 3000, segment_size=64 * 1024, checkpoint_interval_s=0.3)
    with MessageStore(tmp_path) as store:
        for w in range(4):
            seen = [r.properties["UNIQ_KEY"] for r in store.read_queue("load", w, 0, 10**6)]
            assert len(seen) == len(set(seen)), "a record is there twice"
            assert [int(k.split("-")[1]) for k in seen] == list(range(len(seen))), "torn or reordered"
            acked = [a.message_id for a in acknowledged if a.writer == w]
            assert seen[: len(acked)] == acked


class _TornWrite(OSError):
    """The simulated crash: half of a write reached the file, then the process died."""


class _TearingFileSystem(OsFileSystem):
    """The real file system, except that a write to ``store.json`` (or its temporary file)
    puts half the data on disk and then crashes."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def open(self, path: Path, *, create: bool = False, truncate: bool = False,
             read_only: bool = False) -> int:
        fd = super().open(path, create=create, truncate=truncate, read_only=read_only)
        self.names[fd] = path.name
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if not self.names.get(fd, "").startswith("store.json"):
            return super().pwrite(fd, data, position)
        super().pwrite(fd, data[: len(data) // 2], position)
        raise _TornWrite("crash in the middle of writing store.json")


def test_a_crash_while_store_json_is_rewritten_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """store.json is rewritten when a directory from before consume queue files were split
    gets its count pinned; a crash mid-write must leave the old layout, never half a file
    (which the next open could not parse)."""
    with MessageStore(tmp_path, SMALL):
        pass
    meta = tmp_path / "store.json"
    meta.write_text(json.dumps({"segment_size": SMALL.segment_size}))  # the older form
    with pytest.raises(_TornWrite):
        MessageStore(tmp_path, dataclasses.replace(SMALL, filesystem=_TearingFileSystem()))
    assert json.loads(meta.read_text()) == {"segment_size": SMALL.segment_size}
    with MessageStore(tmp_path, SMALL) as store:  # the failed open released the directory
        assert store.config.segment_size == SMALL.segment_size
    assert json.loads(meta.read_text())["consume_queue_file_entries"] == SMALL.consume_queue_file_entries


class CountedFileSystem(OsFileSystem):
    """The real file system, counting the ``pread`` calls of the thread that made it (not
    the scrub's, which reads the log in the background from the moment a store opens)."""

    def __init__(self) -> None:
        self.preads = 0
        self._counted = threading.get_ident()

    def pread(self, fd: int, length: int, position: int) -> bytes:
        if threading.get_ident() == self._counted:
            self.preads += 1
        return super().pread(fd, length, position)


def test_a_queue_is_read_a_stretch_of_the_log_at_a_time_and_damage_costs_only_its_record(tmp_path: Path) -> None:
    """A queue's records interleaved with other queues' are read with one ``pread`` per
    stretch of a segment (not one per record), across segment boundaries; a damaged record
    inside a stretch is skipped and reported alone, the records around it read whole."""
    fs = CountedFileSystem()
    config = dataclasses.replace(SMALL, segment_size=64 * 1024, filesystem=fs)
    with MessageStore(tmp_path, config) as store:
        stored = store.put_batch([record(queue_id=n % 4, body=f"m{n}".encode() * 40, UNIQ_KEY=f"m{n}")
                                  for n in range(600)])
    assert len({r.commit_log_offset // config.segment_size for r in stored}) >= 3  # several segments
    with MessageStore(tmp_path, config) as store:
        fs.preads = 0
        assert len(store.read_queue("orders", 1, 0, 1000)) == 150
        assert fs.preads <= 5, fs.preads  # its queue file, then a stretch per segment (not 150 records)
    victim = stored[201]  # queue 1, amid its stretch
    segment = tmp_path / "commitlog" / f"{victim.commit_log_offset - victim.commit_log_offset % config.segment_size:020d}"
    image = bytearray(segment.read_bytes())
    image[victim.commit_log_offset % config.segment_size + victim.size - 2] ^= 0xFF  # a body byte
    segment.write_bytes(bytes(image))
    with MessageStore(tmp_path, config) as store:
        got = store.read_queue("orders", 1, 0, 1000)
        assert [r.properties["UNIQ_KEY"] for r in got] == [f"m{n}" for n in range(1, 600, 4) if n != 201]
        assert [r.body for r in got] == [f"m{n}".encode() * 40 for n in range(1, 600, 4) if n != 201]
        [loss] = store.losses.all()
        assert loss.places == (("orders", 1, victim.queue_offset),) and loss.message_ids == ("m201",), loss
