"""``fsck``: a read-only check of a stopped store's data directory.

Walks every commit log segment and verifies every record (magic, crc), past damage to the
next intact record; checks the log's shape against the checkpoint (no segment missing,
closed segments whole, the log as long as the checkpoint says); compares every record with
its consume queue entry and its index entries; and names the records the damage took, from
every source that survives: the queue entries and index entries that point into damaged or
missing bytes or past the end of the log (a record with an entry was dispatched, so durable
and, in sync flush mode, acknowledged), what can still be read of a damaged record's
header, and the checkpoint's per-queue counts (a queue offset below its count with no intact
record was lost, even when its queue files are gone). Where no byte names a lost record it
is counted exactly. The loss ledger's open losses are problems until acknowledged. Start-up
takes care of some findings by itself (a torn tail after the checkpoint that nothing
dispatched, queue and index entries after it): those are notes, the rest problems.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CorruptStateError
from . import codec
from .commitlog import (
    Gap,
    damage_in_chain,
    damage_kind,
    layout_gaps,
    unreadable_header,
    walk,
    written_ahead,
)
from .config import StoreConfig
from .consume_queue import ENTRY, ENTRY_SIZE, file_name
from .filesystem import REAL, FileSystem, read_salvaging
from .index import IndexFile, IndexFileError, key_hash, salvaged_id
from .index_filter import FilterFileError, KeyFilter
from .losses import Loss, LossLedger, Name, Namer, Place
from .message_store import lock_directory, pinned_layout, read_checkpoint
from .record import PROPERTY_KEYS, PROPERTY_MESSAGE_ID, StoredRecord

_OPEN_FILES = 64  # descriptors the check keeps open at once


@dataclass(frozen=True, slots=True)
class LostMessage:
    """A record that damage took, with what is known of it (None: unknown)."""

    commit_log_offset: int | None
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    message_id: str | None = None

    def describe(self) -> str:
        where = f"{self.topic}/{self.queue_id}@{self.queue_offset}" if self.topic else "unknown queue"
        offset = "unknown" if self.commit_log_offset is None else self.commit_log_offset
        return f"{self.message_id or 'unknown id'} ({where}, commit log offset {offset})"


@dataclass
class Report:
    """What ``check`` found. ``gaps`` are damaged or missing commit log ranges holding
    acknowledged records; ``torn_tail`` is the end of the log that start-up truncates."""

    data_dir: Path
    records: int = 0
    segments: int = 0
    checkpoint: int = 0
    log_end: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    torn_tail: Gap | None = None
    #: the lost records known one by one (by offset, queue offset or id)
    lost: list[LostMessage] = field(default_factory=list)
    #: how many records the damage took, exactly: ``lost`` and those nothing names
    lost_count: int = 0
    #: the starts of the ``gaps`` that may hold records no byte counts (an unreadable header,
    #: or the chain of lengths broken past the checkpoint): their count is a lower bound
    #: (``Loss.unreadable``)
    uncountable: set[int] = field(default_factory=set)
    #: per queue, the entry count the checkpoint recorded
    queue_counts: dict[tuple[str, int], int] = field(default_factory=dict)
    #: losses found earlier (recovery, repair, the scrub) that nobody acknowledged yet
    open_losses: list[Loss] = field(default_factory=list)

    @property
    def lost_ids(self) -> list[str]:
        """The message ids of the lost records that a surviving byte names, one per record."""
        return [message.message_id for message in self.lost if message.message_id]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir), "ok": self.ok, "records": self.records,
            "segments": self.segments, "checkpoint": self.checkpoint, "log_end": self.log_end,
            "problems": self.problems, "notes": self.notes,
            "gaps": [dataclasses.asdict(gap) for gap in self.gaps],
            "torn_tail": dataclasses.asdict(self.torn_tail) if self.torn_tail else None,
            "lost": [dataclasses.asdict(message) for message in self.lost], "lost_count": self.lost_count,
            "open_losses": [loss.to_json() for loss in self.open_losses],
        }

    def lines(self) -> list[str]:
        """The report for a terminal."""
        lines = [f"{self.data_dir}: {self.records} intact records in {self.segments} segments, "
                 f"log end {self.log_end}, checkpoint {self.checkpoint}"]
        lines += [f"PROBLEM {problem}" for problem in self.problems]
        lines += [f"note: {note}" for note in self.notes]
        lines += lost_lines(self.lost, self.lost_count)
        if self.problems:
            lines.append(f"salvage with `halfmoon-broker repair --data-dir {self.data_dir}`")
        return lines


def lost_lines(lost: list[LostMessage], count: int) -> list[str]:
    """The lost records for a terminal: those known one by one, then how many nothing names."""
    if not count:
        return []
    lines = [f"lost records: {count}"]
    lines += [f"  {message.describe()}" for message in lost]
    if count > len(lost):
        lines.append(f"  and {count - len(lost)} records that no surviving byte names")
    return lines


class _Files:
    """Read-only descriptors of a few files at a time (least recently used closed)."""

    def __init__(self, fs: FileSystem) -> None:
        self.fs = fs
        self._open: OrderedDict[Path, int] = OrderedDict()

    def pread(self, path: Path, length: int, position: int) -> bytes:
        fd = self._open.get(path)
        if fd is None:
            fd = self._open[path] = self.fs.open(path, read_only=True)
            while len(self._open) > _OPEN_FILES:
                self.fs.close(self._open.popitem(last=False)[1])
        self._open.move_to_end(path)
        return read_salvaging(self.fs, fd, length, position, path)

    def close(self) -> None:
        for fd in self._open.values():
            self.fs.close(fd)
        self._open.clear()


@dataclass
class _Queue:
    """One consume queue's files (read only) and what the check found in them."""

    directory: Path
    per_file: int
    count: int = 0  # entries in the files: the last file's number and size
    first: int = 0  # the first queue offset of the first file
    first_seen: int | None = None  # the lowest queue offset of an intact record
    last_seen: int = -1  # the highest queue offset of an intact record
    missing: int = 0  # records before the checkpoint without their entry
    wrong: int = 0  # entries pointing elsewhere than their record
    first_bad: int | None = None
    skipped: list[int] = field(default_factory=list)  # queue offsets with no intact record
    #: the commit log offsets of the intact records around each skipped queue offset, and
    #: of the first and last intact record: where a record lost at a queue offset lay
    around: dict[int, tuple[int, int]] = field(default_factory=dict)
    first_at: int = 0
    last_at: int = -1
    fs: FileSystem = field(default=REAL, repr=False)

    def __post_init__(self) -> None:
        fs = self.fs
        firsts = sorted(int(name) for name in fs.listdir(self.directory) if name.isdigit()) \
            if fs.is_dir(self.directory) else []
        if firsts:
            size = fs.size(self.directory / file_name(firsts[-1]))
            self.count = firsts[-1] + size // ENTRY_SIZE
            self.first = firsts[0]

    def without_record(self, low: int, count: int) -> list[int]:
        """The queue offsets in ``[low, count)`` that no intact record has, each once."""
        if self.first_seen is None:
            return list(range(low, count))
        return [*range(low, min(self.first_seen, count)), *self.skipped, *range(max(self.last_seen + 1, low), count)]

    def could_hold(self, queue_offset: int, commit_log_offset: int) -> bool:
        """Whether the record lost at ``queue_offset`` may have lain at ``commit_log_offset``
        (between the intact records of this queue around it: the log keeps a queue's order)."""
        if queue_offset in self.around:
            before, after = self.around[queue_offset]
            return before < commit_log_offset < after
        if self.first_seen is not None and queue_offset < self.first_seen:
            return commit_log_offset < self.first_at
        return commit_log_offset > self.last_at

    def entry(self, files: _Files, queue_offset: int) -> tuple[int, int] | None:
        """``(commit log offset, size)`` of an entry, None if its file lacks it."""
        number, index = divmod(queue_offset, self.per_file)
        try:
            raw = files.pread(self.directory / file_name(number * self.per_file), ENTRY_SIZE, index * ENTRY_SIZE)
        except FileNotFoundError:
            return None
        if len(raw) < ENTRY_SIZE:
            return None
        offset, size, _ = ENTRY.unpack(raw)
        return offset, size

    def bad(self, queue_offset: int) -> None:
        if self.first_bad is None or queue_offset < self.first_bad:
            self.first_bad = queue_offset


