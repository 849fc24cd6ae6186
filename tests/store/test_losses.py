"""Every acknowledged record a damaged store drops is named or counted, and stays visible.

Issue 21, findings 2 and 3. Each data directory is written by a real writer process that
acknowledges ids and is SIGKILLed when idle (tests/store/load_writer.py), then damaged on
disk. The test knows which acknowledged ids the damage destroyed; recovery, ``fsck`` and
``repair`` must report exactly those (by id where a surviving byte names one, else by an
exact count), write them to the loss ledger until ``losses --acknowledge``, and every other
record must stay readable.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution
from broker_embedded.cli.main import main
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.losses import LossLedger
from broker_embedded.store.message_store import MessageStore, read_checkpoint
from tests.store.damage import drain, segments, zero
from tests.store.load_writer import Acknowledged, load_until_killed
from tests.store.test_damaged_files import BROKER

CONFIG = {"segment_size": 16 * 1024, "checkpoint_interval_s": 3600, "index_slots": 64, "index_entries": 512,
          "consume_queue_file_entries": 64}
STORE = StoreConfig(**CONFIG)  # type: ignore[arg-type]


@dataclass
class Written:
    """A SIGKILLed writer's directory: what it acknowledged and where its checkpoint is."""

    data: Path
    acknowledged: list[Acknowledged]  # in commit log order
    checkpoint: int
    log_end: int

    def size(self, record: Acknowledged) -> int:
        """The record's size (up to the next record: a segment's filler included)."""
        at = self.acknowledged.index(record)
        following = self.acknowledged[at + 1].commit_log_offset if at + 1 < len(self.acknowledged) else self.log_end
        return following - record.commit_log_offset

    def ids(self) -> set[str]:
        return {a.message_id for a in self.acknowledged}


def written_and_killed(data: Path, phases: tuple[int, int], **config: Any) -> Written:
    """What a writer acknowledged in ``data`` (``phases``: per writer, checkpoint after) before
    its SIGKILL when idle."""
    acknowledged = load_until_killed(data, 0, phases=phases, **config)
    assert len(acknowledged) == 4 * phases[0]
    acknowledged.sort(key=lambda a: a.commit_log_offset)
    last = segments(data)[-1]
    return Written(data, acknowledged, int(read_checkpoint(data)["verified"]), int(last.name) + last.stat().st_size)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return written_and_killed(tmp_path_factory.mktemp("written") / "data", (150, 100), **CONFIG)


def copy_of(written: Written, target: Path) -> Written:
    shutil.copytree(written.data, target)
    return Written(target, written.acknowledged, written.checkpoint, written.log_end)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def survivors(data: Path) -> set[str]:
    """The ids a fresh reader gets from every queue of topic ``load``."""
    with MessageStore(data, STORE) as store:
        return {r.properties["UNIQ_KEY"] for queue_id in range(4)
                for r in store.read_queue("load", queue_id, 0, 10_000)}


