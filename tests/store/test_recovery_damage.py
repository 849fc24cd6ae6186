"""Recovery replays the log below the checkpoint past a damaged page (issue 21 finding 4, the
rebuild paths).

When a consume queue or the index is rebuilt from the commit log, or an older checkpoint has no
queue counts, recovery re-dispatches records below the checkpoint. A zeroed page there holds no
record to dispatch and nothing there is truncated: the store must open, serve every other
record, and write the damage to the loss ledger once, with the exact number of records it took,
even where no consume queue entry points into it any more.

Each directory is written by a real writer process that acknowledges ids and is SIGKILLed when
idle (tests/store/load_writer.py); the test knows which acknowledged ids the zeroed page took.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, BrokerConfig, EmbeddedBroker
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.losses import LossLedger
from broker_embedded.store.message_store import CHECKPOINT, MessageStore, read_checkpoint
from broker_embedded.store.record import StoredRecord
from tests.server.conftest import ServerProcess
from tests.store.damage import locate, segments, zero
from tests.store.test_losses import CONFIG, Written, cli, copy_of, written_and_killed

PAGE = 4096
WRITER = {**CONFIG, "segment_size": 64 * 1024, "scrub_bytes_per_s": 0}
STORE = StoreConfig(**WRITER)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """3,000 acknowledged records over 6 segments of 64 KiB, checkpointed after 2,400."""
    return written_and_killed(tmp_path_factory.mktemp("written") / "data", (750, 600), **WRITER)


def zero_a_page(w: Written) -> set[str]:
    """Zero the second 4 KiB page of a closed segment below the checkpoint; the ids of the
    acknowledged records it changed (a record whose bytes on the page were zeros already,
    such as the high bytes of its length, is intact)."""
    segment = segments(w.data)[3]
    base = int(segment.name)
    start = base + PAGE
    assert start + PAGE < w.checkpoint and segment != segments(w.data)[-1]
    before = segment.read_bytes()
    zero(w.data, start, PAGE)
    overlaps = {a.message_id: (max(a.commit_log_offset, start) - base, min(a.commit_log_offset + w.size(a), start + PAGE) - base)
                for a in w.acknowledged if a.commit_log_offset < start + PAGE and a.commit_log_offset + w.size(a) > start}
    return {message_id for message_id, (low, high) in overlaps.items() if any(before[low:high])}


def drop_queue_counts(data: Path) -> None:
    """Make the checkpoint one from before it kept each queue's entry count."""
    fields = read_checkpoint(data)
    del fields["queues"]
    (data / CHECKPOINT).write_text(json.dumps(fields))


REBUILDS: dict[str, Callable[[Path], None]] = {
    "consume queues deleted": lambda data: shutil.rmtree(data / "consumequeue"),
    "one consume queue deleted": lambda data: shutil.rmtree(data / "consumequeue" / "load" / "1"),
    "index deleted": lambda data: shutil.rmtree(data / "index"),
    "checkpoint without queue counts": drop_queue_counts,
}


def damaged(written: Written, tmp_path: Path, rebuild: str) -> tuple[Written, set[str]]:
    w = copy_of(written, tmp_path / "data")
    destroyed = zero_a_page(w)
    REBUILDS[rebuild](w.data)
    assert 10 < len(destroyed) < 100
    return w, destroyed


def received_by_a_fresh_group(data: Path) -> list[str]:
    """The ids a fresh consumer group of an embedded broker receives (and acks) from ``load``."""
    ids: list[str] = []
    with EmbeddedBroker(data, BrokerConfig(store=STORE)) as broker:
        while batch := broker.receive("fresh-group", "load", max_messages=256):
            for received in batch:
                broker.ack("fresh-group", received.receipt_handle)
                ids.append(received.message.message_id)
    return ids