@contextmanager
def locked(data_dir: Path, shared: bool, fs: FileSystem = REAL) -> Iterator[None]:
    """Hold the data directory's lock (``DataDirLockedError`` while a store has it open);
    a shared lock needs no lock file where no store ever made one."""
    if shared and not fs.exists(data_dir / "lock"):
        yield
        return
    fd = lock_directory(data_dir, shared, fs)
    try:
        yield
    finally:
        fs.unlock(fd)


@dataclass
class Ledger:
    """The loss ledger of a data directory, for ``halfmoon-broker losses``."""

    data_dir: Path
    losses: list[Loss]
    #: ``LossLedger.unreadable``: an earlier ledger set aside, not acknowledged yet.
    unreadable: str | None = None

    @property
    def open(self) -> list[Loss]:
        return [loss for loss in self.losses if not loss.acknowledged]

    def to_json(self) -> dict[str, Any]:
        return {"data_dir": str(self.data_dir), "open": [loss.to_json() for loss in self.open],
                "acknowledged": [loss.to_json() for loss in self.losses if loss.acknowledged],
                "unreadable": self.unreadable}

    def lines(self) -> list[str]:
        """The ledger for a terminal: open losses with their ids, then a count of the rest."""
        lines = [f"{self.data_dir}: {len(self.open)} open losses, "
                 f"{len(self.losses) - len(self.open)} acknowledged"]
        for loss in self.open:
            lines.append(f"  {loss.describe()}")
            lines += [f"    {message_id}" for message_id in loss.message_ids]
        if self.unreadable:
            lines.append(f"  {self.unreadable}")
        if self.open or self.unreadable:
            lines.append(f"once dealt with: `halfmoon-broker losses --data-dir {self.data_dir} --acknowledge [ID ...]` "
                         "(no ID: every open loss and a ledger set aside)")
        return lines


