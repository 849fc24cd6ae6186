"""``MessageStore``: the commit log, its consume queues and index, flush, checkpoint, recovery.

Data directory layout::

    lock                      held with flock by the open store (DataDirLockedError)
    store.json                the segment size and consume queue file entries the
                              directory was created with
    commitlog/<offset:020d>   segment files
    consumequeue/<topic>/<queue_id>/<queue offset:020d>   consume queue files
    index/<number:010d>       index files (hash slots and entries, see ``index.py``)
    checkpoint                JSON: ``verified`` (the commit log offset up to which the
                              log is verified and the consume queues and index are
                              durable), ``queues`` (each queue's entry count), ``index``
                              (first and last index file, the last indexed offset),
                              ``commitlog_min``, ``commitlog_flushed``,
                              ``consumequeue_dispatched``, ``index_dispatched``,
                              ``last_store_ms``, ``written_ms``
    scrub.json                where the scrub's pass resumes after a restart (``scrub.py``)

Writes: ``put``/``put_batch`` encode, then append under the write lock with one ``pwrite``
per segment touched (all or nothing: a full disk rolls the batch back). The record given
is completed in place and returned (one object per message; a record already stored is
copied). In ``sync`` flush mode the caller then waits until an fdatasync (see
``commitlog.py`` for why that suffices) covers its records: the first waiter syncs
everything appended so far while later ones queue behind it (group commit). Records are
dispatched to their consume queues and the index, and listeners are told, only once
durable, so a consumer can never read a record that a crash could take back; within
``answering_first`` (a server's writes on its event loop) the putter is answered between
the fsync and the dispatch, and every other thread's reads wait for that dispatch
(``settle``). In ``async``
mode records are dispatched at once and a background thread syncs every
``async_flush_interval_s``. Records made durable together are dispatched together: their
consume queue entries go to memory and are written at checkpoints (every
``checkpoint_interval_s`` and on close); their index entries are written with one
``pwrite`` per index file, the index's slots and headers at checkpoints (``index.py``),
when everything is fsync'd. No read happens on the write path.

Recovery (on open): the commit log's shape is checked against the checkpoint (no segment
missing, closed segments whole, the log at least as long as ``verified``), then every
consume queue and the index against the checkpoint and the log: files whole, as many
entries as the checkpoint counted, the last entry pointing at its record. What is missing
or short is rebuilt from the commit log, from the queue's last good entry (or the index's
last indexed record) on, with a warning; a deleted ``consumequeue/`` or ``index/`` is
rebuilt byte-identical. Records from ``verified`` on are verified (CRC): a bad record, or
zeros, in the last segment with nothing intact after it is a torn tail and is truncated;
one with intact records after it, or in a closed segment, raises ``LogDamageError`` (a
``CorruptLogError``) and nothing is changed: ``halfmoon-broker repair`` salvages such a
directory. The replay below ``verified`` (a rebuilt queue or index) passes a damaged
range instead, since nothing there is truncated: it is recorded in the loss ledger once,
through the scrub's recording path, with the records it took counted from the queue
entries pointing into it, the queue offsets a rebuilt queue skipped there and the
checkpoint's queue counts (a queue's lost tail is reserved as holes). The index's newest entries (those at or past the checkpoint) are taken off and
added again by the replay; consume queue entries past the end are dropped. An index or
queue entry that pointed at or past the recovered end marks a record that had been
dispatched (durable, and acknowledged in sync mode): a log cut short, not a torn append.
Those are counted, named where the truncated bytes still hold their header, and written
to the loss ledger (``store.losses``, logged as an ERROR).

Dispatch listeners are told of records dispatched after the store is open, never of those
replayed during recovery: the broker core rebuilds its state with ``scan()`` (or by
reading its system topics) after opening, then registers its listener.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from ..errors import (
    BrokerClosedError,
    CorruptLogError,
    CorruptStateError,
    DataDirLockedError,
    MessageTooLargeError,
    StoreFullError,
)
from . import codec
from .commitlog import CommitLog, Gap, segment_bases
from .config import StoreConfig
from .consume_queue import ConsumeQueue
from .files import make_directories, write_atomically
from .filesystem import REAL, FileSystem
from .index import IndexedRecord, MessageIndex, salvaged_id
from .losses import LossLedger
from .record import PROPERTY_KEYS, PROPERTY_MESSAGE_ID, PROPERTY_TAG, StoredRecord
from .scrub import Scrub, uncovered

log = logging.getLogger(__name__)
T = TypeVar("T")
#: A ``when_durable`` callback: the commit log offset it waits for, the callback, its ``lost``.
_Waiter = tuple[int, Callable[[], None], Callable[[Exception], None] | None]


class _UnfinishedSync(NamedTuple):
    """An fsync whose dispatch waits for the end of its thread's ``answering_first`` block."""

    pending: list[StoredRecord]
    target: int
    thread: int


#: Told of the records made durable together, once per batch, in commit log order, after
#: they are dispatched to their consume queues (not of records replayed during recovery).
DispatchListener = Callable[[list[StoredRecord]], None]
#: A record's place: topic, queue id, queue offset.
Place = tuple[str, int, int]


CHECKPOINT = "checkpoint"
_REPLAY_CHUNK = 1024  # records recovery dispatches together


def fitting(items: Iterable[T], size: Callable[[T], int], max_bytes: int | None) -> list[T]:
    """The leading ``items`` whose sizes add up to at most ``max_bytes`` (None: all of
    them), and always the first one; taken lazily, so none past the cut is produced."""
    kept: list[T] = []
    total = 0
    for item in items:
        total += size(item)
        if kept and max_bytes is not None and total > max_bytes:
            break
        kept.append(item)
    return kept


def lock_directory(data_dir: Path, shared: bool = False, fs: FileSystem = REAL) -> int:
    """Take the data directory's lock and return the descriptor that holds it (``shared``:
    for read-only tools, the lock file must exist). ``DataDirLockedError`` while another
    store holds it, also from another process."""
    try:
        return fs.lock(data_dir / "lock", shared)
    except BlockingIOError:
        raise DataDirLockedError(f"data directory {data_dir} is in use by another broker") from None


