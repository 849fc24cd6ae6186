"""Each commit log record carries the offset it was written at (issue 27, misdirected writes).

A misdirected write leaves an intact copy of records at a wrong place, over what was there:
every byte of the copy passes its crc, so only the record's own offset tells the copy from a
record. Here the copy is made on real files, and the store, its readers, ``fsck`` and
``repair`` must take it for damage. Data directories of the format before (no offset in a
record, ``legacy_data``: written by that version, 40 records in queues 0 and 1 of ``orders``)
still open, read, and take new records.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from tests.store.damage import locate, overwrite
from tests.store.test_fsck_repair import tool

LEGACY_DATA = Path(__file__).parent / "legacy_data"
LEGACY_STORE = StoreConfig(segment_size=4096, consume_queue_file_entries=16, index_slots=64, index_entries=256,
                           scrub_bytes_per_s=0)
STORE = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600, index_slots=16, index_entries=64,
                    consume_queue_file_entries=50, scrub_bytes_per_s=0)


def record(n: int, queue_id: int = 0, body: bytes | None = None) -> StoredRecord:
    return StoredRecord("orders", queue_id, body or f"body {n}".encode(), {"UNIQ_KEY": f"id{n}", "KEYS": f"k{n}"})


def bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    return [r.body for r in store.read_queue("orders", queue_id, 0, 10_000)]


def test_a_data_directory_of_the_legacy_record_format_opens_reads_and_takes_new_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    shutil.copytree(LEGACY_DATA, data)
    legacy = {q: [f"body {n}".encode() for n in range(q, 40, 2)] for q in (0, 1)}
    with MessageStore(data, LEGACY_STORE) as store:
        assert {q: bodies(store, q) for q in (0, 1)} == legacy
        (offset,) = store.lookup_message_id("id7")
        assert store.get(offset).body == b"body 7" and store.lookup_key("orders", "k7") == [offset]
        added = [store.put(record(n, n % 2)) for n in range(40, 80)]  # fill the segment, then the next
    assert len({r.commit_log_offset // 4096 for r in added}) == 2
    everything = {q: [f"body {n}".encode() for n in range(q, 80, 2)] for q in (0, 1)}
    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 0 and report["records"] == 80 and report["lost"] == []
    shutil.rmtree(data / "consumequeue")  # rebuilt from a log of both formats
    shutil.rmtree(data / "index")
    with MessageStore(data, LEGACY_STORE) as store:
        assert {q: bodies(store, q) for q in (0, 1)} == everything
        assert store.scrub.run_pass() == [] and store.losses.all() == []
        for n in (7, 77):
            (offset,) = store.lookup_message_id(f"id{n}")
            assert store.get(offset).body == f"body {n}".encode()


def test_an_intact_copy_of_records_written_at_a_wrong_offset_is_damage_not_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records of one size: the copy of records 10 to 19 lands exactly over records 50 to 59,
    each copied record where a queue entry expects one of its size. Before records carried
    their offset, a reader took the copies for records 50 to 59 (ids 10 to 19 twice, 50 to 59
    missing, nothing reported), and so did ``fsck`` and recovery's rebuild."""
    data = tmp_path / "data"
    with MessageStore(data, STORE) as store:
        stored = [store.put(record(n, body=b"x" * 200)) for n in range(100)]
    assert len({r.size for r in stored[10:60]}) == 1
    path, position = locate(data, stored[10].commit_log_offset)
    copy = path.read_bytes()[position:position + 10 * stored[10].size]
    overwrite(data, stored[50].commit_log_offset, copy)
    taken = {f"id{n}" for n in range(50, 60)}

    code, report = tool(capsys, "fsck", "--data-dir", str(data))
    assert code == 1 and report["records"] == 90
    assert [(g["start"], g["end"]) for g in report["gaps"]] == [
        (stored[50].commit_log_offset, stored[60].commit_log_offset)]
    assert report["lost_count"] == 10 and {m["message_id"] for m in report["lost"]} - {None} <= taken

    with MessageStore(data, STORE) as store:  # below the checkpoint: found by the reader
        read = [r.properties["UNIQ_KEY"] for r in store.read_queue("orders", 0, 0, 1000)]
        assert read == [f"id{n}" for n in range(100) if f"id{n}" not in taken]
        assert store.lookup_message_id("id15") == [stored[15].commit_log_offset]
        assert store.lookup_message_id("id55") == []
        (loss,) = store.losses.all()
        assert (loss.start, loss.end, loss.records) == (stored[50].commit_log_offset,
                                                       stored[60].commit_log_offset, 10)

    code, repaired = tool(capsys, "repair", "--data-dir", str(data))
    assert code == 1
    with MessageStore(data, STORE) as store:
        read = [r.properties["UNIQ_KEY"] for r in store.read_queue("orders", 0, 0, 1000)]
        assert read == [f"id{n}" for n in range(100) if f"id{n}" not in taken]
        assert store.put(record(100)).queue_offset == 100