def list_losses(data_dir: Path, fs: FileSystem = REAL) -> Ledger:
    """The ledger of a stopped store's directory (read only)."""
    with locked(data_dir, shared=True, fs=fs):
        ledger = LossLedger(data_dir, fs)
        return Ledger(data_dir, ledger.all(), ledger.unreadable)


def acknowledge_losses(data_dir: Path, loss_ids: list[int] | None, fs: FileSystem = REAL) -> list[Loss]:
    """Mark losses of a stopped store's directory as dealt with (None: every open one);
    ``ValueError`` for an id the ledger does not have."""
    with locked(data_dir, shared=False, fs=fs):
        ledger = LossLedger(data_dir, fs)
        unknown = set(loss_ids or ()) - {loss.loss_id for loss in ledger.all()}
        if unknown:
            raise ValueError(f"no loss {', '.join(map(str, sorted(unknown)))} in the ledger of {data_dir}")
        return ledger.acknowledge(loss_ids)


def check(data_dir: Path, namer: Namer | None = None, fs: FileSystem = REAL) -> Report:
    """Check a stopped store's directory without changing anything (``namer``: names the
    layers above the store keep, to name lost records by; ``fs``: the file layer)."""
    with locked(data_dir, shared=True, fs=fs):
        return inspect(data_dir, namer, fs)


def inspect(data_dir: Path, namer: Namer | None = None, fs: FileSystem = REAL) -> Report:
    """``check`` for a caller that holds the directory's lock."""
    config = pinned_layout(data_dir, StoreConfig(filesystem=fs))
    checkpoint = read_checkpoint(data_dir, fs)
    report = Report(data_dir, checkpoint=int(checkpoint.get("verified", 0)))
    for topic, by_id in (checkpoint.get("queues") or {}).items():
        report.queue_counts.update({(topic, int(queue_id)): count for queue_id, count in by_id.items()})
    files = _Files(fs)
    try:
        ledger = LossLedger(data_dir, fs)
    except CorruptStateError as exc:
        report.problems.append(str(exc))
        ledger = LossLedger(data_dir, fs, read=False)
    try:
        _Inspection(data_dir, config, report, files, namer, ledger).run()
    finally:
        files.close()
    report.open_losses = ledger.open_losses()
    report.problems += [f"open {loss.describe()} (`halfmoon-broker losses --acknowledge {loss.loss_id}` "
                        "once dealt with)" for loss in report.open_losses]
    if ledger.unreadable:
        report.problems.append(f"{ledger.unreadable} (`halfmoon-broker losses --acknowledge` once dealt with)")
    return report


