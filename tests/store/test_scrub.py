"""The scrub and the read path over damage below the checkpoint (issue 21 finding 4).

Every directory is written by a real store or broker, closed, then damaged on disk; the
tests know which records the damage destroyed and check the loss ledger, the readers and
the scrub's chunked reads against that.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded import BrokerConfig, EmbeddedBroker, Message
from broker_embedded.http.readiness import Readiness
from broker_embedded.store import scrub, verify
from broker_embedded.store.commitlog import Gap, Segment, walk
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.damage import drain, flip, segments, zero

PAGE = 4096
STORE = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600, index_slots=1024, index_entries=4096,
                    scrub_bytes_per_s=0)


def written(data: Path, count: int = 1200, config: StoreConfig = STORE) -> dict[int, tuple[int, str]]:
    """A closed store of ``count`` records in topic ``orders`` (4 queues); every record's
    commit log offset -> (size, message id)."""
    with MessageStore(data, config) as store:
        stored = store.put_batch([StoredRecord("orders", n % 4, f"body {n}".encode() * 8, {"UNIQ_KEY": f"id{n}"})
                                  for n in range(count)])
    return {r.commit_log_offset: (r.size, r.properties["UNIQ_KEY"]) for r in stored}


def zero_page(data: Path, records: dict[int, tuple[int, str]], segment: int = 1, page: int = 2) -> set[str]:
    """Zero a 4 KiB page of a closed segment; the ids of the records overlapping it."""
    start = int(segments(data)[segment].name) + page * PAGE
    zero(data, start, PAGE)
    return {message_id for offset, (size, message_id) in records.items()
            if offset < start + PAGE and offset + size > start}


def test_the_scrub_records_a_zeroed_page_once_across_passes_and_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = written(tmp_path)
    destroyed = zero_page(tmp_path, records)
    with caplog.at_level(logging.INFO), MessageStore(tmp_path, STORE) as store:
        [loss] = store.scrub.run_pass()
        assert loss.found_by == "scrub" and loss.records == len(destroyed) > 10
        assert set(loss.message_ids) <= destroyed and loss.unnamed == len(destroyed) - len(loss.message_ids)
        assert store.scrub.run_pass() == []
        assert (store.scrub.stats.passes, store.scrub.stats.damaged_ranges) == (2, 1)
    assert [r.levelname for r in caplog.records if "messages lost" in r.getMessage()] == ["ERROR"]
    progress = [r.getMessage() for r in caplog.records if r.name == "broker_embedded.store.scrub"]
    assert any("checking" in line for line in progress) and any("pass done" in line for line in progress)
    with MessageStore(tmp_path, STORE) as store:
        assert store.scrub.run_pass() == []
        assert [loss.records for loss in store.losses.open_losses()] == [len(destroyed)]


def test_the_scrub_thread_finds_damage_when_the_store_opens(tmp_path: Path) -> None:
    records = written(tmp_path)
    destroyed = zero_page(tmp_path, records, segment=2, page=5)
    with MessageStore(tmp_path, replace(STORE, scrub_bytes_per_s=64 * 1024 * 1024)) as store:
        deadline = time.monotonic() + 30
        while store.scrub.stats.passes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.scrub.stats.passes == 1  # and the next pass is a day (scrub_interval_s) away
        assert [loss.records for loss in store.losses.open_losses()] == [len(destroyed)]


def test_a_reader_skips_damaged_records_records_the_loss_and_nothing_blocks_the_queue(tmp_path: Path) -> None:
    """Fails on the old store: the first damaged record raised CorruptLogError in every
    receive, and a fresh group got nothing."""
    config = BrokerConfig(store=STORE)
    with EmbeddedBroker(tmp_path, config) as broker:
        for start in range(0, 1200, 100):
            broker.send_batch([Message("orders", f"body {n}".encode() * 8, message_id=f"id{n}")
                               for n in range(start, start + 100)])
        records = {r.commit_log_offset: (r.size, r.properties["UNIQ_KEY"]) for r in broker.store.scan()}
    destroyed = zero_page(tmp_path, records)
    last = max(records)  # the newest record, last of its queue: a damaged tail must not hold the floor
    flip(tmp_path, last + records[last][0] - 5)  # in the body: the queue checks at start still pass
    destroyed.add(records[last][1])
    with EmbeddedBroker(tmp_path, config) as broker:
        received = drain(broker, "fresh-group", "orders")
        assert len(received) == len(records) - len(destroyed)
        assert broker.consumers.lag() == {"fresh-group": {"orders": 0}}
        losses = broker.store.losses.open_losses()
        assert sum(loss.records for loss in losses) == len(destroyed)
        assert all("found by a reader" in loss.detail for loss in losses)
        assert drain(broker, "second-group", "orders") and len(broker.store.losses.all()) == len(losses)
        assert broker.store.scrub.run_pass() == []  # the readers recorded every damaged range


def test_the_broker_is_degraded_until_an_operator_acknowledges_the_losses(tmp_path: Path) -> None:
    destroyed = zero_page(tmp_path, written(tmp_path))
    readiness = Readiness()
    with EmbeddedBroker(tmp_path, BrokerConfig(store=STORE)) as broker:
        readiness.broker = broker
        assert readiness.degraded() == []  # no scrub thread here: nothing found yet
        assert broker.store.scrub.run_pass()
        [reason] = readiness.degraded()
        assert reason.startswith(f"{len(destroyed)} messages lost in 1 damaged")
        broker.store.losses.acknowledge()
        assert readiness.degraded() == []
        assert broker.store.scrub.run_pass() == []  # an acknowledged range is not recorded again


def test_a_search_by_timestamp_passes_a_damaged_record(tmp_path: Path) -> None:
    written(tmp_path, 400)  # queue 0 holds offsets 0..99; a search by time reads offset 50 first
    with MessageStore(tmp_path, STORE) as store:
        [middle] = store.read_queue("orders", 0, 50, 1)
    flip(tmp_path, middle.commit_log_offset + middle.size - 3)
    with MessageStore(tmp_path, STORE) as store:
        assert store.offset_for_timestamp("orders", 0, 0) == 0
        assert [loss.records for loss in store.losses.open_losses()] == [1]


@pytest.mark.parametrize("seed", range(3))
def test_the_chunked_reads_find_what_a_whole_segment_walk_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Small chunks, records bigger than a chunk, damage across chunk boundaries: the
    scrub's bounded reads see the same records and gaps as ``walk`` over the whole segment."""
    rng = random.Random(seed)
    config = replace(STORE, segment_size=512 * 1024)
    with MessageStore(tmp_path, config) as store:
        store.put_batch([StoredRecord("orders", 0, rng.randbytes(rng.choice([50, 300, 9000, 40000])))
                         for _ in range(60)])
    path = segments(tmp_path)[0]
    size = path.stat().st_size
    for _ in range(4):
        start = rng.randrange(size - PAGE)
        if rng.random() < 0.5:
            zero(tmp_path, start, rng.randrange(1, PAGE))
        else:
            flip(tmp_path, start)
    monkeypatch.setattr(scrub, "CHUNK", 4096)
    expected = [item if isinstance(item, Gap) else item.size
                for item in walk(path.read_bytes(), 0, 0, config.segment_size)]
    segment = Segment(path, 0, config.segment_size)
    reader = scrub._SegmentReader(segment, size, scrub._Throttle(0, threading.Event()))
    try:
        found = list(reader.items(0))
    finally:
        reader.close()
        segment.close()
    assert [(g.start, g.end, g.kind) if isinstance(g, Gap) else g for g in found] == \
        [(g.start, g.end, g.kind) if isinstance(g, Gap) else g for g in expected]
    assert any(isinstance(item, Gap) for item in found)


