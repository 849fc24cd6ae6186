"""Consumer groups, RocketMQ 5 style: receive a batch, ack each message, retry, dead-letter.

Progress is kept per (consumer group, subscribed topic, stored topic, queue): a *floor*
below which every message is done, the messages read past it (``pending``: delivered or
waiting), and the done ones above the floor. A message received and not acked within
its invisible duration comes back, after a growing back-off, with ``delivery_attempt``
+ 1; once ``max_delivery_attempts`` deliveries went un-acked it moves to
``%DLQ%<group>``. Messages sharing a ``message_group`` are delivered one at a time in
queue order (FIFO). A new group starts at the beginning of the topic.

A receive's filter (``filters.Subscription``: tags or SQL92) decides which messages of the
subscribed topic the group gets: the others are done for the group (RocketMQ's offset moves past
them), recorded as ranges (``EVENT_SKIPPED``). A message is judged by the filter of the
receive that reaches it, so a changed subscription applies from the group's progress on;
one delivered already keeps coming back until acked. Its consume queue entry's tag hash
passes a message over without reading its record; a matching hash is confirmed against
the stored tag; an SQL92 filter reads every record to evaluate its properties. The group's
retry queue is not filtered (as RocketMQ subscribes it ``*``).

Durability: every delivery, ack and dead-lettering is an event record in
``RMQ_SYS_CONSUMER_STATE``; replaying them on start restores floors, done sets, attempt
counts and the receipts of messages in flight. A delivery event carries its receipt and its invisible
time (so does a ChangeInvisibleDuration, stored as a delivery of the same attempt), so a
message in flight at a restart stays invisible until its time and the receipt its consumer
holds still acks it, as RocketMQ's pop checkpoints keep them. Those times are wall-clock
times: a clock that went back while the broker was down leaves a message invisible for no
longer than it was given. A periodic snapshot (``snapshot``/``restore``) bounds the replay
to the events after it.
Deleting a group (``delete_group``) is an event too (``EVENT_DELETED``), one per stored
queue it had progress in, carrying the floor there, and one for its DLQ, carrying the DLQ's
end: the group's progress is dropped and those floors kept (``resume_at``, ``dlq_floors``,
in the snapshot as well), so consumers of the group that come back resume where it stopped
and only later dead letters are listed and counted. Resetting a group on a topic
(``reset_group``, RocketMQ's resetOffsetByTime) stores one ``EVENT_RESET`` per queue of the
topic, carrying its new floor. Both are refused while the group consumes, and its receives
while they are stored.
Like RocketMQ's periodic consumer-offset persistence, these events are written without
waiting for their fsync (they are durable within the store's flush interval): a crash
can forget the last acks, which only means one more delivery of those messages, and the
idempotent consumer absorbs it. Dead-lettered messages themselves are written durably.
An ack, a dead-lettering (a call's or the last attempt's) or a ChangeInvisibleDuration
whose event the store refuses (a full disk, an I/O error) changes nothing: the message
stays in flight with the receipt and time its consumer holds (an acked or dead-lettered
one also in a snapshot taken while the refused write was under way: ``_store``), a FIFO
group's head still ahead of the rest of its group (``QueueProgress.pending`` stays in
queue order); a receive refused so spends no attempt and hides nothing (``_Gathering.undo``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec

from ..api import ConsumerQueue, DeletedGroup, GroupReset
from ..clock import WALL, Clock
from ..errors import (
    BrokerClosedError,
    GroupInUseError,
    InvalidTopicError,
    UnknownGroupError,
    UnknownReceiptError,
    UnknownTopicError,
)
from ..filters import EVERY_MESSAGE, Subscription
from ..message import ReceivedMessage
from ..store.index import consecutive_runs
from ..store.message_store import MessageStore, fitting
from ..store.record import PROPERTY_MESSAGE_ID, StoredRecord
from ..topics import CONSUMER_STATE_TOPIC, DLQ_PREFIX, dlq_topic, retry_topic, validate_group
from . import codec

log = logging.getLogger(__name__)

EVENT_DELIVERED = "d"
EVENT_ACKED = "a"
EVENT_DEAD = "x"
EVENT_SKIPPED = "s"  # ``count`` messages from ``queue_offset`` on, which the group's filter passed over
#: The group was deleted: its progress in ``stored_topic``'s queue (its floor there is
#: ``queue_offset``), or, with no ``topic``, its DLQ (which ended at ``queue_offset``).
EVENT_DELETED = "f"
#: The group was reset (``reset_group``): its progress in ``stored_topic``'s queue starts
#: again at ``queue_offset``, every message from there on to be delivered.
EVENT_RESET = "r"

#: Consume queue entries a tag filter reads at once (20 bytes each), and at most per queue
#: under the lock: a receive scanning a long run of messages its filter passes over lets
#: other calls in between.
FILTER_SCAN_ENTRIES = 256
#: The records a receive reads of a queue at a time, at least (it reads as many as it still wants).
READ_BATCH = 64
FILTER_SCAN_LIMIT = 16 * FILTER_SCAN_ENTRIES


class Event(msgspec.Struct, omit_defaults=True):
    """One progress event (``kind``: d/a/x/s) of ``group`` on ``topic`` (subscribed), at
    ``queue_offset`` of ``stored_topic``'s queue ``queue_id`` (stored under the short names
    given to ``msgspec.field``); a skip covers ``count`` offsets from there."""

    kind: str = msgspec.field(name="e")
    group: str = msgspec.field(name="g")
    topic: str = msgspec.field(name="s")
    stored_topic: str = msgspec.field(name="t")
    queue_id: int = msgspec.field(name="q")
    queue_offset: int = msgspec.field(name="o")
    attempt: int = msgspec.field(name="n")
    message_id: str = msgspec.field(name="m")
    timestamp_ms: int = msgspec.field(name="ts")
    count: int = msgspec.field(name="c", default=1)
    #: A delivery's receipt and the wall times it is invisible and its receipt valid until
    #: (absent from events written before they were kept, and from other kinds).
    receipt: str = msgspec.field(name="r", default="")
    visible_at_ms: int = msgspec.field(name="v", default=0)
    expires_at_ms: int = msgspec.field(name="x", default=0)


encode_events = msgspec.msgpack.Encoder().encode
decode_events = msgspec.msgpack.Decoder(list[Event]).decode


class Held(msgspec.Struct, array_like=True):
    """The receipt of a message in flight and its wall times (delivered, invisible until,
    receipt valid until), kept from the events and the snapshot for a message whose record
    no receive has read again since the broker started."""

    receipt: str
    delivered_at_ms: int
    visible_at_ms: int
    expires_at_ms: int

    def on_clock(self, now_ms: int) -> Held:
        """These times on a clock reading ``now_ms``: one that went back past the delivery
        moves them back with it, so the message is invisible (and its receipt valid) no
        longer than it was given."""
        if now_ms >= self.delivered_at_ms:
            return self
        back = self.delivered_at_ms - now_ms
        return Held(self.receipt, now_ms, self.visible_at_ms - back, self.expires_at_ms - back)


class _SavedProgress(msgspec.Struct, array_like=True):
    key: tuple[str, str, str, int]
    floor: int
    done_above: list[int]
    attempts: dict[int, int]
    held: dict[int, Held] = {}  # absent from snapshots written before receipts were kept


class Snapshot(msgspec.Struct, omit_defaults=True):
    """All groups' progress as of the first ``upto`` records of ``RMQ_SYS_CONSUMER_STATE``,
    and what deleted groups left (written only when there is some: a snapshot without
    deleted groups has the bytes it had before groups could be deleted)."""

    upto: int
    progress: list[_SavedProgress]
    resume_at: list[tuple[tuple[str, str, str, int], int]] = []
    dlq_floors: dict[str, int] = {}


encode_snapshot = msgspec.msgpack.Encoder().encode
decode_snapshot = msgspec.msgpack.Decoder(Snapshot).decode


def events_of(record: StoredRecord) -> list[Event]:
    """The events of a stored record; none (logged) when it cannot be decoded."""
    try:
        return decode_events(record.body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("undecodable consumer progress record at commit log offset %d skipped: %s",
                  record.commit_log_offset, exc)
        return []


def _names_a_group(event: Event) -> bool:
    """Whether a stored dead-letter event names a usable group (its DLQ is a topic name)."""
    try:
        validate_group(event.group)
    except InvalidTopicError:
        log.error("dead-letter event of message %r names group %r; no DLQ copy redone", event.message_id, event.group)
        return False
    return True


class Delivery(msgspec.Struct):
    """A message read past the floor and not yet done. Its ``record`` is kept without its
    body (read again when it is delivered), so a queue's deliveries in flight hold headers,
    not megabytes of bodies."""

    record: StoredRecord
    attempt: int = 0
    visible_at_ms: int = 0
    expires_at_ms: int = 0  # the current receipt is valid until then
    receipt: str = ""
    delivered_at_ms: int = 0  # when the current receipt was given

    def held(self) -> Held:
        return Held(self.receipt, self.delivered_at_ms, self.visible_at_ms, self.expires_at_ms)

    def restore(self, held: Held) -> None:
        """Take the receipt and times of ``held`` (kept across a restart, or a change that
        could not be stored)."""
        self.receipt, self.delivered_at_ms = held.receipt, held.delivered_at_ms
        self.visible_at_ms, self.expires_at_ms = held.visible_at_ms, held.expires_at_ms


@dataclass
class QueueProgress:
    """One group's progress through one stored queue."""

    floor: int = 0
    next_offset: int = 0
    #: The messages read and not done, in queue order (a message group's head is its first).
    pending: dict[int, Delivery] = field(default_factory=dict)
    done_above: set[int] = field(default_factory=set)
    attempts: dict[int, int] = field(default_factory=dict)
    #: The receipts of messages in flight when the broker started, until their records are read.
    held: dict[int, Held] = field(default_factory=dict)

    def mark_done(self, offset: int) -> None:
        self.pending.pop(offset, None)
        self.attempts.pop(offset, None)
        self.held.pop(offset, None)
        if offset >= self.floor:
            self.done_above.add(offset)
        while self.floor in self.done_above:
            self.done_above.discard(self.floor)
            self.floor += 1
        self.next_offset = max(self.next_offset, self.floor)

    def reopen(self, offset: int, delivery: Delivery) -> None:
        """Undo ``mark_done(offset)`` of ``delivery``, whose event could not be stored:
        pending again as it was (the offsets the floor passed meanwhile stay done)."""
        if offset < self.floor:
            self.done_above.update(range(offset + 1, self.floor))
            self.floor = offset
        else:
            self.done_above.discard(offset)
        self._pend(offset, delivery)

    def _pend(self, offset: int, delivery: Delivery) -> None:
        """``delivery`` pending at ``offset`` (not pending yet), ``pending`` kept in queue
        order: one read out of order, or put back, would otherwise let the next message of
        its group go first. Only the messages above ``offset`` move (behind it)."""
        behind = bool(self.pending) and offset < next(reversed(self.pending))
        above = list(itertools.takewhile(lambda later: later > offset, reversed(self.pending))) if behind else []
        self.pending[offset] = delivery
        for later in reversed(above):
            self.pending[later] = self.pending.pop(later)

    def skip_to(self, offset: int) -> None:
        """Messages below ``offset`` are gone (retention deleted them): nothing to do there."""
        if offset <= self.floor:
            return
        self.floor = offset
        self.done_above = {o for o in self.done_above if o >= offset}
        self.attempts = {o: n for o, n in self.attempts.items() if o >= offset}
        self.held = {o: h for o, h in self.held.items() if o >= offset}
        self.mark_done(offset - 1)  # advances the floor over done offsets just above it

    def attempts_so_far(self) -> dict[int, int]:
        """The delivery attempts of every message not done: of those read but not yet
        delivered again (``attempts``) and of those pending (delivered or due)."""
        in_flight = {offset: d.attempt for offset, d in self.pending.items() if d.attempt}
        return {**self.attempts, **in_flight}

    def held_so_far(self) -> dict[int, Held]:
        """The receipts of every message in flight: of those pending and of those held."""
        return {**self.held, **{offset: d.held() for offset, d in self.pending.items() if d.receipt}}

    def take(self, record: StoredRecord, read_ahead: ReadAhead) -> None:
        """``record`` is to be delivered: pending, without its body (``read_ahead`` may keep
        it for the receive reading it; otherwise it is read again when it goes out), with
        the attempts it already had and the receipt it holds; nothing when it is pending
        already (the ack of a receipt from before a restart read it)."""
        offset = record.queue_offset
        if offset in self.pending:
            return
        read_ahead.keep(record)
        delivery = Delivery(record.without_body(), self.attempts.pop(offset, 0))
        self._pend(offset, delivery)
        held = self.held.pop(offset, None)
        if held is not None:
            delivery.restore(held)

    def mark_done_range(self, start: int, end: int) -> None:
        """The offsets from ``start`` to ``end`` (excluded), none of them pending, are done."""
        if start <= self.floor:
            self.skip_to(end)
        else:
            for offset in range(start, end):
                self.mark_done(offset)

    def pass_holes(self, upto: int) -> None:
        """Nothing to deliver at the offsets from ``next_offset`` to ``upto``, which the store
        skipped (holes, records whose CRC fails): done, so they never hold the floor back."""
        if self.next_offset >= upto:
            return
        self.mark_done_range(self.next_offset, upto)
        self.next_offset = upto