def read_checkpoint(data_dir: Path, fs: FileSystem = REAL) -> dict[str, Any]:
    """The checkpoint's fields (see the module docstring); empty if there is none."""
    try:
        fields = json.loads(fs.read_bytes(data_dir / CHECKPOINT))
    except (FileNotFoundError, ValueError):
        return {}
    return fields if isinstance(fields, dict) else {}


def pinned_layout(data_dir: Path, config: StoreConfig) -> StoreConfig:
    """``config`` with the segment size and consume queue file entries that ``store.json``
    pins for ``data_dir`` (read only); ``CorruptStateError`` if it cannot be read (the
    layout is not guessed: a wrong segment size would misread every segment)."""
    meta = data_dir / "store.json"
    fs = config.filesystem
    try:
        pinned = json.loads(fs.read_bytes(meta)) if fs.exists(meta) else {}
        sizes = [pinned.get(name, getattr(config, name)) for name in ("segment_size", "consume_queue_file_entries")]
        if not all(type(size) is int and size > 0 for size in sizes):
            raise ValueError(f"sizes {sizes!r} are not positive whole numbers")
    except (ValueError, AttributeError) as exc:
        bases = segment_bases(data_dir / "commitlog", fs)
        hint = f" (its commit log's segments lie {bases[1] - bases[0]} bytes apart)" if len(bases) > 1 else ""
        raise CorruptStateError(
            f"{meta} cannot be read ({type(exc).__name__}: {exc}): it pins the segment size{hint} and the consume "
            'queue file entries this directory was written with; restore it, or write {"segment_size": N, '
            '"consume_queue_file_entries": M} with the sizes it was created with') from exc
    return dataclasses.replace(config, segment_size=sizes[0], consume_queue_file_entries=sizes[1])


