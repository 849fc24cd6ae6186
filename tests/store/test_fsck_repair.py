"""``halfmoon-broker fsck`` and ``repair`` on damaged data directories (issue 10, finding 3).

Each directory is written by a real store or broker and damaged on disk; the tools run
through the real CLI; after a repair the store or broker must open, every intact record
must be readable, and it must stay so across restarts.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.cli.main import main
from broker_embedded.errors import CorruptLogError
from broker_embedded.store import codec
from broker_embedded.store.consume_queue import ENTRY_SIZE, file_name
from broker_embedded.store.filesystem import REAL
from broker_embedded.store.index import IndexFile
from broker_embedded.store.index_filter import KeyFilter, filter_path
from broker_embedded.store.losses import LossLedger, Place
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.verify import _match
from tests.store.damage import (
    crash_image,
    cut,
    fingerprint,
    flip,
    index_files,
    retype,
    segments,
    zero,
)
from tests.store.test_damaged_files import BROKER, STORE, RecordingChecker, crashed_store, record

ROOT = Path(__file__).parents[2]


def tool(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """Run ``fsck``/``repair`` with ``--json`` through the CLI: (exit code, report)."""
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def clean_once_acknowledged(capsys: pytest.CaptureFixture[str], data: Path, lost: set[str]) -> None:
    """After a repair that lost records: fsck fails on its open losses (one per damaged or
    missing range, naming some of ``lost``, none else) until ``losses --acknowledge``, then
    passes."""
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    named = [message_id for loss in report["open_losses"] for message_id in loss["message_ids"]]
    assert code == 1 and report["open_losses"] and set(named) <= lost
    assert tool(capsys, "losses", "--data-dir", str(data), "--acknowledge")[0] == 0
    assert tool(capsys, "fsck", "--data-dir", str(data))[0] == 0


def ids(store: MessageStore, topic: str = "orders", queue_id: int = 0) -> list[str]:
    return [r.properties["UNIQ_KEY"] for r in store.read_queue(topic, queue_id, 0, 10_000)]


def test_fsck_of_a_clean_directory_exits_0_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MessageStore(tmp_path, STORE) as store:
        for n in range(300):
            store.put(record(n, queue_id=n % 3))
    before = fingerprint(tmp_path)
    code, report = tool(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 0, report
    assert (report["ok"], report["records"], report["problems"], report["lost"]) == (True, 300, [], [])
    assert fingerprint(tmp_path) == before


def test_a_zeroed_header_is_found_by_fsck_and_salvaged_by_repair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, stored = crashed_store(tmp_path, count=400)
    victim = stored[-30]
    zero(data, victim.commit_log_offset, 12)
    before = fingerprint(data)
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and not report["ok"]
    assert fingerprint(data) == before
    assert [(g["start"], g["end"], g["kind"]) for g in report["gaps"]] == [
        (victim.commit_log_offset, victim.commit_log_offset + victim.size, "damaged")
    ]
    assert [(m["message_id"], m["queue_offset"]) for m in report["lost"]] == [("id370", 370)]

    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1  # records were lost
    assert [m["message_id"] for m in repaired["lost"]] == ["id370"]
    moved = Path(repaired["moved_to"])
    assert moved.parent == data / "damaged"
    aside = {p.name: p.read_bytes() for p in moved.iterdir() if p.name != "report.json"}
    assert [len(b) for b in aside.values()] == [victim.size]
    assert repaired["salvaged_records"] == 399
    for restart in range(2):
        with MessageStore(data, STORE) as store:
            added = [f"id{n}" for n in range(400, 400 + restart)]
            assert ids(store) == [f"id{n}" for n in range(400) if n != 370] + added
            assert store.lookup_message_id("id371") == [stored[371].commit_log_offset]
            assert store.put(record(400 + restart)).queue_offset == 400 + restart
    clean_once_acknowledged(capsys, data, {"id370"})


def test_a_flipped_byte_in_a_multi_mib_body_before_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = replace(STORE, segment_size=8 << 20)
    big = b"B" * (3 << 20)
    with MessageStore(tmp_path, config) as store:
        stored = [store.put(record(n, body=big if n % 10 == 5 else None)) for n in range(40)]
    flip(tmp_path, stored[15].commit_log_offset + stored[15].size // 2)
    code, report = tool(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1
    assert [(m["message_id"], m["topic"], m["queue_offset"]) for m in report["lost"]] == [("id15", "orders", 15)]
    assert tool(capsys, "repair", "--data-dir", str(tmp_path))[0] == 1
    assert len((next((tmp_path / "damaged").iterdir()) / f"{stored[15].commit_log_offset:020d}").read_bytes()) == stored[15].size
    for _ in range(2):
        with MessageStore(tmp_path, config) as store:
            survivors = store.read_queue("orders", 0, 0, 100)
            assert [r.properties["UNIQ_KEY"] for r in survivors] == [f"id{n}" for n in range(40) if n != 15]
            assert [r.body for r in survivors if len(r.body) > 1000] == [big] * 3


def test_damage_across_a_segment_boundary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = [store.put(record(n)) for n in range(400)]
    second = int(segments(tmp_path)[1].name)
    last_of_first = [r for r in stored if r.commit_log_offset < second][-1]
    first_of_second = next(r for r in stored if r.commit_log_offset == second)
    zero(tmp_path, last_of_first.commit_log_offset, second - last_of_first.commit_log_offset)  # and the filler
    zero(tmp_path, second, first_of_second.size)
    code, report = tool(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1
    lost = [last_of_first.queue_offset, first_of_second.queue_offset]
    assert [m["queue_offset"] for m in report["lost"]] == lost
    code, repaired = tool(capsys, "repair", "--data-dir", str(tmp_path))
    assert code == 1 and [m["queue_offset"] for m in repaired["lost"]] == lost
    for _ in range(2):
        with MessageStore(tmp_path, STORE) as store:
            assert ids(store) == [f"id{n}" for n in range(400) if n not in lost]
            assert all(store.get(r.commit_log_offset).body == r.body for r in stored if r.queue_offset not in lost)


def test_a_broker_whose_checkpointed_tail_was_cut_starts_after_repair_without_reusing_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = replace(BROKER, store=replace(BROKER.store, segment_size=1 << 20))
    with EmbeddedBroker(tmp_path, config) as broker:
        for n in range(300):
            broker.send(Message("orders", b"%d" % n + b"." * 1000))
        depths = broker.list_topics()
    cut(segments(tmp_path)[-1], 64 * 1024)
    with pytest.raises(CorruptLogError, match="shorter than the checkpoint"):
        EmbeddedBroker(tmp_path, config)
    code, repaired = tool(capsys, "repair", "--data-dir", str(tmp_path))
    assert code == 1
    lost = [m for m in repaired["lost"] if m["topic"] == "orders"]
    assert 50 < len(lost) < 70
    for restart in range(2):
        with EmbeddedBroker(tmp_path, config) as broker:
            assert broker.list_topics() == depths  # lost offsets are holes, never reused
            received = []
            while batch := broker.receive(f"g{restart}", "orders", max_messages=64):
                received += batch
                for item in batch:
                    broker.ack(f"g{restart}", item.receipt_handle)
            assert len(received) == 300 - len(lost)
            assert {(m["queue_id"], m["queue_offset"]) for m in lost}.isdisjoint(
                (r.queue_id, r.queue_offset) for r in received
            )


def test_fsck_reports_and_repair_rebuilds_deleted_queues_and_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = [store.put(record(n, queue_id=n % 2)) for n in range(300)]
    subprocess.run(["rm", "-rf", str(tmp_path / "consumequeue" / "orders" / "1")], check=True)
    index_files(tmp_path)[3].unlink()
    code, report = tool(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1 and report["gaps"] == [] and report["lost"] == []
    assert any("orders/1" in p for p in report["problems"]) and any("index" in p for p in report["problems"])
    code, repaired = tool(capsys, "repair", "--data-dir", str(tmp_path))
    assert code == 0 and repaired["lost"] == [] and repaired["salvaged_records"] == 300
    assert not (tmp_path / "damaged").exists()
    assert tool(capsys, "fsck", "--data-dir", str(tmp_path))[0] == 0
    with MessageStore(tmp_path, STORE) as store:
        assert len(ids(store, queue_id=0)) == len(ids(store, queue_id=1)) == 150
        assert all(store.lookup_message_id(r.properties["UNIQ_KEY"]) == [r.commit_log_offset] for r in stored)


def test_fsck_finds_an_index_filter_that_lacks_keys_of_its_file_and_repair_rebuilds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = [store.put(record(n)) for n in range(300)]
    files = [IndexFile.open(path) for path in index_files(tmp_path)[:3]]
    # the first file's filter as a bug could write it, whole and CRC'd: no key of its file;
    # the second's with a flipped bit (its CRC fails: the broker would not use it)
    KeyFilter.empty(files[0].capacity).write(files[0].path, files[0].count, files[0].low_offset, REAL)
    flipped = bytearray(filter_path(files[1].path).read_bytes())
    flipped[-1] ^= 1
    filter_path(files[1].path).write_bytes(bytes(flipped))
    for file in files:
        file.close()
    code, report = tool(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1 and [p for p in report["problems"] if files[0].path.name in p]
    assert [n for n in report["notes"] if files[1].path.name in n and "not used" in n]
    assert tool(capsys, "repair", "--data-dir", str(tmp_path))[0] == 0
    assert tool(capsys, "fsck", "--data-dir", str(tmp_path))[0] == 0
    with MessageStore(tmp_path, STORE) as store:
        assert [store.lookup_message_id(f"id{n}") for n in range(300)] == [[r.commit_log_offset] for r in stored]


def test_fsck_checks_the_newest_index_filter_a_checkpoint_wrote_as_the_broker_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MessageStore(tmp_path, STORE) as store:
        for n in range(300):
            store.put(record(n))
        store.checkpoint()  # writes the newest file's filter, covering its entries so far
        newest = index_files(tmp_path)[-1]
        assert filter_path(newest).exists()
        for n in range(300, 303):
            store.put(record(n))  # past what it covers, as a crash leaves it
        crashed = crash_image(tmp_path, tmp_path.with_name(tmp_path.name + "-crashed"))
    code, report = tool(capsys, "fsck", "--data-dir", str(crashed))
    assert code == 0, report
    assert not [note for note in report["notes"] if "filter" in note], report["notes"]


def test_the_tools_run_as_commands_and_refuse_a_directory_in_use(tmp_path: Path) -> None:
    data, _ = crashed_store(tmp_path)
    zero(data, 0, 12)
    command = [sys.executable, "-m", "broker_embedded"]
    fsck = subprocess.run([*command, "fsck", "--data-dir", str(data)], capture_output=True, text=True, cwd=ROOT)
    assert fsck.returncode == 1
    assert "offset 0" in fsck.stdout and "id0" in fsck.stdout and "halfmoon-broker repair" in fsck.stdout
    with MessageStore(tmp_path / "other", STORE):
        for name in ("fsck", "repair"):
            busy = subprocess.run([*command, name, "--data-dir", str(tmp_path / "other")],
                                  capture_output=True, text=True, cwd=ROOT)
            assert busy.returncode == 2 and "in use" in busy.stderr
    repair = subprocess.run([*command, "repair", "--data-dir", str(data)], capture_output=True, text=True, cwd=ROOT)
    assert repair.returncode == 1 and "id0" in repair.stdout
    with MessageStore(data, STORE) as store:
        assert ids(store) == [f"id{n}" for n in range(1, 300)]


def test_a_crash_image_with_a_torn_tail_is_clean_for_fsck(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MessageStore(tmp_path / "live", STORE) as store:
        for n in range(50):
            store.put(record(n))
        data = crash_image(tmp_path / "live", tmp_path / "crashed")
    last = segments(data)[-1]
    torn = codec.seal(codec.encode("orders", 0, 50, 0, 1, 1, {"UNIQ_KEY": "id50"}, b"x" * 500),
                      int(last.name) + last.stat().st_size)
    with last.open("ab") as f:  # an append the crash cut: never fsync'd, never acknowledged
        f.write(torn[: len(torn) // 2])
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 0 and report["records"] == 50 and report["lost_count"] == 0
    assert any("torn tail" in note for note in report["notes"])
    with MessageStore(data, STORE) as store:
        assert len(ids(store)) == 50
        assert store.losses.all() == []


@pytest.mark.parametrize("damage", ["middle segment deleted", "closed segment cut short"])
def test_repair_fills_missing_segment_bytes_and_the_store_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = [store.put(record(n)) for n in range(600)]
    files = segments(tmp_path)
    assert len(files) >= 3
    second, third = int(files[1].name), int(files[2].name)
    if damage == "middle segment deleted":
        files[1].unlink()
        gone = {r.queue_offset for r in stored if second <= r.commit_log_offset < third}
    else:
        cut(files[0], 1000)
        gone = {r.queue_offset for r in stored if second - 1000 < r.commit_log_offset + r.size <= second}
    with pytest.raises(CorruptLogError):
        MessageStore(tmp_path, STORE)
    code, repaired = tool(capsys, "repair", "--data-dir", str(tmp_path))
    assert code == 1 and gone
    assert [m["queue_offset"] for m in repaired["lost"]] == sorted(gone)
    for restart in range(2):
        with MessageStore(tmp_path, STORE) as store:
            added = [f"id{n}" for n in range(600, 600 + restart)]
            assert ids(store) == [f"id{n}" for n in range(600) if n not in gone] + added
            assert store.put(record(600 + restart)).queue_offset == 600 + restart
    clean_once_acknowledged(capsys, tmp_path, {f"id{n}" for n in gone})


def test_a_pending_transaction_whose_half_message_was_lost_is_parked_and_the_others_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = tmp_path / "live"
    with EmbeddedBroker(live, replace(BROKER, transaction_timeout_s=600, snapshot_interval_s=3600)) as broker:
        lost = broker.send_half(Message("orders", b"lost"), producer_group="pg", transaction_id="lost")
        broker.send_half(Message("orders", b"kept"), producer_group="pg", transaction_id="kept")
        half = broker.store.lookup_message_id(lost.message_id)[0]
        broker.write_snapshots()  # the book knows both transactions; only the log is damaged
    zero(live, half, 12)
    assert tool(capsys, "repair", "--data-dir", str(live))[0] == 1
    checker = RecordingChecker()
    with EmbeddedBroker(live, BROKER, checker) as broker:
        assert checker.asked.wait(10)
        for _ in range(100):
            if [p.transaction_id for p in broker.list_parked()] == ["lost"]:
                break
            checker.asked.wait(0.1)
        assert [p.transaction_id for p in broker.list_parked()] == ["lost"]
        assert {r.transaction_id for r in checker.requests} == {"kept"}


def test_a_salvaged_header_whose_queue_id_was_zeroed_is_not_counted_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found flaky in test_recovery_damage under load: a zeroed page ended inside the queue id
    of a queue 1 record whose queue files were gone; its salvaged header said queue 0 at the
    offset of a lost queue 0 record, so fsck placed it there and counted the queue 1 offset
    once more (36 lost of 35)."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:  # queues 0 and 1 alternate: equal queue offsets
        stored = store.put_batch([record(n, queue_id=n % 2) for n in range(10)])
    shutil.rmtree(data / "consumequeue" / "orders" / "1")
    victim = stored[5]  # queue 1, queue offset 2; queue 0's offset 2 lies in the damage too
    assert (victim.queue_id, victim.queue_offset, stored[4].queue_offset) == (1, 2, 2)
    start = stored[3].commit_log_offset
    zero(data, start, victim.commit_log_offset + 16 - start)  # up to and with its queue id
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 3  # stored[3], stored[4] and the victim


def test_a_queue_none_of_whose_records_is_intact_has_each_lost_place_counted_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the store simulation (``misdirected`` 5259): every record of queue 1 lay in
    the damaged range and its queue files were gone, so no intact record bounded its lost
    places; fsck listed each place the checkpoint counted twice (before the first intact
    record and after the last), and repair recorded 8 lost where 5 were."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:  # queues 0 and 1 alternate
        stored = store.put_batch([record(n, queue_id=n % 2) for n in range(6)])
    shutil.rmtree(data / "consumequeue" / "orders" / "1")
    start, end = stored[1].commit_log_offset, stored[5].commit_log_offset + stored[5].size
    zero(data, start, end - start)  # records 1 to 5: all of queue 1's, queue 0's 1 and 2
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 5
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1 and repaired["lost_count"] == 5
    with MessageStore(data, STORE) as store:
        recorded = store.losses.all()
        assert sum(len(loss.message_ids) + loss.unnamed for loss in recorded) == 5
        assert ids(store) == ["id0"] and ids(store, queue_id=1) == []


def test_fsck_and_repair_count_a_damaged_header_naming_another_stored_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped bit turns the id in a damaged record's header into another stored message's
    ("id11" reads "id19"): fsck and repair count the lost record, with its place, and name
    nobody, not the intact id19 (an operator would resend the wrong message). The scrub does
    the same (tests/store/test_scrub.py); a header whose id is its own keeps its name."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:
        stored = {n: store.put(record(n, queue_id=n % 2)) for n in range(10, 30)}
    retype(data, stored[11], b"id11", b"id19")
    flip(data, stored[14].commit_log_offset + stored[14].size - 1)  # a body byte: its header intact
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1
    lost = sorted((m["message_id"] or "", m["queue_id"], m["queue_offset"]) for m in report["lost"])
    assert lost == [("", 1, stored[11].queue_offset), ("id14", 0, stored[14].queue_offset)], lost
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1
    assert sorted(m["message_id"] or "" for m in repaired["lost"]) == ["", "id14"]
    with MessageStore(data, STORE) as store:
        assert store.lookup_message_id("id19") == [stored[19].commit_log_offset]
        assert [message_id for loss in store.losses.all() for message_id in loss.message_ids] == ["id14"]


def test_a_damaged_record_keeps_the_lost_place_its_header_names_from_a_zeroed_one_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the store simulation (``misdirected`` 10963): past the checkpoint, zeros (a
    misdirected write's) over two queue 1 records, and later a queue 0 record with a flipped
    body byte, no queue entry of theirs on disk. fsck gave the zeroed header the lost queue 0
    place (it lay between that queue's intact records too), so the damaged record's own
    header could not take it, and queue 1's places were counted beside it: 4 lost of 3."""
    live = tmp_path / "live"
    with MessageStore(live, STORE) as store:  # queues 0 and 1 at offsets 0 and 1
        store.put_batch([record(n, queue_id=n % 2) for n in range(4)])
        store.checkpoint()
        store.put(record(4, queue_id=0))
        zeroed = [store.put(record(n, queue_id=1)) for n in (5, 6)]
        store.put(record(7, queue_id=1))
        flipped = store.put(record(8, queue_id=0))
        store.put(record(9, queue_id=0))
        data = crash_image(live, tmp_path / "crashed")
    for queue_id in (0, 1):  # the entries past the checkpoint's counts never reached the disk
        with (data / "consumequeue" / "orders" / str(queue_id) / file_name(0)).open("r+b") as f:
            f.truncate(2 * ENTRY_SIZE)
    start = zeroed[0].commit_log_offset
    zero(data, start, zeroed[1].commit_log_offset + zeroed[1].size - start)
    flip(data, flipped.commit_log_offset + flipped.size - 1)  # a body byte: its header intact
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 3, report["lost"]
    places = {(m["message_id"], m["queue_id"], m["queue_offset"]) for m in report["lost"]}
    assert ("id8", 0, flipped.queue_offset) in places
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1 and repaired["lost_count"] == 3
    with MessageStore(data, STORE) as store:
        assert sum(len(loss.message_ids) + loss.unnamed for loss in store.losses.all()) == 3
        assert (ids(store), ids(store, queue_id=1)) == (["id0", "id2", "id4", "id9"], ["id1", "id3", "id7"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sets(st.integers(0, 4), max_size=5), max_size=5))
