"""Consume queues in fixed-size files: reads across files, truncation, retention, the old
single-file layout, a SIGKILL under load, and memory that does not grow with entries."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.consume_queue import ENTRY, ConsumeQueue, file_name, tag_hash
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.load_writer import load_until_killed, rss_bytes


def expected(n: int) -> tuple[int, int]:
    """The (commit log offset, size) test entry ``n`` points at: rising, as in a real queue."""
    return 1000 + 100 * n, 50 + n % 7


def fill(queue: ConsumeQueue, start: int, end: int) -> None:
    for n in range(start, end):
        assert queue.append(n, *expected(n), tag=f"t{n % 3}")


def checkpoint(queue: ConsumeQueue) -> None:
    queue.persist(*queue.unpersisted())


def files(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir())


def test_entries_across_tiny_files_read_back_by_offset_and_range_and_after_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "orders" / "0"
    queue = ConsumeQueue(directory, entries_per_file=7)
    fill(queue, 0, 30)
    checkpoint(queue)
    fill(queue, 30, 65)
    checkpoint(queue)
    fill(queue, 65, 100)  # pending only: reads mix files and memory
    assert (queue.min_offset, queue.persisted, queue.max_offset) == (0, 65, 100)
    assert not queue.append(42, 1, 1, "")  # a replayed entry is ignored
    assert files(directory) == list(range(0, 65, 7))
    assert [queue.entry(n) for n in range(100)] == [expected(n) for n in range(100)]
    for start in range(0, 100, 3):
        for count in (1, 6, 7, 8, 15, 40):
            assert queue.entries(start, count) == [expected(n) for n in range(start, min(100, start + count))]
    assert queue.entries(100, 5) == []
    with pytest.raises(IndexError):
        queue.entry(100)
    checkpoint(queue)
    queue.close()

    again = ConsumeQueue(directory, entries_per_file=7)
    assert (again.min_offset, again.persisted, again.max_offset) == (0, 100, 100)
    assert again.entries(0, 1000) == [expected(n) for n in range(100)]
    raw = (directory / file_name(63)).read_bytes()
    assert ENTRY.unpack(raw[20:40]) == (*expected(64), tag_hash("t1"))
    fill(again, 100, 110)
    assert again.entries(95, 10) == [expected(n) for n in range(95, 105)]


def test_truncate_beyond_across_a_file_boundary_and_into_pending_entries(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = ConsumeQueue(directory, entries_per_file=10)
    fill(queue, 0, 50)
    checkpoint(queue)
    fill(queue, 50, 55)
    queue.truncate_beyond(expected(52)[0])  # only pending entries go
    assert (queue.persisted, queue.max_offset) == (50, 52)
    queue.truncate_beyond(expected(23)[0])
    assert (queue.persisted, queue.max_offset) == (23, 23)
    assert files(directory) == [0, 10, 20]
    assert (directory / file_name(20)).stat().st_size == 3 * 20
    assert queue.entries(15, 100) == [expected(n) for n in range(15, 23)]
    queue.truncate_beyond(expected(20)[0])  # exactly at a boundary: the emptied file goes
    assert files(directory) == [0, 10]
    assert queue.max_offset == 20
    queue.close()
    reopened = ConsumeQueue(directory, entries_per_file=10)
    assert reopened.max_offset == 20
    fill(reopened, 20, 26)
    checkpoint(reopened)
    assert reopened.entries(0, 100) == [expected(n) for n in range(26)]
    reopened.truncate_beyond(0)  # nothing survives: the lowest file stays, empty
    assert (reopened.min_offset, reopened.max_offset, files(directory)) == (0, 0, [0])


def test_drop_below_deletes_whole_files_and_reads_below_min_give_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = ConsumeQueue(directory, entries_per_file=10)
    fill(queue, 0, 45)
    checkpoint(queue)
    queue.drop_below(expected(27)[0] - 1)  # between entries 26 and 27
    assert queue.min_offset == 27
    assert files(directory) == [20, 30, 40]
    assert queue.entries(0, 5) == [expected(n) for n in range(27, 32)]
    assert queue.entries(10, 1) == [expected(27)]
    with pytest.raises(IndexError):
        queue.entry(26)
    queue.close()
    reopened = ConsumeQueue(directory, entries_per_file=10)
    assert (reopened.min_offset, reopened.max_offset) == (20, 45)  # the first file's start
    reopened.drop_below(expected(27)[0])
    assert reopened.min_offset == 27
    reopened.drop_below(10**9)  # everything: the last file keeps max_offset
    assert (reopened.min_offset, reopened.max_offset) == (45, 45)
    assert files(directory) == [40]
    assert reopened.entries(0, 100) == []
    reopened.close()
    last = ConsumeQueue(directory, entries_per_file=10)
    assert last.max_offset == 45
    fill(last, 45, 47)
    checkpoint(last)
    assert last.entries(45, 5) == [expected(45), expected(46)]


def test_offsets_skipped_by_a_rebuild_are_holes_that_readers_pass_over(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", entries_per_file=10)
    fill(queue, 0, 5)
    queue.append(8, *expected(8), tag="")  # offsets 5-7: records lost to damage
    fill(queue, 9, 30)
    checkpoint(queue)
    queue.reserve(35)  # offsets 30-34 lost at the end are never given to new records
    checkpoint(queue)
    queue.close()
    reopened = ConsumeQueue(tmp_path / "q", entries_per_file=10)
    survivors = [n for n in range(30) if not 5 <= n <= 7]
    assert reopened.max_offset == 35
    assert reopened.entries(0, 100) == [expected(n) for n in survivors]
    assert reopened.entries(5, 2) == [expected(8), expected(9)]  # a batch of holes reads on
    assert reopened.entries(30, 10) == []
    assert reopened.entry(6) == (expected(8)[0], 0) and reopened.entry(34) == (expected(29)[0], 0)
    reopened.truncate_beyond(expected(8)[0])  # holes point into the log in order
    assert reopened.max_offset == 5


def test_a_queue_rebuilt_after_retention_starts_with_a_hole_that_is_never_read(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = ConsumeQueue(directory, entries_per_file=10)
    fill(queue, 25, 32)
    assert (queue.min_offset, queue.max_offset) == (25, 32)
    checkpoint(queue)
    assert files(directory) == [20, 30]
    assert (directory / file_name(20)).read_bytes()[:100] == bytes(100)  # the hole
    queue.close()
    reopened = ConsumeQueue(directory, entries_per_file=10)
    reopened.drop_below(expected(0)[0])
    assert (reopened.min_offset, reopened.max_offset) == (25, 32)
    assert reopened.entries(0, 3) == [expected(n) for n in (25, 26, 27)]


def old_single_file(path: Path, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"".join(ENTRY.pack(*expected(n), tag_hash("")) for n in range(count)) + b"\x01\x02"
    )


def test_an_old_single_file_queue_is_converted_on_open(tmp_path: Path) -> None:
    path = tmp_path / "orders" / "3"
    old_single_file(path, 45)  # with a torn partial entry at the end
    queue = ConsumeQueue(path, entries_per_file=10)
    assert path.is_dir() and files(path) == [0, 10, 20, 30, 40]
    assert (queue.min_offset, queue.max_offset) == (0, 45)
    assert queue.entries(0, 100) == [expected(n) for n in range(45)]
    queue.close()
    # A crash after the old file was removed, before the rename: finished on open.
    path.rename(path.with_name("3.converting"))
    assert ConsumeQueue(path, entries_per_file=10).entries(0, 100) == [expected(n) for n in range(45)]
    # A crash while the files were being built: they are built again from the old file.
    other = tmp_path / "orders" / "4"
    old_single_file(other, 12)
    half = other.with_name("4.converting")
    half.mkdir()
    (half / file_name(0)).write_bytes(b"garbage")
    assert ConsumeQueue(other, entries_per_file=10).entries(0, 100) == [expected(n) for n in range(12)]
    assert not half.exists()


def record(queue_id: int, n: int) -> StoredRecord:
    return StoredRecord(topic="orders", queue_id=queue_id, body=f"{queue_id}:{n}".encode() * 5,
                        properties={"UNIQ_KEY": f"{queue_id}-{n}"})


TINY = StoreConfig(segment_size=4096, checkpoint_interval_s=3600, consume_queue_file_entries=8)


def test_the_store_reads_queues_across_files_converts_old_queues_and_pins_the_file_size(
    tmp_path: Path,
) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = store.put_batch([record(n % 2, n) for n in range(60)])
        assert [r.body for r in store.read_queue("orders", 1, 5, 10)] == [
            r.body for r in stored if r.queue_id == 1][5:15]
        middle = stored[33].store_timestamp_ms
        assert stored[store.offset_for_timestamp("orders", 1, middle) * 2 + 1].store_timestamp_ms >= middle
    queue_dir = tmp_path / "consumequeue" / "orders" / "0"
    assert files(queue_dir) == [0, 8, 16, 24]
    # Today's single-file layout, as a store from before this change left it.
    for queue_id in (0, 1):
        directory = tmp_path / "consumequeue" / "orders" / str(queue_id)
        data = b"".join((directory / file_name(first)).read_bytes() for first in files(directory))
        subprocess.run(["rm", "-rf", str(directory)], check=True)
        directory.write_bytes(data)
    with MessageStore(tmp_path, StoreConfig(segment_size=4096, consume_queue_file_entries=1000)) as store:
        assert store.config.consume_queue_file_entries == 8  # pinned by the directory
        for queue_id in (0, 1):
            assert [r.body for r in store.read_queue("orders", queue_id, 0, 100)] == [
                r.body for r in stored if r.queue_id == queue_id]
        assert store.put(record(0, 60)).queue_offset == 30
    assert files(queue_dir) == [0, 8, 16, 24]


def test_a_failed_write_leaves_no_partial_entry_and_is_retried(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes the kernel refuse writes past 300 bytes (EFBIG or a short write).
    script = r"""