class MessageStore:
    """A durable store in ``data_dir`` (see the module docstring for the design)."""

    def __init__(self, data_dir: Path | str, config: StoreConfig | None = None) -> None:
        self.data_dir = Path(data_dir)
        config = config or StoreConfig()
        #: The file layer every file of the store goes through (``StoreConfig.filesystem``).
        self.fs = config.filesystem
        make_directories(self.data_dir, self.fs)
        self._lock_file = lock_directory(self.data_dir, fs=self.fs)
        self._write_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[StoredRecord] = []
        #: Records put with ``hold`` (sync mode), written with the next put (``put_batch``),
        #: and what to call if they are dropped instead (their ``on_dropped``).
        self._held: list[StoredRecord] = []
        self._on_held_dropped: list[Callable[[], None]] = []
        #: The callbacks a drop of held records made due, called outside the write lock
        #: (``_tell_dropped``).
        self._dropped: list[Callable[[], None]] = []
        self._next_offset: dict[tuple[str, int], int] = {}
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._listeners: list[DispatchListener] = []
        #: Told how many seconds each fsync of the commit log took (metrics); None: nobody.
        self.on_fsync: Callable[[float], None] | None = None
        self._closed = False
        self._last_store_ms = 0
        started = time.monotonic()
        #: Every acknowledged record found destroyed (recovery, repair, the scrub).
        try:
            self.losses = LossLedger(self.data_dir, self.fs, set_aside=True)
            self.config = self._pin_layout(config)
            self.commitlog = CommitLog(self.data_dir / "commitlog", self.config.segment_size, self.fs)
            self.index = MessageIndex(
                self.data_dir / "index", self.config.index_slots, self.config.index_entries, self.fs
            )
            #: The background CRC scrub of the commit log (``scrub.py``); its ``stats`` for
            #: metrics. Made before recovery, which records the damaged ranges it passes with it.
            self.scrub = Scrub(self)
            self._recover()
        except BaseException:
            self.fs.unlock(self._lock_file)  # a failed open (e.g. CorruptLogError) frees the directory
            raise
        self._flushed = self.commitlog.write_offset
        self.recovery_seconds = time.monotonic() - started
        self._stop = threading.Event()
        self._flush_state = threading.Condition()
        self._flushing = False
        #: ``when_durable`` callbacks, oldest first (under ``_flush_state``).
        self._durable_waiters: list[_Waiter] = []
        self._flush_error: BrokerClosedError | None = None
        #: Whether this thread is in ``answering_first``, and the fsync whose dispatch waits
        #: for the end of such a block (under ``_flush_state``; the leader's turn lasts until
        #: it is dispatched).
        self._answering = threading.local()
        self._unfinished: _UnfinishedSync | None = None
        self._background = threading.Thread(
            target=self._run_background, name="store-flush-checkpoint", daemon=True
        )
        self._background.start()
        self.scrub.start()

    # -- opening --------------------------------------------------------------------------
    def _pin_layout(self, config: StoreConfig) -> StoreConfig:
        """Commit log segments and consume queue files keep the size they were created
        with, whatever a later config says (a directory from before consume queue files
        were split takes the configured count)."""
        pinned_config = pinned_layout(self.data_dir, config)
        layout = {
            "segment_size": pinned_config.segment_size,
            "consume_queue_file_entries": pinned_config.consume_queue_file_entries,
        }
        if pinned_config != config:
            log.info("using the data directory's layout %s", layout)
        meta = self.data_dir / "store.json"
        if not self.fs.exists(meta) or json.loads(self.fs.read_bytes(meta)) != layout:
            write_atomically(meta, json.dumps(layout).encode(), self.fs)
        return pinned_config

    def _recover(self) -> None:
        """Check the commit log's shape, verify the consume queues and the index against the
        checkpoint and the log (rebuilding what is missing or short), replay the records
        after the checkpoint (passing and recording damaged ranges below it), drop entries past
        the recovered end."""
        checkpoint = read_checkpoint(self.data_dir, self.fs)
        verified = int(checkpoint.get("verified", 0))
        self.commitlog.check_layout(verified)
        counts: dict[str, dict[str, int]] | None = checkpoint.get("queues")
        if not checkpoint:
            counts = {}  # no checkpoint was ever made: no queue entry on disk was ever synced
        queue_dir = self.data_dir / "consumequeue"
        for topic in sorted(self.fs.listdir(queue_dir)) if self.fs.exists(queue_dir) else []:
            for queue_name in sorted(self.fs.listdir(queue_dir / topic)):
                name = queue_name.partition(".")[0]  # also "<id>.converting"
                if name.isdigit():
                    self._queue(topic, int(name))
        for topic, by_id in (counts or {}).items():
            for name in by_id:
                self._queue(topic, int(name))  # a deleted queue comes back empty
        index_from = self._index_from(checkpoint, verified)
        rebuilt = self._cut_damaged_queues(counts, verified)
        starts = [start for start, _ in rebuilt.values()]
        if counts is None and verified:
            log.info("a checkpoint without queue counts: verifying every consume queue against "
                     "the whole commit log once")
            starts.append(self.commitlog.min_offset)
        replay_from = max(min([verified, index_from, *starts]), self.commitlog.min_offset)
        self.index.rewind(min(verified, index_from))
        indexed_tail = self.index.drop_tail(verified)  # indexed again below, as far as the log goes
        gaps: list[Gap] = []  # damaged ranges below the checkpoint the replay passed
        skipped: dict[int, set[Place]] = {}
        if replay_from < verified:
            self._replay(self.commitlog.scan(replay_from, verified, gaps), gaps, skipped)
        self._replay(self.commitlog.recover(verified), gaps, skipped)
        # every record is replayed (indexed, queued): lookups see them from here on, the
        # ledger's naming of the damaged ranges below included
        end = self._dispatched_end = self.commitlog.write_offset
        self._record_cut_off(end, indexed_tail)
        self.losses.cut_at(end)  # new records are appended from here
        for queue in self._queues.values():
            queue.truncate_beyond(end)
            queue.drop_below(self.commitlog.min_offset)
        self._reserve_lost_tails(counts or {}, gaps, skipped)
        for number, gap in enumerate(gaps):
            self.scrub.record_gap(gap, "recovery", "recovery", skipped.get(number, ()))
        for (topic, queue_id), (_, had) in rebuilt.items():
            if counts is not None:
                log.warning(
                    "consume queue %s/%d had %d entries, the checkpoint says %d: rebuilt from "
                    "the commit log, %d entries now", topic, queue_id, had,
                    counts.get(topic, {}).get(str(queue_id), 0), self._queues[(topic, queue_id)].max_offset,
                )

    def _replay(self, records: Iterable[StoredRecord], gaps: list[Gap], skipped: dict[int, set[Place]]) -> None:
        """Dispatch the records recovery replays. Once the replay has passed a damaged range
        (``gaps``), a record whose queue offset lies past its queue's end shows that the
        offsets in between were records lost there: their places go to ``skipped`` (by the
        range's number in ``gaps``) before the queue marks them as holes."""
        chunk: list[StoredRecord] = []
        for record in records:
            if gaps:
                self._dispatch(chunk)
                chunk = []
                key = (record.topic, record.queue_id)
                queue = self._queue(*key)
                if record.queue_offset > queue.max_offset:
                    self._lost_between(key, range(queue.max_offset, record.queue_offset),
                                       record.commit_log_offset, gaps, skipped)
            chunk.append(record)
            if len(chunk) == _REPLAY_CHUNK:
                self._dispatch(chunk)
                chunk = []
        self._dispatch(chunk)

    def _reserve_lost_tails(self, counts: dict[str, dict[str, int]], gaps: list[Gap],
                            skipped: dict[int, set[Place]]) -> None:
        """A queue that ends short of the checkpoint's count lost its last records: to a
        damaged range the replay passed (the checkpoint counted them, the log held them:
        their places go to ``skipped``), or to retention, which took them with the queue's
        files. Their offsets are reserved as holes either way, so that no new record takes
        the offset of one gone (a consumer past it would skip the new record)."""
        for (topic, queue_id), queue in list(self._queues.items()):
            count = counts.get(topic, {}).get(str(queue_id), 0)
            if count > queue.max_offset:
                self._lost_between((topic, queue_id), range(queue.max_offset, count),
                                   self.commitlog.write_offset, gaps, skipped)
                queue.reserve(count)

    def _lost_between(self, key: tuple[str, int], offsets: range, before: int, gaps: list[Gap],
                      skipped: dict[int, set[Place]]) -> None:
        """Count the queue offsets ``offsets`` of queue ``key``, whose records lay between the
        queue's last entry and commit log offset ``before``, to the first damaged range there
        that the ledger does not hold whole yet (else the first: a range the ledger holds is not
        recorded again, and the places would go with it), none: they were not lost to damage,
        e.g. holes a repair left."""
        queue = self._queues[key]
        if queue.max_offset > queue.min_offset:
            after = queue.entry(queue.max_offset - 1)[0]
        elif queue.max_offset == 0 and self.commitlog.min_offset == 0:
            after = 0  # the queue's first records were lost
        else:
            return  # below the queue's first entry retention may have deleted records: not counted
        between = [n for n, gap in enumerate(gaps) if gap.start >= after and gap.end <= before]
        losses = self.losses.all()
        number = next((n for n in between if uncovered(gaps[n].start, gaps[n].end, losses)), between[0] if between else None)
        if number is not None:
            # not a record the ledger has already: a hole a repair left, forgotten by a queue
            # rebuilt from the log
            known = self.losses.places()
            skipped.setdefault(number, set()).update(
                place for queue_offset in offsets if (place := (*key, queue_offset)) not in known)

    def _record_cut_off(self, end: int, indexed: list[tuple[int, int]]) -> None:
        """Write to the ledger the records past the recovered ``end`` of the log that were
        dispatched: an index entry (``indexed``: key hash, offset) or a queue entry on disk
        points at them.
        A record is dispatched only once durable (sync mode: before it is acknowledged), so
        these were acknowledged and a cut log took them; a torn append has no entry. Named
        by what the truncated bytes still hold of their headers, counted exactly. One in a
        range the ledger has already (a repair a crash cut short recorded it) is not
        counted again."""
        hashes: dict[int, set[int]] = {}
        for hash_, offset in indexed:
            hashes.setdefault(offset, set()).add(hash_)
        # an entry past the end each of whose keys the index has below it (of the records
        # replayed) is a torn one (its offset's bytes part old, part new) or a copy's: no loss
        lost = {offset for offset, keys in hashes.items() if offset >= end and not self.losses.covers(offset)
                and not all(any(at < end for at in self.index.lookup_hash(hash_)) for hash_ in keys)}
        places: list[Place] = []
        for (topic, queue_id), queue in self._queues.items():
            for queue_offset in range(queue.max_offset - 1, queue.min_offset - 1, -1):
                offset, size = queue.entry(queue_offset)
                if offset < end:
                    break
                if size and not self.losses.covers(offset):
                    lost.add(offset)
                    places.append((topic, queue_id, queue_offset))
        if not lost:
            return
        named = [message_id for offset in sorted(lost)
                 if (message_id := self._name_truncated(offset, hashes.get(offset, set())))]
        # The loss covers no bytes: the cut-off ones are gone and new records are appended
        # from ``end``; a range over them would pass their later damage for this known loss.
        self.losses.record(
            "recovery", end, end, named, len(lost) - len(named),
            f"the commit log ends at offset {end} (cut short), {len(lost)} records after it (up to offset "
            f"{max(lost)}) had been dispatched (durable and, in sync flush mode, acknowledged); their "
            "consume queue and index entries are dropped",
            places,
        )

    def _name_truncated(self, offset: int, hashes: set[int]) -> str | None:
        """The message id in what the torn tail recovery truncated still holds of the
        header of the record at ``offset``, if anything, unless its index entries
        (``hashes``) deny it (``salvaged_id``)."""
        if self.commitlog.truncated is None:
            return None
        start, data = self.commitlog.truncated
        position = offset - start
        if not 0 <= position < len(data):
            return None
        try:
            head = codec.decode_head(lambda at, length: data[position + at: position + at + length], offset,
                                     salvage=True)
        except codec.RecordError:
            return None
        return salvaged_id(head.properties.get(PROPERTY_MESSAGE_ID), hashes)

    def _index_from(self, checkpoint: dict[str, Any], verified: int) -> int:
        """Where records must be indexed again from: ``verified`` when the index holds
        everything the checkpoint says it does; the end of what it holds when newer files
        are missing; 0 (all of the log) when it has no file or older files are missing."""
        index = self.index
        saved = checkpoint.get("index")
        if index.max_indexed < 0 or saved is None:
            return 0 if index.max_indexed < 0 else verified
        first, last, through = saved
        present_first, present_last = index.file_numbers
        if present_first > first and checkpoint.get("commitlog_min") == self.commitlog.min_offset:
            log.warning("index files %d to %d are missing: rebuilding the whole index",
                        first, present_first - 1)
            index.clear()
            return 0
        if present_last < last or index.max_indexed < through:
            log.warning("the index ends at commit log offset %d, the checkpoint says %d: "
                        "indexing the records after it again", index.max_indexed, through)
            return index.max_indexed
        return verified

    def _cut_damaged_queues(
        self, counts: dict[str, dict[str, int]] | None, verified: int
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Verify every queue: its files whole, as long as the checkpoint says, its last
        entry pointing at its record. Cut a damaged queue back to what is good (all of it if
        the last entry is wrong); return, per queue to rebuild, the commit log offset to
        rebuild it from and the entries it had. With no ``counts`` (an older checkpoint)
        every queue is verified against the whole log once."""
        rebuild: dict[tuple[str, int], tuple[int, int]] = {}
        for key, queue in self._queues.items():
            had = queue.max_offset
            expected = None if counts is None else counts.get(key[0], {}).get(str(key[1]), 0)
            # Entries past the checkpoint's count were not fsync'd when a crash came: they
            # may be torn or zeros (which read as holes). Their records lie past
            # ``verified``, where the replay dispatches them again. A queue whose files all
            # start past that count (its first file lost) is made again from the start.
            if expected is not None and expected < queue.min_offset:
                queue.reset()
            good = queue.intact_end()
            if expected is not None:
                good = min(good, expected)
            queue.truncate_to(good)
            start = self._after_last_entry(key, queue, verified)
            if start is None:
                queue.reset()
                start = self.commitlog.min_offset
            if expected is None or good < max(expected, had) or queue.max_offset < good:
                rebuild[key] = (start, had)
        return rebuild

    def _after_last_entry(self, key: tuple[str, int], queue: ConsumeQueue, verified: int) -> int | None:
        """The commit log offset after the queue's last entry (the log's start for an empty
        queue), or None when that entry does not point at its record."""
        if queue.max_offset <= queue.min_offset:
            return self.commitlog.min_offset
        queue_offset = queue.max_offset - 1
        try:
            offset, size = queue.entry(queue_offset)
            if not size and not offset:
                # zeros: a hole (of a queue whose head retention took: rebuilt at little
                # cost), or a rewritten file (a rebuilt queue) a crash took before its
                # data reached the disk, under a checkpoint that counted the old file
                return None
            if not size or offset >= verified:  # a hole, or an entry recovery checks later
                return offset
            head = self.commitlog.read_head(offset)
        except (OSError, IndexError, CorruptLogError):  # its file gone, or no segment there
            head = None
        if head is None or (head.topic, head.queue_id, head.queue_offset, head.size) != (*key, queue_offset, size):
            return None
        return offset + size

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = ConsumeQueue(
                self.data_dir / "consumequeue" / topic / str(queue_id),
                self.config.consume_queue_file_entries, self.fs,
            )
            self._queues[key] = queue
        return queue

    # -- writing --------------------------------------------------------------------------
    def put(self, record: StoredRecord) -> StoredRecord:
        """Append one record; returns it completed, once durable per flush mode."""
        return self.put_batch([record])[0]

    def put_batch(self, records: list[StoredRecord], wait_for_flush: bool = True,
                  hold: bool = False, on_dropped: Callable[[], None] | None = None) -> list[StoredRecord]:
        """Append records in order, covered by one fsync in sync mode.

        ``wait_for_flush=False`` returns before the fsync: the records become durable (and
        dispatched) with the next flush, at most ``async_flush_interval_s`` later. For
        bookkeeping whose loss in a power loss is harmless (consumer progress).

        ``hold=True`` (sync mode) returns at once, the records not yet written: they are
        held and written in the next put's one write, ahead of its records, and made
        durable (and dispatched) by its fsync, or by ``flush`` (the background flush does
        it within ``async_flush_interval_s``); a process crash before that loses them. For
        what nobody waits for and the broker settles otherwise if lost (oneway ENDs, which
        check-back settles): two unsynced writes in a row would let a power loss keep the
        second and drop the first, a hole before records that survived it. Held records are
        returned as given, not stored. When the write of held records fails (a committed
        copy over the segment size, a write error), the put's own records are written alone
        and the held ones dropped (by ``flush``, which has none of its own, at once), never
        held again: a held batch that can never be written does not refuse every write
        after it. A dropped batch's ``on_dropped`` is called, and the ``lost`` of the
        ``when_durable`` callbacks that waited for it; a lost oneway END leaves its
        transaction pending, which check-back settles. If the put's records fail alone
        too, the held ones are kept for the next put and that failure is raised."""
        for record in records:
            if len(record.body) > self.config.max_record_size:
                raise MessageTooLargeError(
                    f"body of {len(record.body)} bytes exceeds {self.config.max_record_size}"
                )
        try:
            with self._write_lock:
                if self._closed:
                    raise BrokerClosedError("the message store is closed")
                if self._flush_error is not None:
                    raise self._flush_error
                if hold and self.config.flush_mode == "sync":
                    self._held.extend(records)
                    if on_dropped is not None:
                        self._on_held_dropped.append(on_dropped)
                    return records
                self._check_free_space()
                stored = self._append_with_held(records)
                end = self.commitlog.write_offset
                if self.config.flush_mode == "async":
                    self._dispatch_all(self._take_pending())
        finally:
            self._tell_dropped()
        if self.config.flush_mode == "sync" and wait_for_flush:
            self._sync_to(end)
        return stored

    def _append_with_held(self, records: list[StoredRecord]) -> list[StoredRecord]:
        """``records`` appended after the held ones, in one write (under the write lock).

        If that fails, ``records`` are appended alone, once, and the held ones dropped if
        that works (``_drop_held``: they failed, or the disk did and is back), held again if
        not (``records`` fail too: the held ones may not be at fault; a ``flush``, which has
        no records of its own, drops them). A failed append wrote nothing (``_append_all``
        checks every record before writing, ``CommitLog.append_many`` rolls its writes
        back), so the retry is the put that would follow a refused one: all or nothing, at
        the same write offset."""
        held, self._held = self._held, []
        if not held:
            return self._append_all(records)
        try:
            return self._append_all(held + records)[len(held):]
        except Exception as exc:
            failure = exc
        except BaseException:  # the process dies here: they are lost with it
            self._held = held
            raise
        start = self.commitlog.write_offset
        try:
            stored = self._append_all(records) if records else []
        except BaseException:
            self._held = held
            raise
        self._drop_held(len(held), failure, start)
        return stored

    def _drop_held(self, count: int, cause: Exception, start: int) -> None:
        """Give up the ``count`` held records whose write failed with ``cause`` when the
        commit log ended at ``start`` (under the write lock): their ``on_dropped`` and the
        ``lost`` of the ``when_durable`` callbacks that waited for them become due
        (``_tell_dropped``)."""
        log.warning("dropped %d held record(s), not written: %s (their transactions stay pending and "
                    "the check-back settles them, as for a lost oneway END)", count, cause)
        due, self._on_held_dropped = self._on_held_dropped, []
        with self._flush_state:
            # nothing is written while records are held: the callbacks that wait past where
            # the commit log ended then are those that waited for them (``when_durable``)
            waiters = self._durable_waiters
            self._durable_waiters = [waiter for waiter in waiters if waiter[0] <= start]
        due += [functools.partial(lost, cause) for end, _, lost in waiters if end > start and lost is not None]
        self._dropped += due

    def _tell_dropped(self) -> None:
        """Call the callbacks a drop of held records made due (not under the write lock:
        they may take the broker's locks)."""
        if not self._dropped:
            return
        with self._write_lock:
            due, self._dropped = self._dropped, []
        for callback in due:
            self._call_waiter(callback)

    def _append_all(self, records: list[StoredRecord]) -> list[StoredRecord]:
        """Encode and append records as one write per segment; all or nothing."""
        store_ms = self.config.clock.time_ms()
        next_offset = self._next_offset
        assigned: dict[tuple[str, int], int] = {}
        encoded: list[bytes] = []
        queue_offsets: list[int] = []
        for record in records:
            key = (record.topic, record.queue_id)
            queue_offset = assigned.get(key)
            if queue_offset is None:
                queue_offset = next_offset.get(key)
                if queue_offset is None:
                    queue_offset = self._queue(*key).max_offset
            data = codec.encode(
                record.topic, record.queue_id, queue_offset, record.flags,
                record.born_timestamp_ms or store_ms, store_ms, record.properties, record.body,
            )
            if (size := codec.SEAL_SIZE + len(data)) > self.config.segment_size:
                raise MessageTooLargeError(f"record of {size} bytes exceeds the segment size {self.config.segment_size}")
            assigned[key] = queue_offset + 1
            encoded.append(data)
            queue_offsets.append(queue_offset)
        offsets = self.commitlog.append_many(encoded)
        next_offset.update(assigned)
        stored: list[StoredRecord] = []
        for record, data, queue_offset, offset in zip(records, encoded, queue_offsets, offsets, strict=True):
            if record.is_stored:  # put again (or twice in this batch): completed as a copy
                record = msgspec.structs.replace(record)
            record.born_timestamp_ms = record.born_timestamp_ms or store_ms
            record.store_timestamp_ms = store_ms
            record.queue_offset = queue_offset
            record.commit_log_offset = offset
            record.size = codec.SEAL_SIZE + len(data)
            stored.append(record)
        self._pending.extend(stored)
        return stored

    def _check_free_space(self) -> None:
        if self.config.min_free_disk_bytes <= 0:
            return
        if self.fs.free_bytes(self.data_dir) < self.config.min_free_disk_bytes:
            raise StoreFullError(
                f"free disk space under {self.config.min_free_disk_bytes} bytes in {self.data_dir}"
            )

    def _take_pending(self) -> list[StoredRecord]:
        pending, self._pending = self._pending, []
        return pending

    def _sync_to(self, end: int) -> None:
        """Return once an fsync covers commit log offset ``end``.

        Group commit, leader and followers: the first caller to find no fsync under way
        fsyncs everything appended so far; callers arriving meanwhile append theirs and
        wait, and the next leader's fsync covers all of them at once. A lone putter pays
        no thread handoff. Within ``answering_first`` the leader's dispatch waits for the
        end of that block (``_finish_sync``).
        """
        self._finish_own_sync()  # this thread's deferred dispatch first: waiting for it would never end
        with self._flush_state:
            while self._flushed < end:
                if self._flush_error is not None:
                    raise self._flush_error
                if not self._flushing:
                    self._flushing = True
                    break
                self._flush_state.wait()
            else:
                return
        pending: list[StoredRecord] = []
        target = self._flushed
        try:
            with self._flush_lock:
                with self._write_lock:
                    target = self.commitlog.write_offset
                    dirty = self.commitlog.take_dirty()
                    pending = self._take_pending()
                on_fsync = self.on_fsync
                started = time.perf_counter() if on_fsync is not None else 0.0
                for segment in dirty:
                    self.fs.fdatasync(segment.fd)
                if on_fsync is not None and dirty:
                    on_fsync(time.perf_counter() - started)
        except OSError as exc:
            error = self._failed_sync(exc)
            self._end_sync(None)
            raise error from exc
        except BaseException:  # the process dies here
            self._end_sync(None)
            raise
        if getattr(self._answering, "first", False):
            self._unfinished = _UnfinishedSync(pending, target, threading.get_ident())
            return
        self._finish_sync(pending, target)

    def _finish_sync(self, pending: list[StoredRecord], target: int) -> None:
        """Dispatch the records an fsync made durable, then let its waiters go: the putters
        it covered, ``when_durable`` callbacks, the next leader."""
        synced: int | None = None
        try:
            with self._flush_lock:
                self._dispatch_all(pending)
            synced = target
        except OSError as exc:
            raise self._failed_sync(exc) from exc
        finally:
            self._end_sync(synced)

    def _failed_sync(self, exc: OSError) -> BrokerClosedError:
        """Refuse every write from now on: the fsync (or the dispatch after it) failed."""
        log.exception("fsync of the commit log failed; the store refuses further writes")
        with self._flush_state:
            self._flush_error = BrokerClosedError(f"commit log fsync failed: {exc}")
            return self._flush_error

    def _end_sync(self, synced: int | None) -> None:
        """The end of a leader's turn: ``synced`` is how far its fsync and dispatch got
        (None: cut short, the process dies, or failed, writes are refused)."""
        with self._flush_state:
            if synced is not None:
                self._flushed = max(self._flushed, synced)
            self._flushing = False
            self._unfinished = None
            self._flush_state.notify_all()
            durable = self._take_durable_waiters() if synced is not None else []
        for callback in durable:
            self._call_waiter(callback)

    @contextmanager
    def answering_first(self) -> Iterator[None]:
        """A block in which this thread's fsyncs leave their dispatch (consume queues, index,
        listeners) and what waits for it to the block's end: a server answers the writes
        an fsync made durable, then dispatches them while the clients read their answers
        (RocketMQ's broker answers a put once flushed; its ReputMessageService dispatches
        after). Other threads wait for that dispatch in ``settle`` before they read what
        it builds, so an answer's follow-up from anywhere finds its records."""
        self._answering.first = True
        try:
            yield
        finally:
            self._answering.first = False
            self._finish_own_sync()

    def _finish_own_sync(self) -> None:
        """Dispatch what this thread's fsync left undispatched (``answering_first``)."""
        unfinished = self._unfinished
        if unfinished is not None and unfinished.thread == threading.get_ident():
            self._finish_sync(unfinished.pending, unfinished.target)

    def settle(self) -> None:
        """Return once no other thread's fsync waits to dispatch (``answering_first``)."""
        if self._unfinished is None:
            return
        me = threading.get_ident()
        with self._flush_state:
            while (unfinished := self._unfinished) is not None and unfinished.thread != me:
                self._flush_state.wait()

    def when_durable(self, callback: Callable[[], None],
                     lost: Callable[[Exception], None] | None = None) -> None:
        """Call ``callback`` once everything written so far is durable and dispatched: now
        if it is, else in the thread whose fsync covers it (a put that waits, ``flush()``, or
        the background flush, ``async_flush_interval_s``, for puts made with ``hold`` or
        ``wait_for_flush=False``). Never called if the fsync fails (the store refuses
        writes from then on). If the held records it waits for are dropped (``put_batch``),
        ``lost`` is called instead (nothing if None), with why, in the thread that tried to
        write them."""
        with self._write_lock:
            # held records are written before anything else: an fsync past today's end covers
            # them (registered under the write lock: a drop of them finds this callback)
            end = self.commitlog.write_offset + (1 if self._held else 0)
            with self._flush_state:
                if self._flushed < end:
                    self._durable_waiters.append((end, callback, lost))
                    return
        self._call_waiter(callback)

    @property
    def unsynced(self) -> bool:
        """Whether records were held or appended that no fsync covers yet."""
        return bool(self._held) or self.commitlog.write_offset > self._flushed

    def _take_durable_waiters(self) -> list[Callable[[], None]]:
        """The ``when_durable`` callbacks the last fsync covered (under ``_flush_state``)."""
        waiters, flushed = self._durable_waiters, self._flushed
        if not waiters or waiters[0][0] > flushed:
            return []
        self._durable_waiters = [waiter for waiter in waiters if waiter[0] > flushed]
        return [callback for end, callback, _ in waiters if end <= flushed]

    @staticmethod
    def _call_waiter(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("a when_durable (or on_dropped) callback failed")

    def _dispatch_all(self, records: list[StoredRecord]) -> None:
        """Dispatch records made durable together, then tell the listeners of them: when a
        listener hears of a record, every record written with it is readable (a decision
        is never applied before the records it implies are in their queues)."""
        self._dispatch(records)
        if not records:
            return
        for listener in self._listeners:
            try:
                listener(records)
            except Exception:
                log.exception("dispatch listener failed for the records from offset %d", records[0].commit_log_offset)

    def _dispatch(self, records: list[StoredRecord]) -> None:
        """Add records, in commit log order, to their consume queues (memory) and the index
        (one write per index file)."""
        if not records:
            return
        indexed: list[IndexedRecord] = []
        for record in records:
            properties = record.properties
            self._queue(record.topic, record.queue_id).append(
                record.queue_offset, record.commit_log_offset, record.size, properties.get(PROPERTY_TAG, ""))
            keys = properties.get(PROPERTY_KEYS)
            indexed.append((record.topic, properties.get(PROPERTY_MESSAGE_ID),
                            keys.split() if keys else [], record.commit_log_offset))
        self.index.add_many(indexed)
        last = records[-1]
        self._dispatched_end = last.commit_log_offset + last.size
        self._last_store_ms = last.store_timestamp_ms

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Be told of the records made durable together, in one call per batch, once they
        are dispatched."""
        self._listeners.append(listener)

    def flush(self) -> None:
        """Write the held records (or drop them if that fails, ``put_batch``), fsync
        everything written so far and dispatch it."""
        try:
            with self._write_lock:
                if self._held and self._flush_error is None:
                    self._append_with_held([])
                end = self.commitlog.write_offset
        finally:
            self._tell_dropped()
        self._sync_to(end)

    def checkpoint(self) -> None:
        """Make consume queues and index durable, then record how far everything is.

        Raises ``StoreFullError`` when the disk is full; the previous checkpoint stays and
        the unwritten entries are retried at the next checkpoint.
        """
        self.flush()
        with self._flush_lock:
            with self._write_lock:
                verified = min(self._dispatched_end, self._flushed)
                if self.index.failed_from is not None:
                    verified = min(verified, self.index.failed_from)
                queue_writes = [
                    (queue, *queue.unpersisted())
                    for queue in self._queues.values() if queue.persisted < queue.max_offset
                ]
                counts: dict[str, dict[str, int]] = {}
                for (topic, queue_id), queue in self._queues.items():
                    counts.setdefault(topic, {})[str(queue_id)] = queue.max_offset
                index_state = [*self.index.file_numbers, self.index.max_indexed]
                index_write = self.index.unpersisted()
            index_written = False
            try:
                for queue, start, data in queue_writes:
                    queue.persist(start, data)
                self.index.persist(index_write)
                index_written = True
                self._write_checkpoint_file({
                    "verified": verified,
                    "commitlog_flushed": self._flushed,
                    "consumequeue_dispatched": verified,
                    "index_dispatched": verified,
                    "last_store_ms": self._last_store_ms,
                    "written_ms": self.config.clock.time_ms(),
                    "queues": counts,
                    "index": index_state,
                    "commitlog_min": self.commitlog.min_offset,
                })
            except OSError as exc:
                if not index_written:
                    self.index.restore(index_write)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StoreFullError(f"disk full while checkpointing {self.data_dir}") from exc
                raise

    def _write_checkpoint_file(self, fields: dict[str, Any]) -> None:
        path = self.data_dir / CHECKPOINT
        write_atomically(path, json.dumps(fields).encode(), self.fs)

    def _run_background(self) -> None:
        last_checkpoint = time.monotonic()
        while not self._stop.wait(self.config.async_flush_interval_s):
            try:
                if self.config.flush_mode == "async" or self._pending or self._held:
                    self.flush()
                if time.monotonic() - last_checkpoint >= self.config.checkpoint_interval_s:
                    self.checkpoint()
                    last_checkpoint = time.monotonic()
            except Exception:
                log.exception("background flush/checkpoint failed")

    # -- reading --------------------------------------------------------------------------
    def get(self, commit_log_offset: int) -> StoredRecord:
        """Read one record by its commit log offset."""
        return self.commitlog.read_at(commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_records: int,
                   max_bytes: int | None = None) -> list[StoredRecord]:
        """Records of a consume queue from ``offset`` (empty past the end), as many as fit
        in ``max_bytes`` of record size (at least one).

        A record whose CRC fails is skipped like a hole (the scrub records its loss if it
        has not yet): the records behind it are returned, and the result is empty only
        when no readable record follows ``offset``."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            return []
        while True:
            entries = queue.entries(offset, max_records)
            fitted = fitting(entries, lambda entry: entry[1], max_bytes)
            records: list[StoredRecord] = []
            for (at, size), read in zip(fitted, self.commitlog.read_many(fitted), strict=True):
                if isinstance(read, CorruptLogError):
                    self._damaged(at, size, read)
                else:
                    records.append(read)
            if records or not entries or len(fitted) == len(entries) < max_records:
                return records
            offset = queue.offset_after(fitted[-1][0])

    def _readable(self, offset: int, size: int) -> StoredRecord | None:
        """The record at ``offset``; None when it is damaged (reported to the scrub) or
        retention deleted it meanwhile."""
        try:
            return self.commitlog.read(offset, size)
        except CorruptLogError as exc:
            self._damaged(offset, size, exc)
            return None

    def _damaged(self, offset: int, size: int, refusal: CorruptLogError) -> None:
        """A record a reader could not read: reported to the scrub, unless retention
        deleted it meanwhile."""
        if offset >= self.commitlog.min_offset:
            self.scrub.damaged_record(offset, size, str(refusal))

    @property
    def dispatched_end(self) -> int:
        """The commit log offset up to which records are durable and dispatched."""
        return self._dispatched_end

    def queue_entries_between(self, start: int, end: int) -> list[tuple[str, int, int, int, int]]:
        """``(topic, queue id, queue offset, commit log offset, size)`` of every consume queue
        entry whose record starts in commit log ``[start, end)``: the records a damaged range
        took."""
        found: list[tuple[str, int, int, int, int]] = []
        for (topic, queue_id), queue in list(self._queues.items()):
            try:
                found += [(topic, queue_id, *entry) for entry in queue.entries_pointing_into(start, end)]
            except (IndexError, OSError):  # retention deleted the queue's head meanwhile
                continue
        return sorted(found, key=lambda entry: entry[3])

    def tagged_entries(self, topic: str, queue_id: int, start: int, count: int) -> list[tuple[int, int, int]]:
        """``ConsumeQueue.tagged_entries`` of a queue (empty if it has none): entries and
        their tag hashes, no record read."""
        queue = self._queues.get((topic, queue_id))
        return queue.tagged_entries(start, count) if queue is not None else []

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.max_offset if queue else 0

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.min_offset if queue else 0

    def queues(self) -> dict[str, int]:
        """Every topic that has records, with its number of queues (max queue id + 1)."""
        found: dict[str, int] = {}
        for topic, queue_id in list(self._queues):
            if self._queues[(topic, queue_id)].max_offset:
                found[topic] = max(found.get(topic, 0), queue_id + 1)
        return found

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset with store time >= ``timestamp_ms`` (binary search)."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            middle = (low + high) // 2
            offset, size = queue.entry(middle)
            # a hole (size 0) or a damaged record counts as late enough: a replay from it misses nothing
            record = self._readable(offset, size) if size else None
            if record is not None and record.store_timestamp_ms < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def lookup_message_id(self, message_id: str) -> list[int]:
        return [
            offset for offset in self.index.lookup_id(message_id)
            if (head := self._head_at(offset)) and head.properties.get(PROPERTY_MESSAGE_ID) == message_id
        ]

    def lookup_key(self, topic: str, key: str) -> list[int]:
        return [
            offset for offset in self.index.lookup_key(topic, key)
            if (head := self._head_at(offset))
            and head.topic == topic and key in head.properties.get(PROPERTY_KEYS, "").split()
        ]

    def _head_at(self, offset: int) -> codec.RecordHead | None:
        """Topic and properties of the durable record at an index entry's offset; None
        if the offset is outside the log or no record starts there (a stale entry)."""
        if not self.commitlog.min_offset <= offset < self._dispatched_end:
            return None
        return self.commitlog.read_head(offset)

    def stored_after(self, message_id: str, offset: int, topics: tuple[str, ...]) -> bool:
        """Whether message ``message_id`` was stored after commit log ``offset`` in one of
        ``topics``: how recovery tells which records of a multi-record operation a crash
        cut off."""
        return any(
            later > offset and self.get(later).topic in topics for later in self.lookup_message_id(message_id)
        )

    def scan(self, from_commit_log_offset: int = 0) -> Iterator[StoredRecord]:
        """Every durable record from an offset, in commit log order."""
        start = max(from_commit_log_offset, self.commitlog.min_offset)
        return self.commitlog.scan(start, self._dispatched_end)

    def reserve_queue_offsets(self, topic: str, queue_id: int, next_offset: int) -> None:
        """Let the queue's next record get ``next_offset`` or later: the offsets below it
        that hold no record become holes (``repair`` keeps the offsets of lost records from
        being given to new ones, which consumers past them would skip). For an idle store."""
        self.flush()
        with self._write_lock:
            self._queue(topic, queue_id).reserve(next_offset)
            self._next_offset.pop((topic, queue_id), None)

    # -- retention ------------------------------------------------------------------------
    def delete_expired_segments(self, now_ms: int | None = None, guard_offset: int | None = None) -> int:
        """Delete commit log segments older than ``retention_hours`` and wholly below
        ``guard_offset`` (the broker's oldest half or delayed message still needed; None: no
        limit); raise queue minimums to match. Returns segments deleted.

        A checkpoint goes first: it makes durable how far every queue goes (past every
        record to be deleted, all dispatched), so that a restart, whenever a crash falls,
        continues each queue after them. Else a queue whose every record went with its
        files would start again at offset 0 after the next crash, and give its offsets
        again: a consumer past them skips the new records, and the transaction book,
        which replays its op queue from the offset it had applied, skips a commit."""
        limit = self._dispatched_end if guard_offset is None else min(self._dispatched_end, guard_offset)
        cutoff = (now_ms if now_ms is not None else self.config.clock.time_ms()) - int(
            self.config.retention_hours * 3_600_000)
        if not self.commitlog.first_expired(limit, cutoff):
            return 0
        self.checkpoint()
        with self._flush_lock, self._write_lock:
            deleted = self.commitlog.delete_segments_before(limit, cutoff)
            if deleted:
                first = self.commitlog.min_offset
                for queue in self._queues.values():
                    queue.drop_below(first)
                self.index.delete_below(first)
        return deleted

    # -- closing --------------------------------------------------------------------------
    def close(self) -> None:
        """Flush, write the checkpoint, release the data directory."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True  # refuse new puts; those already appended are flushed below
        self._stop.set()
        self.scrub.stop()
        self._background.join(timeout=5)
        try:
            self.checkpoint()
        except StoreFullError:
            log.warning("closing %s without a final checkpoint: disk full", self.data_dir)
        with self._flush_lock, self._write_lock:
            self.commitlog.close()
            for queue in self._queues.values():
                queue.close()
            self.index.close()
            self.fs.unlock(self._lock_file)

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