def test_fsck_gives_as_many_lost_heads_a_place_as_can_have_one(fitting: list[set[int]]) -> None:
    """Found by the store simulation (``media`` 12184): two lost records whose headers were
    unreadable, one that could have held either of two lost queue places and one that could
    hold only one of them; taken in order, the first took the second's, which was left
    without a place and counted again beside it (3 lost of 2). Each head gets a place if
    some assignment gives it one: as many as the best assignment of all (found by trying
    every one), each a place that fits it, none twice."""
    places: list[Place] = [("orders", 0, n) for n in range(5)]
    held = _match(list(range(len(fitting))), places, lambda head, place: place[2] in fitting[head])
    best = max((sum(1 for head, place in enumerate(order) if place in fitting[head])
                for order in itertools.permutations(range(5), len(fitting))), default=0)
    assert len(held) == best
    assert all(place[2] in fitting[head] for head, place in held.items())
    assert len(set(held.values())) == len(held)


@pytest.mark.parametrize("index", ["kept", "deleted"])
def test_two_lost_records_whose_headers_say_one_id_are_not_both_named_by_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], index: str
) -> None:
    """Found by the store simulation (``media`` 12486): a flipped bit turned the id in the
    damaged header of a lost record into the id of the lost record before it ("id12" reads
    "id11"), and fsck and repair named id11 twice. The id stays with the record whose index
    entry has it, if one does; with no index to tell, neither is named: both are counted,
    each at its queue place."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:
        stored = {n: store.put(record(n)) for n in range(10, 16)}
    retype(data, stored[12], b"id12", b"id11")
    flip(data, stored[11].commit_log_offset + stored[11].size - 1)  # a body byte: its header intact
    if index == "deleted":
        shutil.rmtree(data / "index")
    named = ["id11"] if index == "kept" else []
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 2
    assert sorted(m["message_id"] or "" for m in report["lost"]) == ["", named[0] if named else ""]
    assert sorted(m["queue_offset"] for m in report["lost"]) == [1, 2]
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1 and repaired["lost_count"] == 2
    with MessageStore(data, STORE) as store:
        assert [message_id for loss in store.losses.all() for message_id in loss.message_ids] == named
        assert sum(len(loss.message_ids) + loss.unnamed for loss in store.losses.all()) == 2
        assert ids(store) == ["id10", "id13", "id14", "id15"]


def test_a_damaged_record_is_not_named_by_an_id_its_index_entries_deny(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The twin in fsck of what the store simulation found in recovery (``media`` 20957):
    a flipped bit turned a damaged record's id into one not sent yet ("id12" reads
    "id99"); no intact record held id99, so fsck and repair named it lost, and id99, sent
    later, stood in the ledger as lost while readable. The record's own index entry says
    id12's hash: an id its entries deny is not its name; it is counted at its place."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:
        stored = {n: store.put(record(n)) for n in range(10, 16)}
    retype(data, stored[12], b"id12", b"id99")
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 1
    assert [(m["message_id"], m["queue_offset"]) for m in report["lost"]] == [(None, 2)]
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1 and repaired["lost_count"] == 1
    with MessageStore(data, STORE) as store:
        (loss,) = store.losses.all()
        assert (loss.message_ids, loss.unnamed) == ((), 1)
        store.put(record(99))
        assert ids(store) == ["id10", "id11", "id13", "id14", "id15", "id99"]


def test_the_zeros_ahead_of_the_last_damaged_records_are_no_record_of_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``media`` 23463 found with an unreadable page (tests/sim), here with bit flips:
    the last two records of the log damaged, the store refusing to open, and the damaged
    range running on to the end of the file over part of the zeros the store writes ahead
    of its appends (a power loss kept part of them); fsck took those zeros, where the last
    damaged record's length led, for the header of one more record (zeroed past the
    checkpoint, as a misdirected write leaves them) and counted it: 3 lost of 2."""
    data, stored = crashed_store(tmp_path)
    last = segments(data)[-1]
    end = stored[-1].commit_log_offset + stored[-1].size - int(last.name)
    assert last.stat().st_size > end + 3001  # zeros ahead, of which a power loss kept a part:
    with last.open("r+b") as f:
        f.truncate(end + 3001)
    for victim in stored[-2:]:
        flip(data, victim.commit_log_offset + victim.size - 1)  # body bytes: headers intact
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["lost_count"] == 2, report["lost"]
    assert sorted(m["message_id"] for m in report["lost"]) == ["id298", "id299"]
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1 and repaired["lost_count"] == 2
    with MessageStore(data, STORE) as store:
        assert [message_id for loss in store.losses.all() for message_id in loss.message_ids] == ["id298", "id299"]
        assert sum(loss.unnamed for loss in store.losses.all()) == 0


