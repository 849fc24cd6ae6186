"""``repair``: salvage a stopped store's data directory that ``fsck`` found damaged.

Every intact record stays where it is, at its commit log offset and queue offset. The
bytes of each damaged range are copied to ``damaged/<UTC time>/<offset:020d>`` with the
check's report (``report.json``) and fsync'd, and only then replaced in the log: by a
blank filler inside the log (a missing segment file or the missing end of a closed
segment is filled the same way), by truncation at its end. The consume queues, the index
and the checkpoint are derived data: they are deleted, and opening the store rebuilds them
from the repaired log, verifying every record. What the repair drops (every record the
check named or counted, see ``verify``) goes to the loss ledger (``found_by="repair"``,
one loss per range), logged as an ERROR, before anything is moved or deleted. Queue offsets
of lost records become holes, and no queue hands out an offset it had before (a consumer
past it would skip the new record). A crash during a repair leaves its losses recorded and
a directory that the store opens or that ``repair`` salvages again (without counting them
twice).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import codec
from .commitlog import Gap
from .config import StoreConfig
from .files import write_atomically
from .filesystem import REAL, FileSystem, read_salvaging
from .losses import LossLedger, Namer
from .message_store import CHECKPOINT, MessageStore, pinned_layout
from .verify import LostMessage, Report, inspect, locked, lost_lines


@dataclass
class RepairReport:
    """What ``repair`` did: the check before it, where the damaged bytes went, what was
    lost and which queue offsets were kept from reuse."""

    check: Report
    moved_to: Path | None
    reserved: dict[tuple[str, int], int]

    @property
    def lost_records(self) -> bool:
        """Whether acknowledged records were damaged or missing (a torn tail was not)."""
        return bool(self.check.gaps or self.check.lost_count)

    def to_json(self) -> dict[str, Any]:
        check = self.check.to_json()
        return {
            "data_dir": check["data_dir"], "salvaged_records": self.check.records,
            "moved_to": str(self.moved_to) if self.moved_to else None,
            "gaps": check["gaps"], "torn_tail": check["torn_tail"], "lost": check["lost"],
            "lost_count": check["lost_count"],
            "problems": check["problems"],
            "reserved": [[topic, queue_id, offset] for (topic, queue_id), offset in sorted(self.reserved.items())],
        }

    def lines(self) -> list[str]:
        """The report for a terminal."""
        check = self.check
        lines = [f"{check.data_dir}: {check.records} intact records kept; consume queues, index "
                 "and checkpoint rebuilt"]
        if self.moved_to:
            moved = sum(gap.end - gap.start for gap in check.gaps if gap.kind != "missing")
            lines.append(f"{len(check.gaps)} damaged or missing ranges; {moved} bytes moved to {self.moved_to}")
        lines += [f"  {gap.kind} {gap.start}-{gap.end}: {gap.detail}" for gap in check.gaps]
        lines += lost_lines(check.lost, check.lost_count)
        lines += [f"queue {topic}/{queue_id} continues at offset {offset} (lost offsets are not reused)"
                  for (topic, queue_id), offset in sorted(self.reserved.items())]
        return lines


def repair(data_dir: Path, namer: Namer | None = None, fs: FileSystem = REAL,
           config: StoreConfig | None = None) -> RepairReport:
    """Salvage ``data_dir`` (see the module docstring); the store opens afterwards.
    ``namer``: names the layers above the store keep, to name lost records by; ``fs``: the
    file layer; ``config``: the store's settings for the open that rebuilds the queues and
    the index (its file layer is ``fs``; default: the defaults)."""
    with locked(data_dir, shared=False, fs=fs):
        check = inspect(data_dir, namer, fs)
        config = pinned_layout(data_dir, dataclasses.replace(config or StoreConfig(), filesystem=fs))
        # before any byte that names them is moved or deleted: after a crash from here on
        # the store may open, and nothing would be left to find these losses by (also when
        # none is counted: a range whose records nothing counts is a loss of its own)
        _record_losses(LossLedger(data_dir, fs, set_aside=True), check)
        aside = [gap for gap in [*check.gaps, check.torn_tail] if gap and gap.kind != "missing"]
        moved_to = _move_aside(data_dir, config.segment_size, aside, check, fs) if aside else None
        for derived in ("consumequeue", "index"):
            if fs.is_dir(data_dir / derived):
                fs.rmtree(data_dir / derived)
        fs.unlink(data_dir / CHECKPOINT, missing_ok=True)
        fs.fsync_directory(data_dir)
        log_dir = data_dir / "commitlog"
        last_base = max((int(name) for name in fs.listdir(log_dir) if name.isdigit()), default=0)
        for gap in [*check.gaps, *([check.torn_tail] if check.torn_tail else [])]:
            _fill(log_dir, config.segment_size, gap, last_base, fs)
        fs.fsync_directory(log_dir)
    raised: dict[tuple[str, int], int] = {}
    with MessageStore(data_dir, config) as store:
        for (topic, queue_id), offset in _offsets_in_use(check).items():
            if store.queue_max_offset(topic, queue_id) < offset:
                store.reserve_queue_offsets(topic, queue_id, offset)
                raised[(topic, queue_id)] = offset
    return RepairReport(check, moved_to, raised)


def _record_losses(ledger: LossLedger, check: Report) -> None:
    """Write what the repair drops to the ledger: one loss per damaged or missing range, with
    the records lost in it (the ids named, the rest counted), and one covering no bytes for
    the records of no range (cut off past the end of the log, or known only by their queue
    offsets). A record in a range the ledger has already (found by a reader, the scrub,
    recovery, or a repair a crash cut short) is not counted again. A loss covers its own
    range only: damage found later elsewhere is a new loss."""
    known = ledger.all()
    ranges = [*check.gaps, *([check.torn_tail] if check.torn_tail else [])]
    by_range: dict[Gap | None, list[LostMessage]] = {}
    for m in check.lost:
        offset = m.commit_log_offset
        if offset is None or not ledger.covers(offset):
            gap = next((gap for gap in ranges if offset is not None and gap.start <= offset < gap.end), None)
            by_range.setdefault(gap, []).append(m)
    unlisted = max(0, check.lost_count - len(check.lost))  # records nothing names or places
    if unlisted:
        by_range.setdefault(None, [])

    def uncountable(gap: Gap | None) -> bool:
        return gap is not None and (gap.kind == "unreadable" or gap.start in check.uncountable)

    # such a range may hold records nothing names or counts (their queue entries were never
    # durable): it is a loss of its own unless one that knows so covers it already, even when
    # every record named in it was recorded before
    for gap in check.gaps:
        if uncountable(gap) and not any(loss.unreadable and loss.start <= gap.start and gap.end <= loss.end
                                        for loss in known):
            by_range.setdefault(gap, [])
    for gap, lost in sorted(by_range.items(), key=lambda item: item[0].start if item[0] else check.log_end):
        count = len(lost) + (unlisted if gap is None else 0)
        named = [m.message_id for m in lost if m.message_id]
        places = _queue_ranges(lost)
        start, end = (gap.start, gap.end) if gap else (check.log_end, check.log_end)
        where = f"{gap.kind} {gap.start}-{gap.end} ({gap.detail})" if gap else "in no range of the log"
        ledger.record("repair", start, end, named, count - len(named),
                      f"repair dropped {'at least ' if uncountable(gap) else ''}{count} records: {where}"
                      + (f"; queue offsets {', '.join(places)}" if places else ""),
                      [(m.topic, m.queue_id, m.queue_offset) for m in lost
                       if m.topic is not None and m.queue_id is not None and m.queue_offset is not None],
                      unreadable=uncountable(gap))


def _queue_ranges(lost: list[LostMessage]) -> list[str]:
    """The lost records' queue offsets, as ``topic/queue@first-last`` runs."""
    by_queue: dict[tuple[str, int], list[int]] = {}
    for m in lost:
        if m.topic is not None and m.queue_id is not None and m.queue_offset is not None:
            by_queue.setdefault((m.topic, m.queue_id), []).append(m.queue_offset)
    runs = []
    for (topic, queue_id), offsets in sorted(by_queue.items()):
        offsets.sort()
        start: int | None = offsets[0]
        for before, after in zip(offsets, [*offsets[1:], None], strict=True):
            if after != before + 1:
                runs.append(f"{topic}/{queue_id}@{start}" + (f"-{before}" if before != start else ""))
                start = after
    return runs