def test_a_log_cut_above_the_checkpoint_names_and_counts_the_acknowledged_records_it_took(
    written: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    w = copy_of(written, tmp_path / "data")
    last = segments(w.data)[-1]
    above = [a for a in w.acknowledged if a.commit_log_offset >= max(w.checkpoint, int(last.name))]
    assert len(above) > 20
    victim = above[len(above) // 2]  # cut inside its body: its header survives
    cut_at = victim.commit_log_offset + w.size(victim) - 5
    lost = [a for a in w.acknowledged if a.commit_log_offset >= victim.commit_log_offset]
    lost_ids = {a.message_id for a in lost}
    with last.open("r+b") as f:
        f.truncate(cut_at - int(last.name))

    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and not report["ok"]
    assert report["lost_count"] == len(lost)
    assert {m["message_id"] for m in report["lost"]} - {None} == {victim.message_id}

    with caplog.at_level(logging.ERROR), MessageStore(w.data, STORE) as store:
        (loss,) = store.losses.open_losses()
    assert (loss.found_by, loss.message_ids, loss.unnamed) == ("recovery", (victim.message_id,), len(lost) - 1)
    assert loss.start == victim.commit_log_offset
    assert any(r.levelno == logging.ERROR and victim.message_id in r.getMessage() for r in caplog.records)
    assert survivors(w.data) == w.ids() - lost_ids
    assert len(LossLedger(w.data).open_losses()) == 1  # a second open records nothing again

    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and [loss["loss_id"] for loss in report["open_losses"]] == [1]
    code, listed = cli(capsys, "losses", "--data-dir", str(w.data))
    assert code == 1 and listed["open"][0]["message_ids"] == [victim.message_id]
    assert cli(capsys, "losses", "--data-dir", str(w.data), "--acknowledge", "1")[0] == 0
    assert cli(capsys, "fsck", "--data-dir", str(w.data))[0] == 0
    assert cli(capsys, "losses", "--data-dir", str(w.data))[1]["open"] == []


def cut_below_the_checkpoint(w: Written) -> set[str]:
    """Cut the log 40 % of the way into the checkpointed part of the segment holding the
    checkpoint, dropping the segments after it; returns the ids destroyed."""
    holding = [p for p in segments(w.data) if int(p.name) < w.checkpoint][-1]
    base = int(holding.name)
    cut_at = base + (w.checkpoint - base) * 4 // 10
    for later in segments(w.data):
        if int(later.name) > base:
            later.unlink()
    with holding.open("r+b") as f:
        f.truncate(cut_at - base)
    return {a.message_id for a in w.acknowledged if a.commit_log_offset + w.size(a) > cut_at}


def delete_a_segment(w: Written) -> set[str]:
    """Delete the second segment (below the checkpoint); returns the ids it held."""
    second = segments(w.data)[1]
    base, end = int(second.name), int(second.name) + STORE.segment_size
    assert end < w.checkpoint
    second.unlink()
    return {a.message_id for a in w.acknowledged if base <= a.commit_log_offset < end}


DAMAGE = {
    "cut below the checkpoint": (cut_below_the_checkpoint, False),
    "cut below the checkpoint, consume queues deleted": (cut_below_the_checkpoint, True),
    "a deleted segment": (delete_a_segment, False),
    "a deleted segment and consume queues": (delete_a_segment, True),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_repair_names_or_counts_every_acknowledged_record_it_drops(
    written: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    w = copy_of(written, tmp_path / "data")
    destroy, without_queues = DAMAGE[damage]
    destroyed = destroy(w)
    if without_queues:
        shutil.rmtree(w.data / "consumequeue")
    assert destroyed
    place = {a.message_id: (a.writer, a.queue_offset) for a in w.acknowledged}

    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and report["lost_count"] == len(destroyed)
    code, repaired = cli(capsys, "repair", "--data-dir", str(w.data))
    assert code == 1 and repaired["lost_count"] == len(destroyed)
    named = {m["message_id"] for m in repaired["lost"]} - {None}
    assert named <= destroyed
    placed = {(m["queue_id"], m["queue_offset"]) for m in repaired["lost"] if m["topic"] == "load"}
    assert placed <= {place[i] for i in destroyed}

    losses = LossLedger(w.data).open_losses()  # one per damaged or missing range
    assert {loss.found_by for loss in losses} == {"repair"}
    assert sum(loss.records for loss in losses) == len(destroyed)
    assert {message_id for loss in losses for message_id in loss.message_ids} == named
    assert survivors(w.data) == w.ids() - destroyed
    code, report = cli(capsys, "fsck", "--data-dir", str(w.data))
    assert code == 1 and report["lost_count"] == 0 and len(report["open_losses"]) == len(losses)
    assert cli(capsys, "losses", "--data-dir", str(w.data), "--acknowledge")[0] == 0
    assert cli(capsys, "fsck", "--data-dir", str(w.data))[0] == 0


def test_repair_names_committed_messages_and_their_halves_by_the_transaction_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EmbeddedBroker(tmp_path, BROKER) as broker:
        sent = []
        for n in range(20):
            sent.append(broker.send_half(Message("orders", b"order %d" % n * 20), producer_group="pg",
                                         transaction_id=f"tx{n}"))
            broker.end_transaction(f"tx{n}", Resolution.COMMIT, producer_group="pg")
        victim = sent[7].message_id
        half, real = broker.store.lookup_message_id(victim)
        sizes = [broker.store.get(offset).size for offset in (half, real)]
    for offset, size in zip((half, real), sizes, strict=True):
        zero(tmp_path, offset, size)  # nothing of either record is left to read

    code, report = cli(capsys, "fsck", "--data-dir", str(tmp_path))
    assert code == 1 and report["lost_count"] == 2
    assert [m["message_id"] for m in report["lost"]] == [victim, victim]
    code, repaired = cli(capsys, "repair", "--data-dir", str(tmp_path))
    assert code == 1 and repaired["lost_count"] == 2
    losses = LossLedger(tmp_path).open_losses()  # the half's range and the real message's
    assert [(loss.found_by, loss.message_ids, loss.unnamed) for loss in losses] == [("repair", (victim,), 0)] * 2
    with EmbeddedBroker(tmp_path, BROKER) as broker:
        bodies = drain(broker, "fresh", "orders")
    assert sorted(bodies) == sorted(b"order %d" % n * 20 for n in range(20) if n != 7)