def test_scrub_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="scrub_bytes_per_s"):
        StoreConfig(scrub_bytes_per_s=-1)
    with pytest.raises(ValueError, match="scrub_interval_s"):
        StoreConfig(scrub_interval_s=0)


def test_a_damaged_header_naming_another_stored_message_is_counted_not_named(tmp_path: Path) -> None:
    """A flipped bit turns the id in a damaged record's header into another message's
    ("m11" reads "m19"): the reader's loss counts the record and names nobody, not the
    intact m19 (an operator would resend the wrong message)."""
    with MessageStore(tmp_path, STORE) as store:
        stored = {n: store.put(StoredRecord("orders", n % 2, b"body" * 8, {"UNIQ_KEY": f"m{n}"}))
                  for n in range(10, 30)}
    damaged = stored[11]
    segment = segments(tmp_path)[0]
    data = bytearray(segment.read_bytes())
    where = data.index(b"m11", damaged.commit_log_offset, damaged.commit_log_offset + damaged.size)
    data[where + 2] = ord("9")
    segment.write_bytes(bytes(data))
    with MessageStore(tmp_path, STORE) as store:
        assert [r.properties["UNIQ_KEY"] for r in store.read_queue("orders", 1, 0, 100)] == \
            [f"m{n}" for n in range(11, 30, 2) if n != 11]
        [loss] = store.losses.all()
        assert loss.message_ids == () and loss.records == 1, loss
        assert loss.places == (("orders", 1, damaged.queue_offset),)
        assert store.lookup_message_id("m19") == [stored[19].commit_log_offset]