def _move_aside(data_dir: Path, segment_size: int, gaps: list[Gap], check: Report, fs: FileSystem) -> Path:
    """Copy the bytes of ``gaps`` and the report under ``damaged/``, durably."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = data_dir / "damaged" / stamp
    suffix = 0
    while fs.exists(target):
        suffix += 1
        target = data_dir / "damaged" / f"{stamp}-{suffix}"
    fs.mkdir(target, parents=True)
    for gap in gaps:
        segment = data_dir / "commitlog" / f"{gap.start - gap.start % segment_size:020d}"
        source = fs.open(segment, read_only=True)
        try:
            data = read_salvaging(fs, source, gap.end - gap.start, gap.start % segment_size, segment)
        finally:
            fs.close(source)
        write_atomically(target / f"{gap.start:020d}", data, fs)
    write_atomically(target / "report.json", json.dumps(check.to_json(), indent=2).encode(), fs)
    fs.fsync_directory(target.parent)
    fs.fsync_directory(data_dir)
    return target


def _fill(directory: Path, segment_size: int, gap: Gap, last_base: int, fs: FileSystem) -> None:
    """Put a blank filler where ``gap`` was, or cut the log where it ends the last segment
    (``last_base``); nothing past the last segment (a log cut short ends there). fsync'd."""
    for base in range(gap.start - gap.start % segment_size, min(gap.end, last_base + 1), segment_size):
        start, end = max(gap.start, base) - base, min(gap.end, base + segment_size) - base
        fd = fs.open(directory / f"{base:020d}", create=True)
        try:
            size = fs.fsize(fd)
            if base == last_base and end >= size:
                fs.ftruncate(fd, min(start, size))
            else:
                fs.pwrite(fd, codec.encode_blank(end - start, base + start), start)
            fs.fsync(fd)
        finally:
            fs.close(fd)


def _offsets_in_use(check: Report) -> dict[tuple[str, int], int]:
    """Per queue, the next queue offset it must hand out at least: past every offset the
    checkpoint counted and every lost record's."""
    reserved = dict(check.queue_counts)
    for message in check.lost:
        if message.topic is not None and message.queue_id is not None and message.queue_offset is not None:
            key = (message.topic, message.queue_id)
            reserved[key] = max(reserved.get(key, 0), message.queue_offset + 1)
    return reserved