class ReadAhead:
    """The records one receive read whole while topping its queues up, kept for the
    messages it delivers so that none is read twice: at most ``count`` records of at most
    ``room`` bytes in all (what the receive can return), the first ones taken."""

    def __init__(self, count: int, room: int) -> None:
        self.count = count
        self.room = room
        self.records: dict[int, StoredRecord] = {}

    def keep(self, record: StoredRecord) -> None:
        if len(self.records) < self.count and record.size <= self.room:
            self.records[record.commit_log_offset] = record
            self.room -= record.size

    def read(self, store: MessageStore, commit_log_offset: int) -> StoredRecord:
        """The record at ``commit_log_offset``: the one kept, else read from ``store``."""
        return self.records.pop(commit_log_offset, None) or store.get(commit_log_offset)


#: Where receipts' random parts come from (not a secret: a receipt only tells deliveries of
#: one message apart, and one random draw costs no system call).
_receipts = random.Random()


def new_receipt() -> str:
    """The random part of a new receipt handle: 16 hex digits."""
    return f"{_receipts.getrandbits(64):016x}"


ProgressKey = tuple[str, str, str, int]  # group, subscribed topic, stored topic, queue id
Skipped = list[tuple[ProgressKey, int, int]]  # offsets from, to (excluded) a filter passed over