def test_a_damaged_header_naming_a_message_not_sent_yet_is_counted_not_named(tmp_path: Path) -> None:
    """A flipped bit turns the id in a damaged record's header into one no message has yet
    ("m11" reads "m99"): nothing intact holds m99, but the record's index entry holds m11's
    hash, which denies it; the loss counts the record and names nobody (m99, sent later,
    would stand in the ledger as lost while readable)."""
    with MessageStore(tmp_path, STORE) as store:
        stored = {n: store.put(StoredRecord("orders", 0, b"body" * 8, {"UNIQ_KEY": f"m{n}", "KEYS": f"k{n}"}))
                  for n in range(10, 20)}
    damaged = stored[11]
    segment = segments(tmp_path)[0]
    data = bytearray(segment.read_bytes())
    where = data.index(b"m11", damaged.commit_log_offset, damaged.commit_log_offset + damaged.size)
    data[where + 1: where + 3] = b"99"
    segment.write_bytes(bytes(data))
    with MessageStore(tmp_path, STORE) as store:
        assert len(store.read_queue("orders", 0, 0, 100)) == 9
        [loss] = store.losses.all()
        assert (loss.message_ids, loss.records) == ((), 1), loss
        store.put(StoredRecord("orders", 0, b"body" * 8, {"UNIQ_KEY": "m99"}))
        assert [message_id for loss in store.losses.all() for message_id in loss.message_ids] == []


def test_a_damaged_record_whose_own_index_entries_hold_its_id_is_named_beside_an_intact_copy(tmp_path: Path) -> None:
    """A message stored twice (a resend, a DLQ copy: two records with one id), the first's
    magic damaged (no reader takes its header): what is left of its header says m11 and its
    own index entries hold m11's hash, so no flipped bit made the id; the loss names m11,
    as fsck does, though an intact record elsewhere holds the id too."""
    with MessageStore(tmp_path, STORE) as store:
        damaged = store.put(StoredRecord("orders", 0, b"body" * 8, {"UNIQ_KEY": "m11"}))
        store.put(StoredRecord("orders", 0, b"next" * 8, {"UNIQ_KEY": "m12"}))
        copy = store.put(StoredRecord("orders", 1, b"body" * 8, {"UNIQ_KEY": "m11"}))
    segment = segments(tmp_path)[0]
    data = bytearray(segment.read_bytes())
    data[damaged.commit_log_offset + 5] ^= 0x01  # the magic
    segment.write_bytes(bytes(data))
    assert [lost.message_id for lost in verify.check(tmp_path).lost] == ["m11"]
    with MessageStore(tmp_path, STORE) as store:
        assert [r.properties["UNIQ_KEY"] for r in store.read_queue("orders", 0, 0, 100)] == ["m12"]
        [loss] = store.losses.all()
        assert (loss.message_ids, loss.records) == (("m11",), 1), loss
        assert store.lookup_message_id("m11") == [copy.commit_log_offset]


def test_recovery_counts_a_damaged_record_whose_header_names_another_message(tmp_path: Path) -> None:
    """Recovery replays past the last record, damaged, below the checkpoint (its queue entry
    lost, so the queue is rebuilt from there) whose header's id a flipped bit made another
    stored message's: the store opens (nothing was replayed before the lookup that checks
    the name), and the loss counts the record and names nobody."""
    with MessageStore(tmp_path, STORE) as store:
        intact = store.put(StoredRecord("orders", 0, b"body" * 8, {"UNIQ_KEY": "m19"}))
        damaged = store.put(StoredRecord("orders", 0, b"body" * 8, {"UNIQ_KEY": "m11"}))
    segment = segments(tmp_path)[0]
    data = bytearray(segment.read_bytes())
    data[data.index(b"m11", damaged.commit_log_offset, damaged.commit_log_offset + damaged.size) + 2] = ord("9")
    segment.write_bytes(bytes(data))
    queue_file = next((tmp_path / "consumequeue" / "orders" / "0").iterdir())
    os.truncate(queue_file, queue_file.stat().st_size - 20)  # the damaged record's entry
    with MessageStore(tmp_path, STORE) as store:
        [loss] = store.losses.all()
        assert loss.found_by == "recovery" and loss.message_ids == () and loss.records == 1, loss
        assert [r.commit_log_offset for r in store.read_queue("orders", 0, 0, 100)] == [intact.commit_log_offset]


