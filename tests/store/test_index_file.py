"""The on-disk index: chains, collisions, rolled files, crashes, rebuilds, retention, memory."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.filesystem import REAL, OsFileSystem
from broker_embedded.store.index import HEADER_SIZE, MessageIndex, key_hash
from broker_embedded.store.index_filter import KeyFilter, filter_path
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.damage import crash_image, index_files
from tests.store.load_writer import load_until_killed, rss_bytes
from tests.store.test_message_store import tiny_filesystem  # noqa: F401 (a fixture)

# Three slots and seven entries a file: every chain is long, every slot is shared, and a
# few hundred records fill dozens of files.
TINY = StoreConfig(segment_size=8192, checkpoint_interval_s=3600, index_slots=3, index_entries=7)


def record(topic: str = "orders", body: bytes = b"x" * 40, **props: str) -> StoredRecord:
    return StoredRecord(topic=topic, queue_id=0, body=body, properties=props)


def fill(store: MessageStore, count: int) -> list[StoredRecord]:
    return [
        store.put(record(topic=f"t{n % 2}", UNIQ_KEY=f"id{n}", KEYS=f"k{n % 5} all"))
        for n in range(count)
    ]


def fill_more(store: MessageStore, first: int, count: int) -> list[StoredRecord]:
    return [
        store.put(record(topic=f"t{n % 2}", UNIQ_KEY=f"id{n}", KEYS=f"k{n % 5} all"))
        for n in range(first, first + count)
    ]


def every_lookup(store: MessageStore, count: int) -> dict[str, list[int]]:
    found = {f"id{n}": store.lookup_message_id(f"id{n}") for n in range(count)}
    for topic in ("t0", "t1"):
        for key in [f"k{n}" for n in range(5)] + ["all"]:
            found[f"{topic}/{key}"] = store.lookup_key(topic, key)
    return found


def expected_lookups(stored: list[StoredRecord]) -> dict[str, list[int]]:
    expected = {r.properties["UNIQ_KEY"]: [r.commit_log_offset] for r in stored}
    for topic in ("t0", "t1"):
        for key in [f"k{n}" for n in range(5)] + ["all"]:
            expected[f"{topic}/{key}"] = [
                r.commit_log_offset for r in stored
                if r.topic == topic and key in r.properties["KEYS"].split()
            ]
    return expected


def test_lookups_with_long_chains_shared_slots_and_many_files_survive_reopen(tmp_path: Path) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 300)
        assert every_lookup(store, 300) == expected_lookups(stored)
        assert store.lookup_message_id("id300") == [] and store.lookup_key("t0", "k9") == []
    assert len(index_files(tmp_path)) >= 300 * 3 // 7
    with MessageStore(tmp_path, TINY) as store:
        assert every_lookup(store, 300) == expected_lookups(stored)
        many = store.put(record(UNIQ_KEY="many", KEYS=" ".join(f"m{n}" for n in range(20))))
        assert all(store.lookup_key("orders", f"m{n}") == [many.commit_log_offset] for n in range(20))
    with MessageStore(tmp_path, TINY) as store:  # a record's entries span four files
        assert store.lookup_message_id("many") == [many.commit_log_offset]
        assert store.lookup_key("orders", "m19") == [many.commit_log_offset]


def test_entries_written_after_the_last_header_are_found_and_extended_after_a_crash(tmp_path: Path) -> None:
    crashed = MessageIndex(tmp_path, slots=2, entries=1000)
    for offset in range(100):
        crashed.add("t", f"id{offset}", [f"k{offset % 3}"], offset)
    # No persist, no close: the header still says "empty", as after a crash.
    index = MessageIndex(tmp_path, slots=2, entries=1000)
    assert index.files[0].count == 200
    for offset in range(100, 150):  # appended after the counted entries, not over them
        index.add("t", f"id{offset}", [f"k{offset % 3}"], offset)
    assert [index.lookup_id(f"id{n}") for n in range(150)] == [[n] for n in range(150)]
    assert index.lookup_key("t", "k1") == list(range(1, 150, 3))
    crashed.close()
    index.close()


def test_replayed_records_are_skipped_and_rewound_ones_are_not_doubled(tmp_path: Path) -> None:
    index = MessageIndex(tmp_path, slots=4, entries=16)
    for offset in range(0, 100, 10):
        index.add("t", f"id{offset}", ["k"], offset)
    index.add("t", "other", ["k"], 50)  # at or below the highest indexed offset: skipped
    assert index.lookup_id("other") == []
    index.rewind(50)  # recovery replays from a checkpoint at 50
    for offset in range(50, 100, 10):
        index.add("t", f"id{offset}", ["k"], offset)
    assert index.lookup_key("t", "k") == list(range(0, 100, 10))
    assert index.lookup_id("id60") == [60]
    assert sum(file.count for file in index.files) == 30  # the duplicates are on disk
    index.close()


def test_the_hashes_at_an_offset_are_those_of_its_record_across_rolled_files(tmp_path: Path) -> None:
    """What ``salvaged_id`` is given: the hashes of a record's own entries (its id's,
    then its keys'), found by offset in files of seven entries, a record's entries split
    across two files too; an offset no record was indexed at has none."""
    index = MessageIndex(tmp_path, slots=3, entries=7)
    expected = {}
    for n, offset in enumerate(range(0, 400, 10)):
        keys = [f"k{n}", "all"][: n % 3]
        index.add("t", f"id{n}" if n % 4 else None, keys, offset)
        expected[offset] = {key_hash("i", "", f"id{n}")} if n % 4 else set()
        expected[offset] |= {key_hash("k", "t", key) for key in keys}
    assert len(index.files) > 5
    for offset, hashes in expected.items():
        assert index.hashes_at(offset) == hashes, offset
    assert index.hashes_at(5) == set() and index.hashes_at(400) == set()
    index.close()


def _torn_store(tmp_path: Path) -> StoredRecord:
    """A store whose last record is cut in half after it was indexed."""
    with MessageStore(tmp_path, TINY) as store:
        for n in range(5):
            store.put(record(UNIQ_KEY=f"keep{n}", KEYS="k"))
        last = store.put(record(body=b"torn" * 10, UNIQ_KEY="torn-id", KEYS="k"))
    os.remove(tmp_path / "checkpoint")  # as after a crash between checkpoints
    segment = sorted((tmp_path / "commitlog").iterdir())[-1]
    with segment.open("r+b") as f:
        f.truncate(last.commit_log_offset - int(segment.name) + last.size // 2)
    return last


def test_a_stale_entry_past_a_torn_tail_is_never_returned(tmp_path: Path) -> None:
    torn = _torn_store(tmp_path)
    with MessageStore(tmp_path, TINY) as store:
        assert store.index.lookup_id("torn-id") == []  # recovery drops entries past the recovered end
        assert store.lookup_message_id("torn-id") == []
        assert torn.commit_log_offset not in store.lookup_key("orders", "k")
        # Another record now starts where the torn one did: found under its own id only.
        again = store.put(record(topic="other", UNIQ_KEY="new-id", KEYS="k"))
        assert again.commit_log_offset == torn.commit_log_offset
        assert store.lookup_message_id("torn-id") == []
        assert store.lookup_message_id("new-id") == [again.commit_log_offset]
        assert torn.commit_log_offset not in store.lookup_key("orders", "k")
        assert store.lookup_key("other", "k") == [again.commit_log_offset]
    with MessageStore(tmp_path, TINY) as store:
        assert store.lookup_message_id("torn-id") == []
        assert store.lookup_message_id("new-id") == [again.commit_log_offset]
        assert len(store.lookup_key("orders", "k")) == 5


def test_a_deleted_index_is_rebuilt_with_the_same_lookups_and_bytes(tmp_path: Path) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 120)
    files = {path.name: path.read_bytes() for path in (tmp_path / "index").iterdir()}
    shutil.rmtree(tmp_path / "index")
    with MessageStore(tmp_path, TINY) as store:
        assert every_lookup(store, 120) == expected_lookups(stored)
    assert {path.name: path.read_bytes() for path in (tmp_path / "index").iterdir()} == files


@pytest.mark.parametrize("damage", ["garbage header", "cut short", "legacy line file"])
def test_an_unreadable_or_legacy_index_is_rebuilt_with_a_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 60)
    index_dir = tmp_path / "index"
    middle = index_files(tmp_path)[5]
    if damage == "garbage header":
        with middle.open("r+b") as f:
            f.write(os.urandom(HEADER_SIZE))
    elif damage == "cut short":
        with middle.open("r+b") as f:
            f.truncate(HEADER_SIZE + 10)
    else:
        shutil.rmtree(index_dir)
        index_dir.mkdir()
        (index_dir / "index.log").write_text("iorders\x1fid0\x1f0\n")
    with caplog.at_level(logging.WARNING), MessageStore(tmp_path, TINY) as store:
        assert every_lookup(store, 60) == expected_lookups(stored)
    assert not (index_dir / "index.log").exists()
    if damage != "legacy line file":
        assert "rebuilding the index" in caplog.text


def test_retention_deletes_index_files_below_the_log_minimum(tmp_path: Path) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 300)
        before = [path.name for path in index_files(tmp_path)]
        assert store.delete_expired_segments(now_ms=2**62) > 0
        first = store.commitlog.min_offset
        after = [path.name for path in index_files(tmp_path)]
        assert before[0] not in after and after == before[-len(after):]
        assert all(file.high_offset >= first for file in store.index.files)
        kept = [r for r in stored if r.commit_log_offset >= first]
        gone: dict[str, list[int]] = {f"id{n}": [] for n, r in enumerate(stored) if r.commit_log_offset < first}
        assert gone and every_lookup(store, 300) == gone | expected_lookups(kept)
    with MessageStore(tmp_path, TINY) as store:
        assert store.lookup_message_id("id299") == [stored[-1].commit_log_offset]


@pytest.mark.slow
def test_every_acknowledged_record_is_found_by_id_after_sigkill(tmp_path: Path) -> None:
    acknowledged = load_until_killed(tmp_path, 4000, segment_size=64 * 1024, checkpoint_interval_s=0.2,
                                     index_slots=64, index_entries=500)
    assert len(index_files(tmp_path)) > 4
    with MessageStore(tmp_path) as store:
        for a in acknowledged:
            assert store.lookup_message_id(a.message_id) == [a.commit_log_offset], a.message_id
        for w in range(4):
            by_key = store.lookup_key("load", f"w{w}")
            acked = sorted(a.commit_log_offset for a in acknowledged if a.writer == w)
            assert by_key[: len(acked)] == acked
            assert len(by_key) == store.queue_max_offset("load", w)


def test_memory_does_not_grow_with_indexed_entries(tmp_path: Path) -> None:
    index = MessageIndex(tmp_path, slots=1 << 16, entries=1 << 17)  # three files
    for offset in range(1000):  # warm up the allocator and the first file
        index.add("orders", f"warm-{offset}", [], offset)
    before = rss_bytes()
    for offset in range(1000, 151_000):
        index.add("orders", f"message-{offset:012d}", [f"order-{offset % 50_000}"], offset)
    grown = rss_bytes() - before
    entries = 300_000
    assert grown < 20 * entries, f"{grown / entries:.1f} bytes per entry"
    assert index.lookup_id("message-000000100000") == [100_000]
    assert len(index.lookup_key("orders", "order-7")) == 3
    assert len(index.files) == 3
    index.close()


def test_entries_a_full_disk_refused_are_indexed_at_the_next_open(
    tmp_path: Path, tiny_filesystem: Path,  # noqa: F811
) -> None:
    # The index on a small filesystem of its own, the commit log on the large one: index
    # writes fail while appends go on.
    data_dir = tmp_path / "store"
    data_dir.mkdir()
    (data_dir / "index").symlink_to(tiny_filesystem)
    config = StoreConfig(segment_size=32 * 1024, checkpoint_interval_s=3600, index_slots=1 << 10)
    with MessageStore(data_dir, config) as store:
        stored = store.put_batch([record(body=b"", UNIQ_KEY=f"id{n}") for n in range(300)])
        ballast = os.open(tiny_filesystem / "ballast", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError):  # fill the index's disk
            while True:
                os.write(ballast, b"b" * 4096)
        os.close(ballast)
        stored += [store.put(record(body=b"", UNIQ_KEY=f"id{len(stored) + n}")) for n in range(300)]
        assert store.index.failed_from is not None
        assert store.lookup_message_id("id599") == []  # a refused entry
        (tiny_filesystem / "ballast").unlink()  # space for the closing checkpoint, which stays below it
    with MessageStore(data_dir, config) as store:
        assert [store.lookup_message_id(f"id{n}") for n in range(len(stored))] == [
            [r.commit_log_offset] for r in stored
        ]
        assert store.put(record()).queue_offset == 600


class IndexPreads(OsFileSystem):
    """The real file system, counting the preads of index files (a filter is memory-mapped,
    not read) and refusing to write filters while ``full``."""

    def __init__(self) -> None:
        self.index_preads = 0
        self.full = False
        self._index_fds: set[int] = set()
        self._filter_fds: set[int] = set()

    def open(self, path: Path, *, create: bool = False, truncate: bool = False, read_only: bool = False) -> int:
        fd = super().open(path, create=create, truncate=truncate, read_only=read_only)
        is_filter = ".filter" in path.name
        for fds, wanted in ((self._index_fds, path.parent.name == "index" and not is_filter),
                            (self._filter_fds, is_filter)):
            (fds.add if wanted else fds.discard)(fd)
        return fd

    def pread(self, fd: int, length: int, position: int) -> bytes:
        self.index_preads += fd in self._index_fds
        return super().pread(fd, length, position)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        if self.full and fd in self._filter_fds:
            raise OSError(errno.ENOSPC, "no space left for an index filter")
        return super().pwrite(fd, data, position)


def test_full_index_files_get_filters_that_spare_lookups_of_absent_keys_their_reads(tmp_path: Path) -> None:
    fs = IndexPreads()
    config = replace(TINY, filesystem=fs)
    with MessageStore(tmp_path, config) as store:
        stored = fill(store, 298)
        closed = index_files(tmp_path)[:-1]
        assert len(closed) > 100 and all(filter_path(path).exists() for path in closed)
        assert not filter_path(index_files(tmp_path)[-1]).exists()  # the newest's is in memory
    assert filter_path(index_files(tmp_path)[-1]).exists()  # written at the clean close
    with MessageStore(tmp_path, config) as store:
        assert not filter_path(index_files(tmp_path)[-1]).exists()  # read back, and its keys added to
        stored += fill_more(store, 298, 2)
        assert every_lookup(store, 300) == expected_lookups(stored)  # no key a filter misses
        crashed = crash_image(tmp_path, tmp_path.with_name(tmp_path.name + "-crashed"))
    with MessageStore(crashed, TINY) as store:  # the newest's filter built from its entries
        assert every_lookup(store, 300) == expected_lookups(stored)
    with MessageStore(tmp_path, config) as store:
        fs.index_preads = 0
        assert all(store.lookup_message_id(f"absent-{n}") == [] for n in range(200))
        # without filters: a slot and a chain of ~2 entries in each of the files, per lookup
        assert fs.index_preads < 200 * len(closed) / 5, fs.index_preads


@pytest.mark.parametrize("damage", ["a flipped bit", "another file's", "cut short", "missing"])
def test_a_filter_that_is_not_its_files_is_not_used_and_lookups_stay_whole(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 60)
    victim = filter_path(index_files(tmp_path)[3])
    if damage == "a flipped bit":  # one key's bit cleared: without the CRC a lookup would miss it
        data = bytearray(victim.read_bytes())
        data[-8:] = bytes(8)
        victim.write_bytes(bytes(data))
    elif damage == "another file's":
        shutil.copy(filter_path(index_files(tmp_path)[4]), victim)
    elif damage == "cut short":
        with victim.open("r+b") as f:
            f.truncate(20)
    else:
        victim.unlink()
    with caplog.at_level(logging.INFO), MessageStore(tmp_path, TINY) as store:
        assert every_lookup(store, 60) == expected_lookups(stored)
        stored += fill_more(store, 60, 30)
        assert every_lookup(store, 90) == expected_lookups(stored)
    name = index_files(tmp_path)[3].name
    assert f"1 index files ({name} to {name}) have no filter" in caplog.text
    assert (f"the filter of index file {name} is not used" in caplog.text) is (damage != "missing")


def test_a_filter_the_disk_refuses_leaves_its_file_looked_up_without_one(tmp_path: Path) -> None:
    fs = IndexPreads()
    fs.full = True
    with MessageStore(tmp_path, replace(TINY, filesystem=fs)) as store:
        stored = fill(store, 40)
        assert every_lookup(store, 40) == expected_lookups(stored)
        fs.full = False
        stored += fill_more(store, 40, 40)
        assert every_lookup(store, 80) == expected_lookups(stored)
    files = index_files(tmp_path)
    unfiltered = [path for path in files[:-1] if not filter_path(path).exists()]
    assert unfiltered and unfiltered == files[: len(unfiltered)]  # the files sealed while the disk was full
    assert not list((tmp_path / "index").glob("*.tmp"))
    with MessageStore(tmp_path, TINY) as store:
        assert every_lookup(store, 80) == expected_lookups(stored)


def test_filters_go_with_their_files_and_a_leftover_one_is_removed(tmp_path: Path) -> None:
    with MessageStore(tmp_path, TINY) as store:
        stored = fill(store, 300)
        assert store.delete_expired_segments(now_ms=2**62) > 0
        kept = {path.name for path in index_files(tmp_path)}
        assert {path.name.removesuffix(".filter") for path in (tmp_path / "index").glob("*.filter")} <= kept
    orphan = tmp_path / "index" / "0000000000.filter"  # a crash between a file's unlink and its filter's
    shutil.copy(filter_path(index_files(tmp_path)[0]), orphan)
    with MessageStore(tmp_path, TINY) as store:
        assert not orphan.exists()
        assert store.lookup_message_id("id299") == [stored[-1].commit_log_offset]


@given(st.lists(st.integers(min_value=1, max_value=2**64 - 1), max_size=300), st.integers(min_value=1, max_value=400))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_filter_holds_every_key_added_to_it_in_memory_and_from_its_file(
    tmp_path: Path, hashes: list[int], capacity: int,
) -> None:
    added = KeyFilter.empty(capacity)
    added.add((h, 0) for h in hashes)
    path = tmp_path / "0000000001"
    added.write(path, len(hashes), 5, REAL)
    mapped = KeyFilter.open(path, capacity, len(hashes), 5, REAL)
    try:
        assert all(added.may_contain(h) and mapped.may_contain(h) for h in hashes)
        probes = [h * 0x9E3779B97F4A7C15 % 2**64 or 1 for h in range(1, 200)]
        assert [added.may_contain(h) for h in probes] == [mapped.may_contain(h) for h in probes]
    finally:
        mapped.close()


def test_a_crash_costs_the_next_open_only_the_keys_added_since_a_checkpoint_wrote_the_newest_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = replace(TINY, index_slots=64, index_entries=4096)  # one file, its filter written every 512
    with MessageStore(tmp_path, config) as store:
        stored = fill(store, 300)  # 900 entries
        store.checkpoint()
        newest = index_files(tmp_path)[-1]
        assert filter_path(newest).exists()
        stored += fill_more(store, 300, 20)
        crashed = crash_image(tmp_path, tmp_path.with_name(tmp_path.name + "-crashed"))
    rebuilt = crash_image(crashed, tmp_path.with_name(tmp_path.name + "-rebuilt"))
    filter_path(index_files(rebuilt)[-1]).unlink()
    keys = [0]  # the keys added to filters
    add = KeyFilter.add

    def counted(self: KeyFilter, entries: Iterable[tuple[int, int]]) -> None:
        listed = list(entries)
        keys[0] += len(listed)
        add(self, listed)

    monkeypatch.setattr(KeyFilter, "add", counted)
    with MessageStore(rebuilt, config) as store:  # no filter: built from the file's 960 entries
        built, keys[0] = keys[0], 0
        assert every_lookup(store, 320) == expected_lookups(stored)
    keys[0] = 0
    with MessageStore(crashed, config) as store:
        assert not filter_path(index_files(crashed)[-1]).exists()  # read back, then deleted
        completed = keys[0]
        assert every_lookup(store, 320) == expected_lookups(stored)
        stored += fill_more(store, 320, 10)
        store.checkpoint()  # the next one writes it anew
        assert filter_path(index_files(crashed)[-1]).exists()
        again = crash_image(crashed, tmp_path.with_name(tmp_path.name + "-again"))
    with MessageStore(again, TINY) as store:
        assert every_lookup(store, 330) == expected_lookups(stored)
    # both opens add the keys of the records recovery indexes again (the 60 entries after the
    # checkpoint); without the filter file, all 960 entries' keys besides
    assert built >= 960 and completed <= built - 800, (completed, built)