class _Inspection:
    """One pass of ``inspect`` over a directory."""

    def __init__(self, data_dir: Path, config: StoreConfig, report: Report, files: _Files,
                 namer: Namer | None, ledger: LossLedger) -> None:
        self.data_dir = data_dir
        #: the places of lost records the ledger has: not counted again where their hole
        #: is gone with the consume queue that kept it
        self.recorded = ledger.places()
        self.ledger = ledger
        self.fs = config.filesystem
        self.namer = namer
        self.names: list[Name] = list(namer.from_files(data_dir)) if namer else []
        self.config = config
        self.report = report
        self.files = files
        self.queues: dict[tuple[str, int], _Queue] = {}
        self._open_queues()
        self.index = self._open_index()
        #: the offsets an index file holds for a hash: a key shared by many records has a
        #: long chain, walked once rather than once per record
        self._indexed = functools.lru_cache(maxsize=4096)(
            lambda number, hash_: frozenset(self.index[number].lookup(hash_)))
        self.unindexed = [0, 0]  # records before / after the checkpoint missing from the index
        self.keys_past_checkpoint: set[int] = set()  # the key hashes of intact records there
        self.first_unindexed: int | None = None
        #: the offsets of the index's entries by hash, once a salvaged id is checked (``_own_id``)
        self._offsets_by_hash: dict[int, list[int]] | None = None
        #: where a damaged range's chain of lengths led to a header on an unreadable page, or
        #: a zeroed one (``_heads_in``)
        self.uncountable_heads: set[int] = set()

    def run(self) -> None:
        report = self.report
        directory = self.data_dir / "commitlog"
        fs = self.fs
        paths = sorted(directory / name for name in fs.listdir(directory) if name.isdigit()) \
            if fs.is_dir(directory) else []
        layout = [(int(path.name), fs.size(path)) for path in paths]
        report.segments = len(paths)
        gaps = layout_gaps(layout, self.config.segment_size, report.checkpoint)
        for number, (path, (base, size)) in enumerate(zip(paths, layout, strict=True)):
            data = self.files.pread(path, size, 0)
            trailing: list[Gap] = []  # the ranges after the last intact record
            for item in walk(data, base, 0, self.config.segment_size):
                if isinstance(item, StoredRecord):
                    self._record(item)
                    trailing = []
                else:
                    gaps.append(item)
                    trailing.append(item)
            report.log_end = base + len(data)
            # from the first range with nothing but fillers after it (an interrupted append's),
            # as recovery truncates
            if number == len(paths) - 1 and trailing and trailing[0].start >= report.checkpoint \
                    and not damage_in_chain(data, trailing[0].start - base, base):
                gaps = [gap for gap in gaps if gap not in trailing]
                first = trailing[0]
                if written_ahead(first, report.log_end):  # left by a crash
                    report.notes.append(f"{first.end - first.start} bytes of zeros after the last record, at "
                                        f"offset {first.start}: written ahead of it, start-up cuts them")
                else:
                    report.torn_tail = Gap(first.start, report.log_end, first.kind, first.detail)
                    report.notes.append(f"torn tail of {report.torn_tail.end - first.start} bytes at offset "
                                        f"{first.start} ({first.detail}): never acknowledged, start-up "
                                        "truncates it")
                report.log_end = first.start
        report.gaps = sorted(gaps, key=lambda gap: gap.start)
        for gap in report.gaps:
            report.problems.append(f"commit log: {gap.end - gap.start} bytes {gap.kind} at offset "
                                   f"{gap.start} ({gap.detail})")
        self._find_lost()
        cut_off = sum(1 for message in report.lost
                      if message.commit_log_offset is not None and message.commit_log_offset >= report.log_end)
        if cut_off:
            report.problems.append(
                f"commit log: {cut_off} records past its end at offset {report.log_end} were dispatched (consume "
                "queue or index entries point at them): a cut log took acknowledged records")
        self._report_queues()
        self._report_index()

    # -- consume queues -------------------------------------------------------------------
    def _open_queues(self) -> None:
        root = self.data_dir / "consumequeue"
        fs = self.fs
        for topic_dir in sorted(root / name for name in fs.listdir(root)) if fs.is_dir(root) else []:
            for queue_dir in sorted(topic_dir / name for name in fs.listdir(topic_dir)):
                if queue_dir.name.isdigit():
                    if fs.is_file(queue_dir):
                        self.report.notes.append(f"consume queue {topic_dir.name}/{queue_dir.name}: "
                                                 "the old single-file layout, converted on start")
                        continue
                    self._queue(topic_dir.name, int(queue_dir.name))
        for topic, queue_id in self.report.queue_counts:  # the checkpoint's, maybe deleted
            self._queue(topic, queue_id)

    def _queue(self, topic: str, queue_id: int) -> _Queue:
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            directory = self.data_dir / "consumequeue" / topic / str(queue_id)
            queue = self.queues[(topic, queue_id)] = _Queue(directory, self.config.consume_queue_file_entries,
                                                                   fs=self.fs)
        return queue

    def _record(self, record: StoredRecord) -> None:
        self.report.records += 1
        if self.namer is not None:
            self.names += self.namer.from_record(record)
        queue = self._queue(record.topic, record.queue_id)
        if queue.last_seen >= 0:
            queue.skipped += range(queue.last_seen + 1, record.queue_offset)
            queue.around.update((queue_offset, (queue.last_at, record.commit_log_offset))
                                for queue_offset in range(queue.last_seen + 1, record.queue_offset))
        else:
            queue.first_seen = record.queue_offset
            queue.first_at = record.commit_log_offset
        if record.queue_offset > queue.last_seen:
            queue.last_at = record.commit_log_offset
        queue.last_seen = max(queue.last_seen, record.queue_offset)
        entry = queue.entry(self.files, record.queue_offset)
        if entry is None:
            if record.commit_log_offset < self.report.checkpoint:
                queue.missing += 1
                queue.bad(record.queue_offset)
        elif entry != (record.commit_log_offset, record.size):
            queue.wrong += 1
            queue.bad(record.queue_offset)
        self._check_index(record)

    def _report_queues(self) -> None:
        for (topic, queue_id), queue in sorted(self.queues.items()):
            name = f"consume queue {topic}/{queue_id}"
            if queue.missing or queue.wrong:
                self.report.problems.append(
                    f"{name}: {queue.missing} entries missing, {queue.wrong} wrong "
                    f"(from queue offset {queue.first_bad} on)")
            expected = self.report.queue_counts.get((topic, queue_id), 0)
            if queue.count < expected and queue.last_seen < 0:
                self.report.problems.append(
                    f"{name}: {queue.count} entries, the checkpoint counted {expected}")

    # -- what was lost ---------------------------------------------------------------------
    def _find_lost(self) -> None:
        """Name and count the records the damage took (see the module docstring)."""
        report = self.report
        gaps = report.gaps
        starts = [gap.start for gap in gaps]

        def destroyed(offset: int) -> bool:
            at = bisect.bisect_right(starts, offset) - 1
            return offset >= report.log_end or (at >= 0 and offset < gaps[at].end)

        known: dict[int, LostMessage] = {}
        for (topic, queue_id), queue in self.queues.items():
            for queue_offset in queue.without_record(queue.first, queue.count):
                entry = queue.entry(self.files, queue_offset)
                if entry is not None and entry[1] and destroyed(entry[0]):  # not a hole: a loss repaired before
                    known[entry[0]] = LostMessage(entry[0], topic, queue_id, queue_offset)
        chained: list[tuple[int, int, set[int]]] = []  # ranges whose every record start is known
        for gap in gaps:
            if gap.kind != "missing":
                heads = self._heads_in(gap)
                for offset in heads:
                    known.setdefault(offset, LostMessage(offset))
                if self._chained_to_end(gap, heads):
                    chained.append((gap.start, gap.end, set(heads)))
        indexed = self._index_entries()
        for offset in indexed:
            # inside a record of a range whose chain of lengths is whole: an index entry a
            # crash tore (its offset's last bytes unwritten) or left stale, no record's start
            if destroyed(offset) and not any(start <= offset < end and offset not in heads
                                             for start, end, heads in chained):
                known.setdefault(offset, LostMessage(offset))
        uncounted = self._uncounted_positions()
        claimed = {(m.topic, m.queue_id, m.queue_offset) for m in known.values() if m.topic is not None}
        # the places salvaged headers name first, the guesses for the others after (a header's
        # own word outweighs a guess for one zeroed or unreadable between the same records)
        guessed: list[int] = []
        for offset, message in list(known.items()):
            head = self._salvage(offset)
            if head is not None:
                # a queue entry's place stands; a damaged header's only where no intact record
                # is and no queue entry put another lost record (its queue id may be zeroed, say)
                place = (message.topic, message.queue_id, message.queue_offset)
                salvaged = (head.topic, head.queue_id, head.queue_offset)
                if message.topic is None and salvaged not in uncounted and salvaged not in self.recorded:
                    # one of the three fields damaged: the lost place that the other two name
                    # and where the record lay, between the intact records of its queue
                    salvaged = next((p for p in uncounted if p not in claimed
                                     and sum(map(operator.eq, p, salvaged)) == 2
                                     and self.queues[p[:2]].could_hold(p[2], offset)), salvaged)
                if message.topic is None and (salvaged in self.recorded or  # the ledger has it there
                                              salvaged in uncounted and salvaged not in claimed):
                    place = salvaged
                    claimed.add(salvaged)
                known[offset] = LostMessage(offset, *place, self._own_id(offset, head, indexed, destroyed))
            elif message.topic is None and (offset in self.uncountable_heads or offset >= report.checkpoint) \
                    and not self.ledger.covers(offset):
                # (one the ledger has, recorded by a repair a crash cut short with its place if
                # it had one, would take a place no loss holds yet and keep it unrecorded)
                guessed.append(offset)
            elif message.topic is None and offset in starts and offset not in self.uncountable_heads:
                del known[offset]  # damaged bytes at a gap's start that no entry says held a record
        # a header on an unreadable page or zeroed, or a record past the checkpoint (an index
        # entry's; a lost place past its queue's checkpoint count): the lost place of a record
        # that may have lain there is the same record, as far as any byte tells (the count is
        # a lower bound); as many such heads as can get one, none twice (``_match``)

        def fits(offset: int, place: Place) -> bool:
            return ((offset in self.uncountable_heads or place[2] >= report.queue_counts.get(place[:2], 0))
                    and self.queues[place[:2]].could_hold(place[2], offset))

        held = _match(guessed, [place for place in uncounted if place not in claimed], fits)
        for offset in guessed:
            if offset in held:
                known[offset] = LostMessage(offset, *held[offset])
            elif offset in starts and offset not in self.uncountable_heads:
                del known[offset]  # as above
        _unname_twins(known, indexed)
        self._name(known, indexed)
        placed = {(m.topic, m.queue_id, m.queue_offset) for m in known.values() if m.topic is not None}
        unplaced = [m for m in known.values() if m.topic is None]
        counted = [LostMessage(None, topic, queue_id, queue_offset)
                   for topic, queue_id, queue_offset in uncounted if
                   (topic, queue_id, queue_offset) not in placed]
        # a record below the checkpoint is one of the queue offsets the checkpoint counted:
        # where every such offset is counted (queue counts, no retention cut), those are the
        # count (an index entry alone may be stale, or torn by a crash into an offset where
        # no record started)
        below = [m for m in unplaced if m.commit_log_offset is not None and m.commit_log_offset < report.checkpoint]
        exact = report.queue_counts and self.fs.exists(self.data_dir / "commitlog" / f"{0:020d}")
        below_count = len(counted) if exact else max(len(below), len(counted))
        report.lost_count = len(known) - len(below) + below_count
        report.lost = sorted([*(m for m in known.values() if m.topic or m.message_id or m not in below), *counted],
                             key=lambda m: (m.commit_log_offset is None, m.commit_log_offset or 0,
                                            m.topic or "", m.queue_id or 0, m.queue_offset or 0))

    def _uncounted_positions(self) -> list[tuple[str, int, int]]:
        """Queue offsets the checkpoint counted (or intact records pass) that hold no intact
        record and no hole: lost records, even where their queue files are gone. Below a
        queue's first intact record only when the log still starts at 0 (nothing was ever
        deleted by retention)."""
        directory = self.data_dir / "commitlog"
        from_zero = self.fs.exists(directory / f"{0:020d}")
        found = []
        for (topic, queue_id), queue in self.queues.items():
            if queue.first_seen is None and not from_zero:
                continue
            count = max(self.report.queue_counts.get((topic, queue_id), 0), queue.last_seen + 1)
            low = 0 if from_zero else queue.first_seen or 0
            for queue_offset in queue.without_record(low, count):
                entry = queue.entry(self.files, queue_offset)
                # no entry, or one the walk found no record for, and not a loss recorded before
                if (entry is None or entry[1]) and (topic, queue_id, queue_offset) not in self.recorded:
                    found.append((topic, queue_id, queue_offset))
        return found

    def _own_id(self, offset: int, head: codec.RecordHead, indexed: dict[int, set[int]],
                destroyed: Callable[[int], bool]) -> str | None:
        """The message id a damaged record's salvaged ``head`` says, if it names the record
        (``salvaged_id``): confirmed by its own index entries or, with none of them left, held
        by no intact record elsewhere (else the record is counted, as the scrub does)."""

        def held_elsewhere(message_id: str) -> bool:
            if self._offsets_by_hash is None:  # once per run, and only when a header is salvaged
                self._offsets_by_hash = {}
                for at, hashes in indexed.items():
                    for each in hashes:
                        self._offsets_by_hash.setdefault(each, []).append(at)
            for other in self._offsets_by_hash.get(key_hash("i", "", message_id), ()):
                if other != offset and not destroyed(other):
                    held = self._salvage(other)
                    if held is not None and held.properties.get(PROPERTY_MESSAGE_ID) == message_id:
                        return True
            return False

        return salvaged_id(head.properties.get(PROPERTY_MESSAGE_ID), indexed.get(offset, set()), held_elsewhere)

    def _name(self, known: dict[int, LostMessage], indexed: dict[int, set[int]]) -> None:
        """Name lost records no header names by the ``namer``'s names: at their offset, or
        by an index entry of the record with the hash of the id."""
        at_offset = {offset: message_id for offset, message_id in self.names if offset is not None}
        by_hash = {key_hash("i", "", message_id): message_id for _, message_id in self.names}
        for offset, message in known.items():
            if message.message_id is None:
                found = at_offset.get(offset) or next(
                    (by_hash[hash_] for hash_ in indexed.get(offset, ()) if hash_ in by_hash), None)
                if found is not None:
                    known[offset] = dataclasses.replace(message, message_id=found)

    def _index_entries(self) -> dict[int, set[int]]:
        """The commit log offsets the index points at, with the hashes of their entries:
        before the end of the log, all of them; past it, those of the newest entries
        (records dispatched before a cut; an older entry past the end is left from an
        earlier crash), but for those each of whose keys intact records past the checkpoint
        have too (a torn entry: its offset's bytes part old, part new; or a copy's: nothing
        lost)."""
        end = self.report.log_end
        indexed: dict[int, set[int]] = {}
        for file in self.index:
            for hash_, offset in file.entries():
                if offset < end:
                    indexed.setdefault(offset, set()).add(hash_)
        past: dict[int, set[int]] = {}
        for file in reversed(self.index):
            tail = file.tail(end)
            for _, hash_, offset, _ in tail:
                past.setdefault(offset, set()).add(hash_)
            if len(tail) < file.count:
                break
        indexed.update((offset, hashes) for offset, hashes in past.items() if not hashes <= self.keys_past_checkpoint)
        return indexed

    def _heads_in(self, gap: Gap) -> list[int]:
        """Where records began in a damaged range: its start, and each record after it
        that the headers before it lead to (the length of one to the next, each with its
        magic and offset); a damaged length ends the chain, and so does a header on an
        unreadable page, or one of zeros past the checkpoint amid records (a record began
        there, its length is lost: ``uncountable_heads``; zeros: the write of records that
        never reached their place, such as a misdirected one's, whose queue and index entries
        were not synced yet: below the checkpoint its queue counts tell of them). A chain that
        ends before a range reaching past the checkpoint does leaves its count a lower bound
        (``Report.uncountable``)."""
        heads = [gap.start]
        base = gap.start - gap.start % self.config.segment_size
        path = self.data_dir / "commitlog" / f"{base:020d}"
        offset = gap.start
        while offset < gap.end:
            try:
                head = codec.decode_head(functools.partial(self._read_at, path, offset - base), offset)
            except (codec.RecordError, FileNotFoundError):
                header = self._read_at(path, offset - base, 0, codec.HEAD_SIZE)
                if not any(header) and self._written_ahead(path, offset, base, gap.end):
                    break  # the log's unwritten (preallocated) end, where the chain's records end
                if gap.end > self.report.checkpoint:
                    # no queue count tells how many records the rest of the range held past
                    # the checkpoint (a misdirected write's copy over their headers, say)
                    self.report.uncountable.add(gap.start)
                # at a segment's end it may be the blank's place, not a record's: the range's
                # count stays a lower bound (``Report.uncountable``), and zeros there are the blank's
                at_segment_end = gap.end % self.config.segment_size == 0
                zeroed = not any(header) and offset >= self.report.checkpoint and not at_segment_end
                if unreadable_header(header) and at_segment_end:
                    self.report.uncountable.add(gap.start)
                elif unreadable_header(header) or zeroed:
                    # a record began here (the range's start, or where a length led), its
                    # header on an unreadable page or zeroed: how many more did is unknown
                    self.uncountable_heads.add(offset)
                    self.report.uncountable.add(gap.start)
                    if offset not in heads:
                        heads.append(offset)
                break
            if offset not in heads:
                heads.append(offset)
            offset += head.size
        return heads

    def _chained_to_end(self, gap: Gap, heads: list[int]) -> bool:
        """Whether the lengths of the records at ``heads`` (``_heads_in``) lead from ``gap``'s
        start to exactly its end, where an intact record follows: then no other record
        began in it."""
        last = heads[-1]
        if last in self.uncountable_heads or gap.end >= self.report.log_end:
            return False
        base = last - last % self.config.segment_size
        path = self.data_dir / "commitlog" / f"{base:020d}"
        total, magic = codec.peek_length(self._read_at(path, last - base, 0, codec.HEAD_SIZE), 0)
        return codec.is_record_magic(magic) and last + total == gap.end

    def _written_ahead(self, path: Path, offset: int, base: int, end: int) -> bool:
        """Whether the bytes of the segment at ``path`` (from ``base``) from ``offset`` to
        ``end`` are the zeros the log writes ahead of its records (``written_ahead``)."""
        if end != self.report.log_end:
            return False  # not read: only the log's end can be
        rest = self._read_at(path, offset - base, 0, end - offset)
        return written_ahead(Gap(offset, end, damage_kind(rest, 0, len(rest)), ""), self.report.log_end)

    def _read_at(self, path: Path, position: int, start: int, length: int) -> bytes:
        return self.files.pread(path, length, position + start)

    def _salvage(self, offset: int) -> codec.RecordHead | None:
        """What the header of a damaged record at ``offset`` still says, if anything."""
        base = offset - offset % self.config.segment_size
        path = self.data_dir / "commitlog" / f"{base:020d}"
        try:
            return codec.decode_head(
                lambda start, length: self.files.pread(path, length, offset - base + start), offset,
                salvage=True)
        except (codec.RecordError, FileNotFoundError):
            return None

    # -- the index --------------------------------------------------------------------------
    def _open_index(self) -> list[IndexFile]:
        directory = self.data_dir / "index"
        fs = self.fs
        paths = sorted(directory / name for name in fs.listdir(directory) if name.isdigit()) \
            if fs.is_dir(directory) else []
        opened: list[IndexFile] = []
        for path in paths:
            try:
                opened.append(IndexFile.open(path, fs))
            except (OSError, IndexFileError) as exc:
                self.report.problems.append(f"index file {path.name} is unreadable ({exc})")
        numbers = [int(path.name) for path in paths]
        if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            self.report.problems.append(f"index files missing between {numbers[0]} and {numbers[-1]}")
        return opened

    def _check_index(self, record: StoredRecord) -> None:
        message_id = record.properties.get(PROPERTY_MESSAGE_ID)
        hashes = [key_hash("i", "", message_id)] if message_id else []
        hashes += [key_hash("k", record.topic, key)
                   for key in dict.fromkeys(record.properties.get(PROPERTY_KEYS, "").split())]
        offset = record.commit_log_offset
        if offset >= self.report.checkpoint:
            self.keys_past_checkpoint.update(hashes)
        files = [number for number, file in enumerate(self.index) if file.low_offset <= offset <= file.high_offset]
        if all(any(offset in self._indexed(number, hash_) for number in files) for hash_ in hashes):
            return
        self.unindexed[offset >= self.report.checkpoint] += 1
        if self.first_unindexed is None:
            self.first_unindexed = offset

    def _report_index(self) -> None:
        before, after = self.unindexed
        if before:
            self.report.problems.append(f"index: {before} records before the checkpoint are not in it "
                                        f"(first at commit log offset {self.first_unindexed})")
        if after:
            self.report.notes.append(f"index: {after} records after the checkpoint are not in it "
                                     "(indexed on start)")
        self._check_filters()
        for file in self.index:
            file.close()

    def _check_filters(self) -> None:
        """Each index file's filter must hold every key it covers of its file (lookups skip
        the files whose filter says no): a full file's all of them, the newest file's those
        a checkpoint or the clean close wrote it with (the broker adds the rest as it
        opens). One that does not match its file is only a note: the broker looks that
        file up without it, or builds the newest's again."""
        for file in self.index:
            newest = file is self.index[-1]
            try:
                kept = KeyFilter.open(file.path, file.capacity, file.count, file.low_offset, self.fs,
                                      in_memory=newest)
            except FileNotFoundError:
                continue
            except (OSError, FilterFileError) as exc:
                self.report.notes.append(f"the filter of index file {file.path.name} is not used ({exc})")
                continue
            try:
                covered = itertools.islice(file.entries(), kept.covered if newest else None)
                missed = sum(not kept.may_contain(hash_) for hash_, _ in covered)
            finally:
                kept.close()
            if missed:
                self.report.problems.append(
                    f"the filter of index file {file.path.name} lacks {missed} of its keys: lookups miss them")