@dataclass
class _Gathering:
    """What one receive gathers over a group's queues: its deliveries (in ``room`` bytes
    left), dead-letterings, the ranges its filter passed over, and whether the filter's
    scan stopped with more to scan."""

    now: int
    invisible_ms: int
    max_messages: int
    room: int
    subscription: Subscription
    skipped: Skipped
    delivered: list[tuple[ProgressKey, Delivery]] = field(default_factory=list)
    dead: list[tuple[ProgressKey, Delivery]] = field(default_factory=list)
    unscanned: bool = False
    #: Each delivery's attempts and receipt before it was delivered (``undo``).
    before: list[tuple[Delivery, int, Held]] = field(default_factory=list)

    def undo(self) -> None:
        """The deliveries as they were before (their events could not be stored): no
        attempt spent, no receipt given."""
        for delivery, attempt, held in self.before:
            delivery.attempt = attempt
            delivery.restore(held)

    @property
    def full(self) -> bool:
        return len(self.delivered) >= self.max_messages


def _from(pending: dict[int, Delivery], start: int) -> list[tuple[int, Delivery]]:
    """The messages pending at ``start`` and above, in queue order (a tail of ``pending``)."""
    tail = list(itertools.takewhile(lambda item: item[0] >= start, reversed(pending.items())))
    tail.reverse()
    return tail


def _taken(pending: dict[int, Delivery], start: int, ahead: set[int]) -> list[tuple[int, Delivery]]:
    """The messages a top-up reading from ``start`` took into ``pending``, in queue order:
    those at ``start`` and above but the ones pending there before it (``ahead``: read
    ahead for a receipt from before a restart, and picked from already)."""
    return [item for item in _from(pending, start) if item[0] not in ahead]


def _event(kind: str, group: str, topic: str, key: ProgressKey, d: Delivery, at_ms: int) -> Event:
    """The event ``kind`` of delivery ``d`` at ``at_ms`` (epoch ms); a delivery's with its receipt and times."""
    message_id = d.record.properties.get(PROPERTY_MESSAGE_ID, "")
    if kind == EVENT_DELIVERED:
        return Event(kind, group, topic, key[2], key[3], d.record.queue_offset, d.attempt, message_id, at_ms,
                     receipt=d.receipt, visible_at_ms=d.visible_at_ms, expires_at_ms=d.expires_at_ms)
    return Event(kind, group, topic, key[2], key[3], d.record.queue_offset, d.attempt, message_id, at_ms)


def _saved(key: ProgressKey, progress: QueueProgress, unstored: list[Delivery]) -> _SavedProgress:
    """A queue's progress as a snapshot keeps it: the ``unstored`` deliveries in flight."""
    if unstored:
        progress = dataclasses.replace(progress, pending=dict(progress.pending), done_above=set(progress.done_above))
        for delivery in unstored:
            progress.reopen(delivery.record.queue_offset, delivery)
    return _SavedProgress(key, progress.floor, sorted(progress.done_above), progress.attempts_so_far(),
                          progress.held_so_far())


def _in_flight(progress: QueueProgress, now_ms: int) -> int:
    """The messages of ``progress`` received and within their invisible duration at ``now_ms``."""
    return (sum(1 for d in progress.pending.values() if d.receipt and d.expires_at_ms > now_ms)
            + sum(1 for h in progress.held.values() if h.expires_at_ms > now_ms))


def _add_skip(skipped: Skipped, key: ProgressKey, start: int, end: int) -> None:
    """Record offsets ``start`` to ``end`` as skipped, joined to the previous range if adjacent."""
    if skipped and skipped[-1][0] == key and skipped[-1][2] == start:
        skipped[-1] = (key, skipped[-1][1], end)
    else:
        skipped.append((key, start, end))


