"""The scrub: damage below the checkpoint is found in the background, not by the first reader.

Recovery verifies the records after the checkpoint only; a page of a closed segment that rots
(or is zeroed) later would otherwise stay unseen until a consumer fails on it. ``Scrub``
re-reads the commit log, every segment from the oldest to the end of the durable records,
and verifies each record's CRC, as ``fsck`` does, but in a running broker:

* **when**: a pass starts as the store opens and again ``scrub_interval_s`` after the last
  one ended (``StoreConfig``; ``scrub_bytes_per_s=0`` runs no scrub thread); a pass a stop
  or a crash interrupted resumes after the restart at the first segment it had not finished
  (``STATE_FILE``), so a broker restarted more often than a pass takes still has its newest
  segments checked;
* **cost**: its own read-only descriptors and ``pread`` in chunks of ``CHUNK`` bytes (a
  record or filler bigger than that in one read of its size), throttled to
  ``scrub_bytes_per_s``; it takes no store lock while it reads, so writers never wait for it,
  and it holds one chunk in memory, never anything that grows with the log;
* **progress**: INFO when a pass starts, every ``PROGRESS_BYTES`` checked and when it ends;
* **damage**: bytes that are neither an intact record nor a filler, up to the next intact
  record, are a damaged range. It goes to the loss ledger (``store.losses``, found by
  ``scrub``) with the records it took: counted exactly from the consume queue entries that
  point into it, named by message id where what is left of a record's header still says it
  (a zeroed header names nothing). The ledger logs it as an ERROR; ``/healthz``, ``/metrics``
  and the console show it until an operator acknowledges it. A range already in the ledger
  (from an earlier pass, a restart, recovery or ``repair``) is not recorded again.

Readers skip a record whose CRC fails (``MessageStore.read_queue``) and report it through
``damaged_record``, which records its range the same way if the scrub has not yet; so one
bad record never blocks the messages behind it. Recovery records the ranges its replay
below the checkpoint passes through ``record_gap`` too (``found_by="recovery"``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import codec
from .commitlog import Gap, Segment, damage_kind
from .files import write_atomically
from .filesystem import read_salvaging
from .index import salvaged_id
from .losses import FoundBy, Loss
from .record import PROPERTY_MESSAGE_ID

if TYPE_CHECKING:
    from .message_store import MessageStore

log = logging.getLogger(__name__)

#: Bytes read at a time.
CHUNK = 1024 * 1024
#: A progress line at INFO after every this many bytes checked (besides a pass's start and end).
PROGRESS_BYTES = 256 * 1024 * 1024
#: In the store's directory while a background pass is under way: ``{"resume_at": offset}``,
#: the commit log offset up to which it has checked whole segments (rewritten atomically
#: after each one); removed when the pass ends.
STATE_FILE = "scrub.json"


class _Stopped(Exception):
    """The store is closing: the pass ends where it is."""


class _Throttle:
    """Waits before each read so that reads average at most ``rate`` bytes a second (0: no
    limit); ``_Stopped`` once ``stop`` is set."""

    def __init__(self, rate: int, stop: threading.Event) -> None:
        self.rate = rate
        self.stop = stop
        self._next_at = time.monotonic()

    def spend(self, length: int) -> None:
        if self.stop.is_set():
            raise _Stopped
        if not self.rate:
            return
        now = time.monotonic()
        if self._next_at > now and self.stop.wait(self._next_at - now):
            raise _Stopped
        self._next_at = max(self._next_at, now) + length / self.rate


class _SegmentReader:
    """One segment file read through a window of ``CHUNK`` bytes, up to position ``end``."""

    def __init__(self, segment: Segment, end: int, throttle: _Throttle) -> None:
        self.base = segment.base_offset
        self.size = segment.size
        self.end = end
        self.throttle = throttle
        self.fs = segment.fs
        self.path = segment.path
        self.fd = self.fs.open(segment.path, read_only=True)
        self.read_bytes = 0
        self._start = 0
        self._data = b""

    def close(self) -> None:
        self.fs.close(self.fd)

    def window(self, pos: int, length: int) -> tuple[bytes, int]:
        """The window and the index of ``pos`` in it, holding ``[pos, pos + length)`` (or up
        to ``end``); read again from ``pos`` when the current one does not."""
        length = min(length, self.end - pos)
        if not self._start <= pos or pos + length > self._start + len(self._data):
            want = min(max(length, CHUNK), self.end - pos)
            self.throttle.spend(want)
            self._data = read_salvaging(self.fs, self.fd, want, pos, self.path)
            self._start = pos
            self.read_bytes += len(self._data)
            if len(self._data) < want:  # the file is shorter (cut since): it ends there
                self.end = pos + len(self._data)
        return self._data, pos - self._start

    def items(self, pos: int) -> Iterator[int | Gap]:
        """From segment position ``pos`` on, the size of each intact record and a ``Gap`` for
        each damaged range (as ``commitlog.walk``, in bounded reads)."""
        while pos < self.end:
            if self.size - pos < codec.HEAD_SIZE:
                data, index = self.window(pos, self.end - pos)
                if data.count(0, index) == len(data) - index:
                    return  # the zero filler of a segment's last few bytes
            length = self._intact_length(pos)
            if length:
                if length > 0:
                    yield length
                pos += abs(length)
                continue
            resume = self._next_intact(pos + codec.HEAD_SIZE)
            yield Gap(self.base + pos, self.base + resume, self._kind(pos, resume),
                      f"no intact record at commit log offset {self.base + pos}")
            pos = resume

    def _intact_length(self, pos: int) -> int:
        """The length of the intact record at ``pos``, minus that of an intact filler, 0
        when there is neither."""
        data, index = self.window(pos, codec.HEAD_SIZE)
        total, magic = codec.peek_length(data, index)
        if not (codec.HEAD_SIZE <= total <= self.end - pos
                and (codec.is_record_magic(magic) or magic == codec.BLANK_MAGIC)):
            return 0
        data, index = self.window(pos, total)
        if magic == codec.BLANK_MAGIC:
            return -total if codec.blank_length(data, index, self.base + pos) == total else 0
        try:
            codec.decode(data, index, self.base + pos)
        except codec.RecordError:
            return 0
        return total

    def _next_intact(self, pos: int) -> int:
        """Where the first intact record or filler at or after ``pos`` starts (``end`` if
        none does): the magic found with ``bytes.find``, each candidate decoded."""
        while pos + codec.HEAD_SIZE <= self.end:
            data, index = self.window(pos, CHUNK // 2)
            found = next(codec.magic_positions(data, index + 4), -1)
            if found < 0:
                if self._start + len(data) >= self.end:
                    break
                pos = self._start + len(data) - 7  # a magic cut by the window's end is seen next
                continue
            candidate = self._start + found - 4
            if self._intact_length(candidate):
                return candidate
            pos = candidate + 1
        return self.end

    def _kind(self, pos: int, end: int) -> str:
        kinds = set()
        for start in range(pos, end, CHUNK):
            data, index = self.window(start, min(CHUNK, end - start))
            kinds.add(damage_kind(data, index, index + min(CHUNK, end - start)))
        return "unreadable" if "unreadable" in kinds else "zeros" if kinds == {"zeros"} else "damaged"


@dataclass
class ScrubStats:
    """What the scrub did since the store opened, for ``/metrics``."""

    passes: int = 0
    checked_bytes: int = 0
    damaged_ranges: int = 0
    #: Wall-clock time (seconds since the epoch) the last full pass ended; 0: none yet.
    last_pass_end: float = 0.0
    #: Why the last pass could not read the log (an ``OSError``), None when it could.
    error: str | None = None


class Scrub:
    """The scrub of ``store``'s commit log (see the module docstring). ``start`` runs the
    passes in a daemon thread; ``run_pass`` runs one now."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.stats = ScrubStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one range is checked against the ledger and recorded at a time
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Scrub in the background: a pass now, then one every ``scrub_interval_s``; nothing
        when ``scrub_bytes_per_s`` is 0."""
        if self.store.config.scrub_bytes_per_s:
            self._thread = threading.Thread(target=self._run, name="store-scrub", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the pass under way and the thread (within one throttled read)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        resume_at = self._resume_at()
        while not self._stop.is_set():
            try:
                self._pass(resume_at, saved=True)
            except _Stopped:
                return
            except Exception:
                log.exception("the scrub pass failed")
            resume_at = 0
            if self._stop.wait(self.store.config.scrub_interval_s):
                return

    def run_pass(self) -> list[Loss]:
        """Verify every record of the commit log up to the durable end; record each damaged
        range not in the ledger yet and return those losses."""
        return self._pass(0, saved=False)

    def _pass(self, resume_at: int, saved: bool) -> list[Loss]:
        """``run_pass`` from the first segment not wholly below ``resume_at``; ``saved``: its
        progress kept in ``STATE_FILE`` (the background passes)."""
        throttle = _Throttle(self.store.config.scrub_bytes_per_s, self._stop)
        end = self.store.dispatched_end
        segments = [s for s in list(self.store.commitlog.segments)
                    if s.base_offset < end and min(s.end_offset, end) > resume_at]
        total = sum(min(s.end_offset, end) - s.base_offset for s in segments)
        started, checked, records = time.monotonic(), 0, 0
        reported = PROGRESS_BYTES
        found: list[Loss] = []
        log.info("scrub: checking %d commit log segments (%.1f MiB) from offset %d%s", len(segments),
                 total / 2**20, segments[0].base_offset if segments else end,
                 ", resuming the pass a restart interrupted" if resume_at else "")
        try:
            for segment in segments:
                if segment.base_offset < self.store.commitlog.min_offset:
                    continue  # retention deleted it meanwhile
                try:
                    reader = _SegmentReader(segment, min(segment.size, end - segment.base_offset), throttle)
                except FileNotFoundError:
                    continue
                try:
                    for item in reader.items(0):
                        if isinstance(item, Gap):
                            found += self.record_gap(item, "the scrub")
                        else:
                            records += 1
                finally:
                    reader.close()
                    checked += reader.read_bytes
                    self.stats.checked_bytes += reader.read_bytes
                if saved:
                    self._save(min(segment.end_offset, end))
                if checked >= reported:
                    log.info("scrub: %.1f of %.1f MiB checked, %d records, %d damaged ranges so far",
                             checked / 2**20, total / 2**20, records, len(found))
                    reported = checked + PROGRESS_BYTES
        except OSError as exc:
            self.stats.error = f"the scrub could not read the commit log: {exc}"
            log.error("%s", self.stats.error)
            return found
        if saved:
            self._save(None)
        self.stats.passes += 1
        self.stats.last_pass_end = time.time()
        self.stats.error = None
        log.info("scrub: pass done in %.1f s: %.1f MiB, %d records, %d new damaged ranges",
                 time.monotonic() - started, checked / 2**20, records, len(found))
        return found

    def _resume_at(self) -> int:
        """Where the background pass a restart interrupted resumes (``STATE_FILE``); 0, from
        the oldest segment, when none was under way or the file cannot be read."""
        path, fs = self.store.data_dir / STATE_FILE, self.store.fs
        try:
            if not fs.exists(path):
                return 0
            resume_at = json.loads(fs.read_bytes(path))["resume_at"]
            if isinstance(resume_at, bool) or not isinstance(resume_at, int) or resume_at < 0:
                raise ValueError(f"resume_at {resume_at!r} is not a commit log offset")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("scrub: %s is unreadable (%s); the pass starts from the oldest segment", path, exc)
            return 0
        return resume_at

    def _save(self, resume_at: int | None) -> None:
        """Keep where the background pass resumes after a restart (None: the pass ended).
        Best effort: a failed write only means a restart checks some segments again."""
        path, fs = self.store.data_dir / STATE_FILE, self.store.fs
        try:
            if resume_at is None:
                fs.unlink(path, missing_ok=True)
            else:
                write_atomically(path, json.dumps({"resume_at": resume_at}).encode(), fs)
        except OSError as exc:
            log.warning("scrub: could not record its progress in %s (%s); a restart checks those segments again",
                        path, exc)

    def damaged_record(self, offset: int, size: int, problem: str) -> None:
        """A reader skips the unreadable record at ``offset`` (``problem``: why): record the
        damaged range it starts unless the ledger has it already (cheap then: no read)."""
        if uncovered(offset, offset + size, self.store.losses.all()) == []:
            log.debug("skipping the record at commit log offset %d, a known loss: %s", offset, problem)
            return
        segment = self._segment_holding(offset)
        if segment is None:
            return  # retention deleted it
        end = min(segment.size, self.store.dispatched_end - segment.base_offset)
        try:
            reader = _SegmentReader(segment, end, _Throttle(0, self._stop))
            try:
                item = next(reader.items(offset - segment.base_offset), None)
            finally:
                reader.close()
        except (_Stopped, OSError):
            return  # closing, or the segment is gone: nothing to record
        if isinstance(item, Gap):
            self.record_gap(item, "a reader")
        else:
            log.warning("skipped the record at commit log offset %d (%s), but it reads intact now", offset, problem)

    def _segment_holding(self, offset: int) -> Segment | None:
        return next((segment for segment in list(self.store.commitlog.segments)
                     if segment.base_offset <= offset < segment.end_offset), None)

    def record_gap(self, gap: Gap, finder: str, found_by: FoundBy = "scrub",
               skipped: Collection[tuple[str, int, int]] = ()) -> list[Loss]:
        """Write the parts of ``gap`` the ledger does not have yet to it, each with the
        records whose queue entries point into it. ``skipped``: the places (topic, queue id,
        queue offset) of records lost in ``gap`` that no entry points at (recovery rebuilt
        their queue past it, leaving holes), counted with the first part not yet recorded.
        A range in the ledger already is never recorded again, whoever found it first."""
        store = self.store
        recorded: list[Loss] = []
        with self._lock:
            if gap.end <= store.commitlog.min_offset:
                return recorded  # retention deleted it
            for start, end in uncovered(gap.start, gap.end, store.losses.all()):
                entries = store.queue_entries_between(start, end)
                named = [message_id for topic, queue_id, queue_offset, offset, _ in entries
                         if (message_id := self._salvage_id(offset, {(topic, queue_id, queue_offset)}))]
                places = [entry[:3] for entry in entries]
                places += sorted(set(skipped) - set(places))
                skipped = ()
                if len(places) > len(entries) and (message_id := self._salvage_id(start, set(places[len(entries):]))):
                    named.append(message_id)  # the first lost record's header may have survived
                where = ", ".join(f"{topic}/{queue_id}@{queue_offset}" for topic, queue_id, queue_offset in places[:20])
                more = f" and {len(places) - 20} more" if len(places) > 20 else ""
                recorded.append(store.losses.record(
                    found_by, start, end, named, len(places) - len(named),
                    f"found by {finder}: {end - start} bytes {gap.kind} in the commit log at {start}; "
                    f"{len(places)} records lost ({where or 'no queue entry points there'}{more})",
                    places, unreadable=gap.kind == "unreadable",
                ))
                if found_by == "scrub":
                    self.stats.damaged_ranges += 1
        return recorded

    def _salvage_id(self, offset: int, places: set[tuple[str, int, int]]) -> str | None:
        """The message id of a lost record at ``offset``, if what is left of its header
        still says it, puts it in one of ``places`` (topic, queue id, queue offset) and names
        the record by fsck's rule (``salvaged_id``): confirmed by the record's own index
        entries or, with none left, held by no intact record elsewhere."""
        segment = self._segment_holding(offset)
        if segment is None:
            return None
        position = offset - segment.base_offset
        try:
            head = codec.decode_head(lambda start, length: segment.pread(position + start, length), offset,
                                     salvage=True)
        except (codec.RecordError, OSError):
            return None
        if (head.topic, head.queue_id, head.queue_offset) not in places:
            return None

        def held_elsewhere(message_id: str) -> bool:
            elsewhere = self.store.lookup_message_id(message_id)
            return bool(elsewhere) and offset not in elsewhere

        return salvaged_id(head.properties.get(PROPERTY_MESSAGE_ID), self.store.index.hashes_at(offset),
                           held_elsewhere)


def damage_reasons(store: MessageStore) -> list[str]:
    """What makes ``store`` degraded, one line each: the open (unacknowledged) losses of its
    ledger, an unreadable ledger it set aside, and a scrub that could not read the log; empty
    when nothing does."""
    reasons: list[str] = []
    losses = store.losses.open_losses()
    if losses:
        lost = sum(loss.records for loss in losses)
        finders = ", ".join(sorted({loss.found_by for loss in losses}))
        reasons.append(f"{lost} messages lost in {len(losses)} damaged or missing commit log "
                       f"range{'s' if len(losses) > 1 else ''} (found by {finders}), not acknowledged")
    if store.losses.unreadable:
        reasons.append(store.losses.unreadable)
    if store.scrub.stats.error:
        reasons.append(store.scrub.stats.error)
    return reasons


def uncovered(start: int, end: int, losses: list[Loss]) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` that no loss in ``losses`` covers."""
    parts = [(start, end)]
    for loss in losses:
        parts = [piece for a, b in parts
                 for piece in ((a, min(b, loss.start)), (max(a, loss.end), b)) if piece[0] < piece[1]]
    return parts