def test_a_repair_run_again_after_a_crash_records_every_place_the_first_did_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the store simulation (``misdirected`` 15167; a silent loss): a repair cut
    short had recorded the first of three lost records, with its place, and not the others.
    Run again, fsck read that record's salvaged header, found its place taken by the ledger
    and took it for a damaged one, so the record took the next lost place, whose record was
    then recorded by nothing. A place the ledger has stands, and a head in a range the
    ledger covers takes no new place."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:
        stored = [store.put(record(n)) for n in range(10)]
    shutil.rmtree(data / "consumequeue")  # the places are known by the checkpoint's counts alone
    flip(data, stored[5].commit_log_offset + stored[5].size - 1)  # a body byte: its header intact
    zero(data, stored[6].commit_log_offset, stored[8].commit_log_offset - stored[6].commit_log_offset)
    LossLedger(data).record("repair", stored[5].commit_log_offset, stored[8].commit_log_offset, ["id5"], 0,
                            "the first loss of a repair a crash cut short", [("orders", 0, 5)])
    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1
    with MessageStore(data, STORE) as store:
        recorded = store.losses.all()
        assert sum(loss.records for loss in recorded) == 3, recorded
        assert sorted(place for loss in recorded for place in loss.places) == [("orders", 0, n) for n in (5, 6, 7)]
        assert ids(store) == [f"id{n}" for n in (0, 1, 2, 3, 4, 8, 9)]