#: A scrub that checks one of ``STORE``'s segments a second, and one that checks them all at once.
SLOW_SCRUB = replace(STORE, scrub_bytes_per_s=STORE.segment_size)
FAST_SCRUB = replace(STORE, scrub_bytes_per_s=64 * 1024 * 1024)

#: Opens the store of ``sys.argv[1]`` with a slow scrub and prints the bytes it has checked
#: until it is killed.
CHECKING = """
import sys, time
from dataclasses import replace
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
config = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600, index_slots=1024, index_entries=4096,
                     scrub_bytes_per_s=64 * 1024)
with MessageStore(sys.argv[1], config) as store:
    while True:
        print(store.scrub.stats.checked_bytes, flush=True)
        time.sleep(0.01)
"""


def _first_pass(store: MessageStore) -> None:
    deadline = time.monotonic() + 30
    while store.scrub.stats.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.scrub.stats.passes == 1


def _scrub_two_segments_then_stop(data: Path, how: str) -> None:
    """The background scrub checks the first two segments of ``data`` and is stopped
    before the third: by closing the store, or by a SIGKILL of its process."""
    two = 2 * STORE.segment_size
    if how == "close":
        with MessageStore(data, SLOW_SCRUB) as store:
            deadline = time.monotonic() + 30
            while store.scrub.stats.checked_bytes < two and time.monotonic() < deadline:
                time.sleep(0.01)
        return
    child = subprocess.Popen([sys.executable, "-c", CHECKING, str(data)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if int(line) >= two:
                break
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("how", ["close", "sigkill"])
def test_a_pass_a_restart_interrupted_resumes_where_it_was(tmp_path: Path, how: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A restart does not begin the pass again from the oldest segment: a broker restarted
    more often than a pass takes would otherwise never have its newest segments checked."""
    records = written(tmp_path, 1500)
    assert len(segments(tmp_path)) >= 4
    _scrub_two_segments_then_stop(tmp_path, how)
    checked_before = zero_page(tmp_path, records, segment=0)
    not_yet = zero_page(tmp_path, records, segment=3)
    with caplog.at_level(logging.INFO, logger="broker_embedded.store.scrub"), \
            MessageStore(tmp_path, FAST_SCRUB) as store:
        _first_pass(store)
        assert [loss.records for loss in store.losses.open_losses()] == [len(not_yet)]
        assert "resuming the pass a restart interrupted" in caplog.text
        assert not (tmp_path / scrub.STATE_FILE).exists()  # the pass ended
        assert [loss.records for loss in store.scrub.run_pass()] == [len(checked_before)]
    with MessageStore(tmp_path, FAST_SCRUB) as store:
        _first_pass(store)  # a new pass, from the oldest segment
        assert store.scrub.stats.checked_bytes >= sum(path.stat().st_size for path in segments(tmp_path)[:3])


@pytest.mark.parametrize("state", [b'{"resume_at": ', b"[]", b"{}", b'{"resume_at": -5}', b'{"resume_at": true}',
                                   b"\xff\xfe", b""])
def test_an_unreadable_scrub_state_starts_the_pass_from_the_oldest_segment(
        tmp_path: Path, state: bytes, caplog: pytest.LogCaptureFixture) -> None:
    destroyed = zero_page(tmp_path, written(tmp_path), segment=0)
    (tmp_path / scrub.STATE_FILE).write_bytes(state)
    with caplog.at_level(logging.WARNING, logger="broker_embedded.store.scrub"), \
            MessageStore(tmp_path, FAST_SCRUB) as store:
        _first_pass(store)
        assert [loss.records for loss in store.losses.open_losses()] == [len(destroyed)]
    assert "unreadable" in caplog.text
    assert not (tmp_path / scrub.STATE_FILE).exists()