class ConsumerGroups:
    """All consumer groups' progress; the broker calls it under no lock of its own."""

    def __init__(
        self,
        store: MessageStore,
        queue_count: Callable[[str], int],
        max_delivery_attempts: int,
        retry_backoff_s: tuple[float, ...],
        max_inflight_per_queue: int,
        sync_progress: bool,
        clock: Clock = WALL,
    ) -> None:
        self.store = store
        #: The time of deliveries, invisibility and events (``StoreConfig.clock``); a long
        #: poll still waits on the real clock.
        self.clock = clock
        self._queue_count = queue_count
        self.max_delivery_attempts = max_delivery_attempts
        self.retry_backoff_ms = tuple(int(s * 1000) for s in retry_backoff_s) or (0,)
        self.max_inflight = max_inflight_per_queue
        self.sync_progress = sync_progress
        self.lock = threading.RLock()
        self.arrived = threading.Condition(self.lock)
        self.closed = False
        self.progress: dict[ProgressKey, QueueProgress] = {}
        #: Where a deleted group resumes in each queue it had progress in, should it come back.
        self.resume_at: dict[ProgressKey, int] = {}
        #: Per deleted group, the end of its DLQ when it was deleted: the dead letters below
        #: it are no longer listed or counted.
        self.dlq_floors: dict[str, int] = {}
        #: The receives running now, per group, and the groups whose deletion or reset is
        #: being stored (``_claim`` to ``_commit``).
        self._receiving: dict[str, int] = {}
        self._changing: set[str] = set()
        #: Deliveries marked done whose settling events are being stored (``_store``): a
        #: snapshot taken meanwhile keeps them in flight, since the store may refuse them.
        self._unstored: list[tuple[ProgressKey, Delivery]] = []

    # -- replay ---------------------------------------------------------------------------
    def replay(self, records: Iterable[StoredRecord]) -> None:
        """Apply stored event records (on start), then redo the DLQ copy of any
        dead-lettering whose copy a crash cut off."""
        dead: list[tuple[Event, StoredRecord]] = []
        with self.lock:
            for record in records:
                for event in events_of(record):
                    if event.kind in (EVENT_DELETED, EVENT_RESET):
                        self._apply_change(event)
                        continue
                    progress = self._progress((event.group, event.topic, event.stored_topic, event.queue_id))
                    if event.kind == EVENT_DELIVERED:
                        offset = event.queue_offset
                        if offset >= progress.floor and offset not in progress.done_above:
                            progress.attempts[offset] = max(progress.attempts.get(offset, 0), event.attempt)
                            if event.receipt:
                                progress.held[offset] = Held(event.receipt, event.timestamp_ms,
                                                             event.visible_at_ms, event.expires_at_ms)
                    elif event.kind == EVENT_SKIPPED:
                        progress.mark_done_range(event.queue_offset, event.queue_offset + event.count)
                    else:
                        progress.mark_done(event.queue_offset)
                        if event.kind == EVENT_DEAD:
                            dead.append((event, record))
            now = self.clock.time_ms()
            for progress in self.progress.values():
                progress.next_offset = progress.floor
                progress.held = {offset: held.on_clock(now) for offset, held in progress.held.items()}
        missing = [
            self._dead_letter_copy(event.group, original, event.attempt)
            for event, record in dead if _names_a_group(event)
            for original in self.store.read_queue(event.stored_topic, event.queue_id, event.queue_offset, 1)
            if original.properties.get(PROPERTY_MESSAGE_ID) == event.message_id
            and not self.store.stored_after(event.message_id, record.commit_log_offset, (dlq_topic(event.group),))
        ]
        if missing:
            self.store.put_batch(missing)
            log.warning("recovery redid %d dead-letter copies cut off by a crash", len(missing))

    def snapshot(self, events_stored: Callable[[], int]) -> bytes:
        """The progress of every group, with ``upto`` = ``events_stored()`` read under the
        lock: every event record below it was applied before it was written, and
        replaying later ones again is harmless (events are idempotent). The attempts and
        receipts of messages in flight are in it too (their events may be below ``upto``):
        an attempt whose event a crash kept from being stored counts as made (one attempt
        fewer left)."""
        with self.lock:
            unstored: dict[ProgressKey, list[Delivery]] = {}
            for key, delivery in self._unstored:
                unstored.setdefault(key, []).append(delivery)
            return encode_snapshot(Snapshot(
                upto=events_stored(),
                progress=[_saved(key, p, unstored.get(key, [])) for key, p in self.progress.items()],
                resume_at=list(self.resume_at.items()),
                dlq_floors=self.dlq_floors,
            ))

    def restore(self, data: bytes) -> int:
        """Load a snapshot (on start, before ``replay``); returns the event offset to replay from."""
        snapshot = decode_snapshot(data)
        with self.lock:
            for saved in snapshot.progress:
                progress = self._progress(saved.key)
                progress.floor = progress.next_offset = saved.floor
                progress.done_above = set(saved.done_above)
                progress.attempts = dict(saved.attempts)
                progress.held = dict(saved.held)
            self.resume_at.update(snapshot.resume_at)
            self.dlq_floors.update(snapshot.dlq_floors)
        return snapshot.upto

    def _progress(self, key: ProgressKey) -> QueueProgress:
        progress = self.progress.get(key)
        if progress is None:
            floor = self.resume_at.pop(key, 0)  # a deleted group come back: where it stopped
            progress = self.progress[key] = QueueProgress(floor, floor)
        return progress

    # -- receiving ------------------------------------------------------------------------
    def close(self) -> None:
        """Wake every long-polling receiver with ``BrokerClosedError``."""
        with self.arrived:
            self.closed = True
            self.arrived.notify_all()

    def notify(self) -> None:
        """Wake long-polling receivers (a message arrived or became deliverable)."""
        with self.arrived:
            self.arrived.notify_all()

    def receive(
        self, group: str, topic: str, max_messages: int, invisible_ms: int, wait_s: float,
        max_bytes: int | None = None, subscription: Subscription = EVERY_MESSAGE,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` deliverable messages that ``subscription`` matches,
        long-polling up to ``wait_s``; as many as fit in ``max_bytes`` of record size (at
        least one). The messages it passes over are done for the group."""
        with self.lock:
            if group in self._changing:
                raise GroupInUseError(f"consumer group {group!r} is being deleted or reset")
            self._receiving[group] = self._receiving.get(group, 0) + 1
        try:
            return self._receive(group, topic, max_messages, invisible_ms, wait_s, max_bytes, subscription)
        finally:
            with self.lock:
                if self._receiving[group] == 1:
                    del self._receiving[group]
                else:
                    self._receiving[group] -= 1

    def _receive(self, group: str, topic: str, max_messages: int, invisible_ms: int, wait_s: float,
                 max_bytes: int | None, subscription: Subscription) -> list[ReceivedMessage]:
        deadline = time.monotonic() + wait_s
        while True:
            skipped: Skipped = []
            room = max_bytes if max_bytes is not None else sys.maxsize
            read_ahead = ReadAhead(max_messages, room)
            with self.lock:
                if self.closed:
                    raise BrokerClosedError("the broker closed while receiving")
                gathering = self._collect(group, topic, max_messages, invisible_ms, room, subscription, skipped,
                                          read_ahead)
                delivered, dead = gathering.delivered, gathering.dead
                self._unstored += dead
            now = self.clock.time_ms()
            events = [_event(EVENT_DELIVERED, group, topic, key, d, now) for key, d in delivered]
            events += [_event(EVENT_DEAD, group, topic, key, d, now) for key, d in dead]
            events += [Event(EVENT_SKIPPED, group, topic, key[2], key[3], start, 0, "", now, end - start)
                       for key, start, end in skipped]
            if events:
                # dead-letterings: the decision (event) first, with the DLQ copies, durable;
                # refused (a full disk): nothing delivered, no attempt spent
                self._store(events, dead, dead_letters_of=group, undo=gathering.undo)
            if delivered:
                return [self._received(key, d, read_ahead) for key, d in delivered]
            if gathering.unscanned:
                continue  # the filter's scan stopped at FILTER_SCAN_LIMIT: on with it
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            with self.arrived:
                self.arrived.wait(min(remaining, 0.2))

    def _sources(self, group: str, topic: str) -> list[tuple[str, int]]:
        queues = [(topic, q) for q in range(self._queue_count(topic))]
        return queues + [(retry_topic(group), 0)]

    def _collect(
        self, group: str, topic: str, max_messages: int, invisible_ms: int, room: int,
        subscription: Subscription, skipped: Skipped, read_ahead: ReadAhead,
    ) -> _Gathering:
        """The gathering of one pass over the group's queues: its deliveries (of ``room``
        bytes of records at most, at least one) and dead-letterings, and whether a filter
        left entries unscanned. Each queue's pending messages go first;
        then it reads on, as many records at a time as the receive still wants (at least
        ``READ_BATCH``), until it has them, the queue ends or ``max_inflight`` are pending:
        so the records read are mostly the ones delivered, and ``read_ahead`` keeps them
        whole for the answer."""
        gathering = _Gathering(self.clock.time_ms(), invisible_ms, max_messages, room, subscription, skipped)
        for stored_topic, queue_id in self._sources(group, topic):
            key = (group, topic, stored_topic, queue_id)
            progress = self._progress(key)
            filtered = stored_topic == topic and not subscription.every
            busy_groups: set[str] = set()
            candidates = list(progress.pending.items())
            reading = True
            while True:
                if self._pick(gathering, key, progress, filtered, busy_groups, candidates):
                    return gathering
                if gathering.full or not reading:
                    break
                want = max(max_messages - len(gathering.delivered), READ_BATCH)
                start = progress.next_offset
                ahead = {offset for offset, _ in _from(progress.pending, start)}
                if filtered:
                    taken, stopped = self._top_up_filtered(key, progress, subscription, skipped, read_ahead, want)
                    gathering.unscanned |= stopped
                else:
                    taken, stopped = self._top_up(key, progress, read_ahead, want), False
                if not taken:
                    break
                reading = not stopped
                candidates = _taken(progress.pending, start, ahead)
            if gathering.full:
                break
        return gathering

    def _pick(self, gathering: _Gathering, key: ProgressKey, progress: QueueProgress, filtered: bool,
              busy_groups: set[str], candidates: list[tuple[int, Delivery]]) -> bool:
        """Deliver or dead-letter, in ``gathering``, the ``candidates`` of one queue that
        are due, in order, a message group's head only (``busy_groups``: the groups whose
        head went by); True when the next one does not fit (the receive is full)."""
        now = gathering.now
        for offset, delivery in candidates:
            if gathering.full:
                break
            if filtered and not delivery.attempt and not gathering.subscription.accepts(
                    codec.FilterProperties(delivery.record.properties)):
                progress.mark_done(offset)  # read for an earlier subscription, never delivered
                _add_skip(gathering.skipped, key, offset, offset + 1)
                continue
            message_group = delivery.record.properties.get(codec.MESSAGE_GROUP)
            if message_group:
                if message_group in busy_groups:
                    continue
                busy_groups.add(message_group)
            if delivery.visible_at_ms > now:
                continue
            if delivery.attempt >= self.max_delivery_attempts:
                progress.mark_done(offset)
                gathering.dead.append((key, delivery))
                if message_group:
                    busy_groups.discard(message_group)
                continue
            if gathering.delivered and delivery.record.size > gathering.room:
                return True  # left as it is, for the next receive
            gathering.room -= delivery.record.size
            gathering.before.append((delivery, delivery.attempt, delivery.held()))
            delivery.attempt += 1
            delivery.receipt = new_receipt()
            delivery.delivered_at_ms = now
            backoff = self.retry_backoff_ms[min(delivery.attempt - 1, len(self.retry_backoff_ms) - 1)]
            delivery.visible_at_ms = now + gathering.invisible_ms + backoff
            delivery.expires_at_ms = now + gathering.invisible_ms
            gathering.delivered.append((key, delivery))
        return False

    def _queue_end(self, key: ProgressKey, progress: QueueProgress) -> int:
        """The end of the key's stored queue, ``progress`` first moved past what retention
        deleted below it."""
        _, _, stored_topic, queue_id = key
        end = self.store.queue_max_offset(stored_topic, queue_id)
        if progress.next_offset < end:
            progress.skip_to(self.store.queue_min_offset(stored_topic, queue_id))
        return end

    def _top_up(self, key: ProgressKey, progress: QueueProgress, read_ahead: ReadAhead, want: int) -> int:
        """Read the queue on from ``progress.next_offset``, taking up to ``want`` messages
        as pending (never more than ``max_inflight`` in all); how many it took."""
        group, topic, stored_topic, queue_id = key
        end = self._queue_end(key, progress)
        before = len(progress.pending)
        enough = min(self.max_inflight, before + want)
        while progress.next_offset < end and len(progress.pending) < enough:
            batch = self.store.read_queue(stored_topic, queue_id, progress.next_offset,
                                          min(READ_BATCH, enough - len(progress.pending)))
            if not batch:
                progress.pass_holes(end)
                break
            for record in batch:
                offset = record.queue_offset
                progress.pass_holes(offset)
                progress.next_offset = offset + 1
                if offset < progress.floor or offset in progress.done_above:
                    continue
                if stored_topic != topic and record.properties.get(codec.REAL_TOPIC) != topic:
                    progress.mark_done(offset)  # a resend meant for another subscription
                    continue
                progress.take(record, read_ahead)
        return len(progress.pending) - before

    def _top_up_filtered(self, key: ProgressKey, progress: QueueProgress, subscription: Subscription,
                         skipped: Skipped, read_ahead: ReadAhead, want: int) -> tuple[int, bool]:
        """``_top_up`` through ``subscription``: the consume queue's tag hashes pick the
        records to read (a message delivered before, whose attempts count, is read whatever
        its tag, and so is one pending already: a receipt from before a restart read it); the
        offsets not taken are done, added to ``skipped``. Up to
        ``FILTER_SCAN_LIMIT`` entries: how many it took, and whether it stopped there with
        more to scan."""
        _, _, stored_topic, queue_id = key
        end = self._queue_end(key, progress)
        limit = progress.next_offset + FILTER_SCAN_LIMIT
        before = len(progress.pending)
        enough = min(self.max_inflight, before + want)
        while progress.next_offset < end and len(progress.pending) < enough:
            if progress.next_offset >= limit:
                return len(progress.pending) - before, True
            scan_start = progress.next_offset
            entries = self.store.tagged_entries(stored_topic, queue_id, scan_start, FILTER_SCAN_ENTRIES)
            if not entries:
                break
            hits = [offset for offset, size, hashed in entries if size and (
                subscription.matches_hash(hashed) or offset in progress.attempts or offset in progress.pending)]
            taken: list[int] = []
            for first, end in consecutive_runs(hits):
                for record in self.store.read_queue(stored_topic, queue_id, first, end - first):
                    offset = record.queue_offset
                    if offset >= end:
                        break  # read past a damaged run: those come with their own run
                    if offset < progress.floor or offset in progress.done_above:
                        continue
                    if offset in progress.attempts or offset in progress.pending \
                            or subscription.accepts(codec.FilterProperties(record.properties)):
                        progress.take(record, read_ahead)
                        taken.append(offset)
            progress.next_offset = scan_end = entries[-1][0] + 1
            start = scan_start
            for offset in [*taken, scan_end]:
                if offset > start:
                    progress.mark_done_range(start, offset)
                    _add_skip(skipped, key, start, offset)
                start = offset + 1
        return len(progress.pending) - before, False

    @staticmethod
    def _receipt_handle(key: ProgressKey, delivery: Delivery) -> str:
        return "|".join((key[1], key[2], str(key[3]), str(delivery.record.queue_offset), delivery.receipt))

    def _received(self, key: ProgressKey, delivery: Delivery, read_ahead: ReadAhead) -> ReceivedMessage:
        """The delivery as handed to the consumer, its body as ``read_ahead`` kept it or
        read from the commit log."""
        record = delivery.record
        return ReceivedMessage(
            message=codec.message_of(read_ahead.read(self.store, record.commit_log_offset), key[1]),
            receipt_handle=self._receipt_handle(key, delivery),
            delivery_attempt=delivery.attempt,
            queue_id=record.queue_id,
            queue_offset=record.queue_offset,
            born_timestamp_ms=record.born_timestamp_ms,
            store_timestamp_ms=record.store_timestamp_ms,
            transaction_id=record.properties.get(codec.TRANSACTION_ID),
        )

    def _store(self, events: list[Event], settled: Sequence[tuple[ProgressKey, Delivery]] = (),
               dead_letters_of: str | None = None, undo: Callable[[], None] | None = None) -> None:
        """Store ``events``, which settled the ``settled`` deliveries (marked done under the
        lock and put in ``_unstored`` there), with their copies for ``dead_letters_of``'s DLQ
        if they are its dead-letterings. If that fails (a full disk, an I/O error), they are
        pending again as they were, ``undo`` runs under the lock (it puts back what else the
        events changed in memory), and the error is raised: a settlement the broker refused
        changes nothing, so the same receipt can settle the message once the disk takes
        writes again."""
        stored = False
        try:
            copies = [] if dead_letters_of is None else [
                self._dead_letter_copy(dead_letters_of, self.store.get(d.record.commit_log_offset), d.attempt)
                for _, d in settled]
            self._persist(events, copies)
            stored = True
        finally:
            if settled or not stored:  # a lone write that was taken costs no lock
                with self.lock:
                    self._settled(settled, stored)
                    if not stored and undo is not None:
                        undo()

    def _settled(self, settled: Sequence[tuple[ProgressKey, Delivery]], stored: bool) -> None:
        """Under the lock: ``settled`` out of ``_unstored``; pending again unless ``stored``."""
        done = {id(delivery) for _, delivery in settled}
        self._unstored = [entry for entry in self._unstored if id(entry[1]) not in done]
        if not stored:
            for key, delivery in settled:
                self.progress[key].reopen(delivery.record.queue_offset, delivery)

    def _persist(self, events: list[Event], dead_letter_copies: list[StoredRecord] | None = None,
                 durable: bool = False) -> None:
        """Store ``events`` (and the DLQ copies they made), waiting for their fsync if there
        are copies, if ``durable`` or with ``sync_progress``."""
        records = [StoredRecord(topic=CONSUMER_STATE_TOPIC, queue_id=0, body=encode_events(events))]
        self.store.put_batch(records + (dead_letter_copies or []),
                             wait_for_flush=self.sync_progress or durable or bool(dead_letter_copies))
        for copy in dead_letter_copies or []:
            log.warning("message %s dead-lettered after %s deliveries",
                        copy.properties.get(PROPERTY_MESSAGE_ID), copy.properties[codec.DELIVERY_ATTEMPTS])

    # -- dead letters ---------------------------------------------------------------------
    @staticmethod
    def _dead_letter_copy(group: str, record: StoredRecord, attempts: int) -> StoredRecord:
        props = {**record.properties, codec.DELIVERY_ATTEMPTS: str(attempts)}
        props.setdefault(codec.REAL_TOPIC, record.topic)
        return StoredRecord(dlq_topic(group), 0, record.body, props)

    def dlq_depth(self) -> dict[str, int]:
        """Messages dead-lettered per consumer group (each DLQ's length; of a deleted group,
        those dead-lettered since, if any)."""
        depths = {topic[len(DLQ_PREFIX):]: self.store.queue_max_offset(topic, 0)
                  for topic in self.store.queues() if topic.startswith(DLQ_PREFIX)}
        floors = self.dlq_floors
        return {group: depth - floors.get(group, 0) for group, depth in depths.items()
                if depth > floors.get(group, 0)}

    def list_dlq(self, group: str, max_messages: int, max_bytes: int | None = None) -> list[StoredRecord]:
        """The newest ``max_messages`` dead letters of a group that fit in ``max_bytes`` of
        record size (at least one), oldest first."""
        topic = dlq_topic(group)
        end = self.store.queue_max_offset(topic, 0)
        start = max(self.store.queue_min_offset(topic, 0), self.dlq_floors.get(group, 0), end - max_messages)
        newest_first = (record for offset in range(end - 1, start - 1, -1)
                        for record in self.store.read_queue(topic, 0, offset, 1))
        return fitting(newest_first, lambda record: record.size, max_bytes)[::-1]

    def resend_dlq(self, group: str, message_id: str) -> StoredRecord:
        """Send a dead letter to the group's retry topic (only that group gets it again)."""
        topic = dlq_topic(group)
        for offset in reversed(self.store.lookup_message_id(message_id)):
            record = self.store.get(offset)
            if record.topic == topic and record.queue_offset >= self.dlq_floors.get(group, 0):
                props = codec.without(record.properties, codec.DELIVERY_ATTEMPTS)
                stored = self.store.put(StoredRecord(retry_topic(group), 0, record.body, props))
                log.info("message %s re-sent from the DLQ to group %s", message_id, group)
                return stored
        raise UnknownTopicError(f"message {message_id!r} is not in the DLQ of group {group!r}")

    # -- acking ---------------------------------------------------------------------------
    def _lookup(self, group: str, handle: str, now: int) -> tuple[ProgressKey, QueueProgress, Delivery]:
        """The delivery ``handle`` names, if its receipt is current at ``now`` (epoch ms);
        ``UnknownReceiptError`` otherwise."""
        try:
            topic, stored_topic, queue_id, offset, receipt = handle.split("|")
            key = (group, topic, stored_topic, int(queue_id))
            progress = self.progress[key]
            delivery = progress.pending.get(int(offset)) or self._read_held(key, progress, int(offset))
        except (ValueError, KeyError):
            raise UnknownReceiptError(f"unknown receipt handle {handle!r} for group {group!r}") from None
        if delivery.receipt != receipt:
            raise UnknownReceiptError(
                f"stale receipt handle {handle!r}: the message was delivered again since"
            )
        if now > delivery.expires_at_ms:
            raise UnknownReceiptError(
                f"expired receipt handle {handle!r}: its invisible duration is over"
            )
        return key, progress, delivery

    def _read_held(self, key: ProgressKey, progress: QueueProgress, offset: int) -> Delivery:
        """The delivery of a message in flight since before the broker started, its record
        read now (no receive has read it yet); ``KeyError`` when there is none."""
        if offset in progress.held:
            for record in self.store.read_queue(key[2], key[3], offset, 1):
                if record.queue_offset == offset:
                    progress.take(record, ReadAhead(0, 0))
                    return progress.pending[offset]
        raise KeyError(offset)

    def ack(self, group: str, handle: str) -> None:
        """Mark a delivered message done for the group (durable per ``sync_consumer_progress``)."""
        outcome = self.ack_many(group, [handle])[0]
        if outcome is not None:
            raise outcome

    def ack_many(self, group: str, handles: list[str]) -> list[UnknownReceiptError | None]:
        """Mark many delivered messages done with one lock and one write; per handle, None
        or the ``UnknownReceiptError`` that refused it (a handle repeated in the batch is
        refused the second time: its message is done)."""
        outcomes: list[UnknownReceiptError | None] = []
        events: list[Event] = []
        acked: list[tuple[ProgressKey, Delivery]] = []
        with self.lock:
            now = self.clock.time_ms()
            for handle in handles:
                try:
                    key, progress, delivery = self._lookup(group, handle, now)
                except UnknownReceiptError as exc:
                    outcomes.append(exc)
                    continue
                progress.mark_done(delivery.record.queue_offset)
                acked.append((key, delivery))
                events.append(_event(EVENT_ACKED, group, key[1], key, delivery, now))
                outcomes.append(None)
            self._unstored += acked
        if events:
            self._store(events, acked)
            self.notify()  # the next message of a FIFO group may be deliverable now
        return outcomes

    def dead_letter(self, group: str, handle: str) -> None:
        """Move a received message to the group's DLQ now (RocketMQ 5's
        ForwardMessageToDeadLetterQueue), as the max-attempts path does: done for the group,
        its copy in ``%DLQ%<group>`` with the attempts so far, durable before this returns.
        Repeated with a receipt whose message is in the group's DLQ, nothing more happens;
        ``UnknownReceiptError`` for any other receipt that is not in flight (unknown, stale,
        expired, acked, another group's)."""
        with self.lock:
            now = self.clock.time_ms()
            try:
                key, progress, delivery = self._lookup(group, handle, now)
            except UnknownReceiptError:
                if self._dead_lettered(group, handle):
                    return
                raise
            progress.mark_done(delivery.record.queue_offset)
            event = _event(EVENT_DEAD, group, key[1], key, delivery, now)
            self._unstored.append((key, delivery))
        self._store([event], [(key, delivery)], dead_letters_of=group)
        self.notify()  # the next message of its FIFO group may be deliverable now

    def _dead_lettered(self, group: str, handle: str) -> bool:
        """Whether the message a receipt of ``group`` names is in the group's DLQ (read from
        the store's message id index: nothing about past receipts is kept in memory)."""
        try:
            topic, stored_topic, queue_id, offset, _ = handle.split("|")
            if (group, topic, stored_topic, int(queue_id)) not in self.progress:
                return False
            records = self.store.read_queue(stored_topic, int(queue_id), int(offset), 1)
        except (ValueError, KeyError):
            return False
        return any(record.queue_offset == int(offset) and self.store.stored_after(
            record.properties.get(PROPERTY_MESSAGE_ID, ""), record.commit_log_offset, (dlq_topic(group),))
            for record in records)

    def change_invisible_duration(self, group: str, handle: str, invisible_ms: int, keep_receipt: bool = False) -> str:
        """Move a receipt's visibility to now + ``invisible_ms``; returns the new handle, or
        ``handle`` itself with ``keep_receipt`` (stored as a delivery of the same attempt, so
        a restart keeps it)."""
        with self.lock:
            now = self.clock.time_ms()
            key, _, delivery = self._lookup(group, handle, now)
            before = delivery.held()
            if not keep_receipt:
                delivery.receipt = new_receipt()
            delivery.delivered_at_ms = now
            delivery.visible_at_ms = delivery.expires_at_ms = now + invisible_ms
            event = _event(EVENT_DELIVERED, group, key[1], key, delivery, now)
            renewed = self._receipt_handle(key, delivery)

        def undo() -> None:  # refused: the receipt and its times stay as they were
            if delivery.receipt == event.receipt and delivery.delivered_at_ms == now:
                delivery.restore(before)

        self._store([event], undo=undo)
        return renewed

    # -- admin ----------------------------------------------------------------------------
    def delete_group(self, group: str) -> DeletedGroup:
        """Forget ``group`` (``BrokerAPI.delete_group``): its progress dropped and its floors
        kept, by ``EVENT_DELETED`` events."""
        dlq = dlq_topic(group)
        with self.lock:
            keys = [key for key in self.progress if key[0] == group]
            dlq_end, dlq_floor = self.store.queue_max_offset(dlq, 0), self.dlq_floors.get(group, 0)
            if not keys and dlq_end <= dlq_floor:
                raise UnknownGroupError(f"consumer group {group!r} has no progress and no dead letters here")
            now = self.clock.time_ms()
            events = [Event(EVENT_DELETED, group, key[1], key[2], key[3], self.progress[key].floor, 0, "", now)
                      for key in keys]
            events.append(Event(EVENT_DELETED, group, "", dlq, 0, max(dlq_end, dlq_floor), 0, "", now))
            self._claim(group)
        self._commit(group, events)
        deleted = DeletedGroup(group, len(keys), max(dlq_end - dlq_floor, 0))
        log.info("consumer group %s deleted: progress in %d queue(s) and %d dead letter(s) forgotten",
                 group, deleted.queues, deleted.dead_letters)
        return deleted

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None) -> GroupReset:
        """Move ``group`` in each queue of ``topic`` to the first message stored at or after
        ``timestamp_ms`` (None: past the last one stored) (``BrokerAPI.reset_group``), by
        ``EVENT_RESET`` events; its retry queue is left as it is."""
        queues = range(self._queue_count(topic))
        with self.lock:
            floors = [self.store.queue_max_offset(topic, q) if timestamp_ms is None
                      else self.store.offset_for_timestamp(topic, q, timestamp_ms) for q in queues]
            now = self.clock.time_ms()
            events = [Event(EVENT_RESET, group, topic, topic, q, floor, 0, "", now)
                      for q, floor in zip(queues, floors, strict=True)]
            self._claim(group)
        self._commit(group, events)
        reset = GroupReset(group, topic, len(floors), sum(
            max(self.store.queue_max_offset(topic, q) - floor, 0) for q, floor in zip(queues, floors, strict=True)))
        log.info("consumer group %s reset on topic %s to %s: %d message(s) to deliver", group, topic,
                 "the end" if timestamp_ms is None else f"{timestamp_ms} ms", reset.lag)
        return reset

    def _claim(self, group: str) -> None:
        """Under the lock, the last step before a deletion or a reset of ``group`` is stored
        (``_commit``, which must follow): ``GroupInUseError``
        while a receive of the group runs or a message it received is in flight; else its
        receives are refused until ``_commit`` applied the change, so none of its events can
        land on either side of the change's."""
        if self._receiving.get(group):
            raise GroupInUseError(f"consumer group {group!r} has a receive running: stop its consumers first")
        now = self.clock.time_ms()
        in_flight = sum(_in_flight(progress, now) for key, progress in self.progress.items() if key[0] == group)
        in_flight += sum(1 for key, _ in self._unstored if key[0] == group)
        if in_flight:
            raise GroupInUseError(f"consumer group {group!r} has {in_flight} message(s) in flight: stop its "
                                  "consumers and let them be acked or their invisible duration end first")
        self._changing.add(group)

    def _commit(self, group: str, events: list[Event]) -> None:
        """Store the change ``_claim`` let through (``events``) durably, then apply it; the
        group's receives are taken again after, whatever happened."""
        try:
            self._persist(events, durable=True)
            with self.lock:
                for event in events:
                    self._apply_change(event)
        finally:
            with self.lock:
                self._changing.discard(group)

    def _apply_change(self, event: Event) -> None:
        """Under the lock: what an ``EVENT_DELETED`` or ``EVENT_RESET`` says, stored or replayed."""
        if not event.topic:  # a deletion's DLQ floor
            self.dlq_floors[event.group] = event.queue_offset
            return
        key = (event.group, event.topic, event.stored_topic, event.queue_id)
        if event.kind == EVENT_RESET:
            self.resume_at.pop(key, None)
            self.progress[key] = QueueProgress(event.queue_offset, event.queue_offset)
        else:
            self.progress.pop(key, None)
            self.resume_at[key] = event.queue_offset

    def _queue_lags(self) -> Iterator[tuple[ProgressKey, int, QueueProgress | None]]:
        """Under the lock: every stored queue of each (group, topic) that has progress, with
        its lag; a queue the group has not read yet counts from its start, or, the group
        deleted and back, from where it stopped there."""
        for group, topic in sorted({(key[0], key[1]) for key in self.progress}):
            for stored_topic, queue_id in self._sources(group, topic):
                key = (group, topic, stored_topic, queue_id)
                progress = self.progress.get(key)
                end = self.store.queue_max_offset(stored_topic, queue_id)
                if progress is None:
                    start = max(self.store.queue_min_offset(stored_topic, queue_id), self.resume_at.get(key, 0))
                    yield key, max(end - start, 0), None
                else:
                    yield key, max(end - progress.floor - len(progress.done_above), 0), progress

    def queues(self) -> list[ConsumerQueue]:
        """Each group's lag and messages in flight per stored queue, by group and topic;
        costs O(groups' queues + the deliveries they hold)."""
        now = self.clock.time_ms()
        with self.lock:
            return [ConsumerQueue(*key, lag, 0 if progress is None else _in_flight(progress, now))
                    for key, lag, progress in self._queue_lags()]

    def summary(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Per (group, subscribed topic): messages not yet done (lag) and those received
        and still within their invisible duration (in flight); the sums of ``queues()``."""
        result: dict[tuple[str, str], tuple[int, int]] = {}
        for queue in self.queues():
            lag, held = result.get((queue.group, queue.topic), (0, 0))
            result[queue.group, queue.topic] = (lag + queue.lag, held + queue.in_flight)
        return result

    def lag(self) -> dict[str, dict[str, int]]:
        """Messages not yet done, per group and subscribed topic."""
        result: dict[str, dict[str, int]] = {}
        for (group, topic), (lag, _) in self.summary().items():
            result.setdefault(group, {})[topic] = lag
        return result