import os, resource, signal, sys
from pathlib import Path
from broker_embedded.store.consume_queue import ConsumeQueue
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
queue = ConsumeQueue(Path(sys.argv[1]), entries_per_file=100)
for n in range(40):
    queue.append(n, 1000 + n, 10, "")
    if n == 4:
        queue.persist(*queue.unpersisted())
resource.setrlimit(resource.RLIMIT_FSIZE, (310, resource.RLIM_INFINITY))
try:
    queue.persist(*queue.unpersisted())
    print("written")
except OSError:
    print("refused", os.path.getsize(Path(sys.argv[1]) / f"{0:020d}"), queue.persisted)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
queue.persist(*queue.unpersisted())
print("retried", queue.persisted, queue.max_offset)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "q")],
                         capture_output=True, text=True, env=env, check=True)
    assert run.stdout.split("\n")[:2] == ["refused 100 5", "retried 40 40"], run.stdout + run.stderr
    queue = ConsumeQueue(tmp_path / "q", entries_per_file=100)
    assert queue.entries(0, 100) == [(1000 + n, 10) for n in range(40)]


@pytest.mark.slow
def test_sigkill_while_writing_keeps_every_acknowledged_record_once_in_its_queue(tmp_path: Path) -> None:
    queue_files = tmp_path / "consumequeue" / "load" / "0"
    # Killed once checkpoints crossed files (a fast store writes 2,000 records before the first).
    acknowledged = load_until_killed(tmp_path, 2000, until=lambda: queue_files.is_dir() and len(files(queue_files)) > 1,
                                     segment_size=64 * 1024, checkpoint_interval_s=0.05, consume_queue_file_entries=50)
    assert len(files(queue_files)) > 1
    with MessageStore(tmp_path) as store:
        assert store.config.consume_queue_file_entries == 50
        for w in range(4):
            seen = [r.properties["UNIQ_KEY"] for r in store.read_queue("load", w, 0, 10**6)]
            assert seen == [f"{w}-{n}" for n in range(len(seen))], "lost, doubled or reordered"
            acked = [a.message_id for a in acknowledged if a.writer == w]
            assert seen[: len(acked)] == acked


def resident_bytes() -> int:
    gc.collect()
    return rss_bytes()


def test_memory_does_not_grow_with_checkpointed_entries(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", entries_per_file=300_000)
    fill(queue, 0, 50_000)  # one checkpoint's worth warms up the allocator
    checkpoint(queue)
    before = resident_bytes()
    total = 550_000
    for start in range(50_000, total, 50_000):
        fill(queue, start, min(total, start + 50_000))
        checkpoint(queue)
    for start in range(0, total, 4096):  # reading everything back caches nothing either
        assert len(queue.entries(start, 4096)) == min(4096, total - start)
    grown = resident_bytes() - before
    # Entries held in memory (the old arrays) would take 20 bytes each, 34 measured.
    assert grown < 4 * total, f"RSS grew {grown} bytes for {total} entries"
    assert queue.entry(total - 1) == expected(total - 1)