def _unname_twins(known: dict[int, LostMessage], indexed: dict[int, set[int]]) -> None:
    """Where the damaged headers of several lost records say one message id (a flipped bit
    made one of them another's), keep it only on the one whose index entry has its hash, if
    exactly one does: the others are counted, not named (naming both, the wrong one may be
    resent, and the right one counted twice)."""
    by_id: dict[str, list[int]] = {}
    for offset, message in known.items():
        if message.message_id is not None:
            by_id.setdefault(message.message_id, []).append(offset)
    for message_id, offsets in by_id.items():
        if len(offsets) > 1:
            hash_ = key_hash("i", "", message_id)
            proven = [offset for offset in offsets if hash_ in indexed.get(offset, ())]
            for offset in offsets:
                if proven != [offset]:
                    known[offset] = dataclasses.replace(known[offset], message_id=None)


def _match(heads: list[int], places: list[Place], fits: Callable[[int, Place], bool]) -> dict[int, Place]:
    """Give as many ``heads`` as can be one of ``places`` that ``fits`` each, no place
    twice (a maximum matching): each head takes the first free place that fits it, then a
    head left without one takes a place whose head can move to another. Taken in order
    alone, a head that fits many places may take the one place another fits, and that
    record is counted twice: once by its head, once by its place."""
    owner: dict[Place, int] = {}
    held: dict[int, Place] = {}
    for head in heads:
        place = next((p for p in places if p not in owner and fits(head, p)), None)
        if place is not None:
            owner[place], held[head] = head, place
    for head in heads:
        if len(owner) == len(places):
            break  # no free place left to move to
        if head not in held:
            _move_for(head, places, fits, owner, held)
    return held


def _move_for(head: int, places: list[Place], fits: Callable[[int, Place], bool],
              owner: dict[Place, int], held: dict[int, Place]) -> None:
    """Find ``head`` a place by moving heads that hold places it fits to other places they
    fit (a breadth-first search for a free place at the end of such a chain), if any."""
    reached: dict[Place, tuple[int, Place | None]] = {}  # place -> the head that reached it, and its place
    frontier: list[tuple[int, Place | None]] = [(head, None)]
    seen = {head}
    while frontier:
        following: list[tuple[int, Place | None]] = []
        for at, own in frontier:
            for place in places:
                if place in reached or place == own or not fits(at, place):
                    continue
                reached[place] = (at, own)
                if place not in owner:  # free: each head on the chain moves one place along
                    step: Place | None = place
                    while step is not None:
                        mover, step_back = reached[step]
                        owner[step], held[mover] = mover, step
                        step = step_back
                    return
                if owner[place] not in seen:
                    seen.add(owner[place])
                    following.append((owner[place], place))
        frontier = following