@pytest.mark.parametrize("rebuild", list(REBUILDS))
def test_a_rebuild_replays_past_a_damaged_page_and_records_its_exact_loss_once(
    written: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str], rebuild: str
) -> None:
    """Fails on the old store: the replay raised LogDamageError at the zeroed page and the
    store refused to open, though nothing would be truncated."""
    w, destroyed = damaged(written, tmp_path, rebuild)
    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and report["lost_count"] == len(destroyed)

    with MessageStore(w.data, STORE) as store:
        (loss,) = store.losses.open_losses()
        assert (loss.found_by, loss.records) == ("recovery", len(destroyed))
        assert set(loss.message_ids) <= destroyed
        assert store.scrub.run_pass() == []  # the scrub finds the same range: recorded already
    received = received_by_a_fresh_group(w.data)
    assert len(received) == len(set(received)) and set(received) == w.ids() - destroyed

    assert LossLedger(w.data).all() == [loss]  # reopened twice, recorded once
    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and [(m["loss_id"], m["unnamed"] + len(m["message_ids"])) for m in report["open_losses"]] \
        == [(loss.loss_id, len(destroyed))]


def receive_all(url: str, group: str, topic: str) -> list[str]:
    """The ids ``group`` receives (and acks) from ``topic`` until a receive waits in vain."""
    ids: list[str] = []
    with BrokerClient(url) as client:
        while batch := client.receive(group, topic, max_messages=256, wait_s=0.3):
            for received in batch:
                client.ack(group, received.receipt_handle)
                ids.append(received.message.message_id)
    return ids


def test_serve_starts_over_a_damaged_page_with_the_consume_queues_deleted(written: Written, tmp_path: Path) -> None:
    w, destroyed = damaged(written, tmp_path, "consume queues deleted")
    server = ServerProcess(w.data, "--scrub-rate", "64")
    try:
        server.start()
        received = receive_all(server.url, "fresh-group", "load")
        assert len(received) == len(set(received)) and set(received) == w.ids() - destroyed
    finally:
        assert server.proc is None or server.stop() == 0, server.log.read_text()[-3000:]
    (loss,) = LossLedger(w.data).all()
    assert (loss.found_by, loss.records) == ("recovery", len(destroyed))
    errors = [line for line in server.log.read_text().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "lost" in errors[0] and f"{len(destroyed)} records lost" in errors[0]


def test_a_queue_whose_last_records_were_lost_keeps_their_offsets_from_new_records(tmp_path: Path) -> None:
    """Queue 1's last five records and five of queue 0 lie in the zeroed bytes, and the consume
    queues are gone: the checkpoint's count says how many queue 1 lost at its end."""
    config = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600, index_slots=1024,
                         index_entries=4096, scrub_bytes_per_s=0)
    with MessageStore(tmp_path, config) as store:
        both = store.put_batch([StoredRecord("orders", n % 2, b"x" * 100, {"UNIQ_KEY": f"id{n}"}) for n in range(600)])
        store.put_batch([StoredRecord("orders", 0, b"y" * 100, {"UNIQ_KEY": f"id{n}"}) for n in range(600, 1200)])
    start, end = both[-10].commit_log_offset, both[-1].commit_log_offset + both[-1].size
    assert locate(tmp_path, start)[0] == locate(tmp_path, end)[0] != segments(tmp_path)[-1]
    zero(tmp_path, start, end - start)
    shutil.rmtree(tmp_path / "consumequeue")
    with MessageStore(tmp_path, config) as store:
        (loss,) = store.losses.open_losses()
        assert (loss.start, loss.records) == (start, 10)
        assert store.queue_max_offset("orders", 1) == 300
        assert store.put(StoredRecord("orders", 1, b"new")).queue_offset == 300
        assert len(store.read_queue("orders", 1, 0, 1000)) == 296
        assert len(store.read_queue("orders", 0, 0, 1000)) == 895


def test_a_zeroed_queue_id_does_not_count_a_lost_record_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first 16 bytes of a record of queue 1 zeroed: what is left of its header puts it in
    queue 0 at an offset an intact record holds. fsck counted it there and at its real place."""
    config = StoreConfig(segment_size=64 * 1024, scrub_bytes_per_s=0)
    with MessageStore(tmp_path, config) as store:
        stored = store.put_batch([StoredRecord("orders", n % 2, b"x" * 100, {"UNIQ_KEY": f"id{n}"}) for n in range(200)])
    zero(tmp_path, stored[101].commit_log_offset, 16)  # length, magic, crc and queue id
    shutil.rmtree(tmp_path / "consumequeue")
    code, report = cli(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1 and report["lost_count"] == 1
    assert {m["message_id"] for m in report["lost"]} - {None} == {"id101"}
    with MessageStore(tmp_path, config) as store:
        assert [loss.records for loss in store.losses.open_losses()] == [1]
