"""A seeded transaction workload against the ``EmbeddedBroker`` on a simulated disk, with
a simulated clock and a fenced transaction_log, and its checker.

The broker core runs in-process (no sockets) on ``SimulatedDisk`` (every file of the store
and the broker's state files go through it) with a ``SimClock`` (``StoreConfig.clock``):
the schedule advances the time and runs the broker's timers (``run_timers``: check
rounds, parking, snapshots) itself; no thread of the broker acts on its own.

Clients are producers of the outbox kind, on the project's own transaction_log code
(``outbox.integrations.sqlalchemy.recorder``, the fence rule of ``outbox.transaction_log``)
over an in-memory SQLite database: a client's local transaction inserts its COMMITTED row
first, sends 1 to 3 half messages, commits or rolls back (a step of the schedule), then
ENDs, or never does (it died); some repeat their END, or send the opposite one. Half of
the transactions (by their id, not by the schedule's random draws) END ``oneway``, as the
outbox's producers do: written with no fsync of its own, such an END counts as kept only
once a later call's fsync (or a clean close) covered it, and is lost like a cut one before
that. Check-backs
are queued by the broker's checker and answered at a step of the schedule with
``fence_and_read`` (whose fence is a commit of the database): UNKNOWN while the client's
local transaction holds its row, else what the row says. A consumer group receives and
acks. Process crashes and power losses fall at any step, and inside calls (a crash armed
at the n-th next change to the disk), recovery included. In the ``TIMED`` profiles clients
also send delayed messages (delay levels of 1 s to 2 h), the clock also jumps by minutes
and hours, and the broker's timers run retention (messages expire after half an hour; the
simulated disk keeps each file's mtime by the simulated clock). In the ``DELAYS`` profile
a third of the half messages carry a delay level too (its delay counts from the commit),
and a third of the delayed messages are recalled (at the next move of the clock or the
one after, before or after they are due); which follows from their numbers, not from the
schedule's random draws. In the ``CONSUMING`` profile the consumer group keeps receipts past
its receives and settles them at later steps: a late ack, a dead-lettering, or a
ChangeInvisibleDuration (keeping the receipt or not); messages left alone run out of their
three attempts into the group's DLQ. The ``FIFO`` profile is ``CONSUMING`` with the half
messages in message groups.

After every recovery the checker holds the broker to a reference model:

* the broker reopens;
* every transaction with an acknowledged half message is known (pending, parked or
  resolved); an END or check answer that returned is kept; one that failed or was cut
  may have been applied, and nothing else resolves a transaction;
* a transaction is committed only if its transaction_log row is COMMITTED, rolled back
  only if it is not (no END, client's or check-back's, decides against the fenced row);
* a fresh consumer group reads every message of every committed transaction exactly
  once, with its body, and no message of any other (the loss ledger stays empty: no
  media fault is injected); the consumer group of the schedule never receives a message
  of a transaction that is not committed, nor (at any step) a message again once its ack
  returned, or before the invisible time of its last delivery ended (crashes and power
  losses in between), and a message's delivery attempts only go up;
* a repeated END answers the resolution; the opposite one is refused;
* (``CONSUMING``) a receipt is current until the invisible time its receive, or its last
  change that returned, gave it, and a later delivery replaces it: a call with a current
  one is taken, any other refused; a change answers the receipt it kept, or a new one; no
  delivery before a change's invisible time ended, none once a dead-lettering returned,
  none past the last attempt; the group's DLQ holds every message whose dead-lettering
  returned, each once, and none whose ack returned;
* (``FIFO``) every group gets a message group's messages one at a time: the schedule's
  group never receives a message while an earlier one of its message group in its queue
  is not done for it (acked, dead-lettered, or in its DLQ; an ack the broker refused
  leaves it in flight);
* a delayed message is never delivered before it is due; a fresh group reads it at most
  once, and once a run of the timers at or after its due time has returned, exactly once;
* a delayed half message is never delivered before its transaction's first END or check
  answer for COMMIT plus its delay, nor in a transaction that is not committed; once its
  commit is known durable and a later run of the timers at or after its last possible due
  time (the last COMMIT asked before, plus the delay) has returned, a fresh group reads it
  exactly once;
* a recall that returned is never followed by a delivery, and never comes after one; a
  recall refused as too late comes after a run of the timers at or after the message's due
  time, and that message is read; a recall repeated answers the same message id;
* retention excuses only what it may have taken: a message written to its topic (a
  commit's copy, a delayed message's delivery, no earlier than the END or the due time)
  before the last cutoff may be gone, and a transaction whose records were all written
  before it may be unknown; nothing else.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from broker_embedded.broker.config import BrokerConfig
from broker_embedded.broker.facade import EmbeddedBroker
from broker_embedded.errors import (
    BrokerClosedError,
    BrokerError,
    InvalidMessageError,
    TransactionConflictError,
    UnknownReceiptError,
    UnknownTransactionError,
)
from broker_embedded.message import (
    DELAY_LEVELS_S,
    CheckRequest,
    Message,
    ReceivedMessage,
    Resolution,
    TransactionState,
)
from broker_embedded.store.config import StoreConfig
from outbox.integrations.sqlalchemy.recorder import RECORDER
from outbox.integrations.sqlalchemy.tables import transaction_log
from tests.sim.clock import SimClock
from tests.sim.crash import abandon
from tests.sim.disk import Faults, PowerCut, SimulatedDisk
from tests.sim.workload import Result, body_of

#: The fault profiles a seed runs with (as the store workload's).
PROFILES: dict[str, Faults] = {
    "power": Faults(),
    "io": Faults(write_error=0.03, fsync_error=0.03),
    "clock": Faults(),
    "delays": Faults(),
    "consume": Faults(write_error=0.02, fsync_error=0.02),
    "fifo": Faults(write_error=0.02, fsync_error=0.02),
}
#: Profiles whose clients also send delayed messages, whose clock also jumps by up to hours
#: and whose broker runs retention (``RETENTION_HOURS``; the others keep it off, so their
#: seeds replay the schedules they always had).
TIMED = frozenset({"clock", "delays"})
#: Profiles whose half messages also carry delay levels and whose delayed messages are also
#: recalled (``clock`` keeps the schedules it had: its seeds in ``REGRESSIONS`` replay).
DELAYS = frozenset({"delays"})
#: Profiles whose consumer group also keeps messages past their receive: acks them later
#: (maybe too late), changes their invisible time (keeping the receipt or not), dead-letters
#: them, or lets them come back until the DLQ takes them; with ``CONSUMING_ATTEMPTS`` and ``CONSUMING_BACKOFF_S``.
CONSUMING = frozenset({"consume", "fifo"})
#: Profiles whose half messages belong to ``FIFO_GROUPS`` message groups (by their number),
#: so every consumer group gets each message group's messages one at a time, in queue order.
FIFO = frozenset({"fifo"})
FIFO_GROUPS = 3
#: Their broker's retries: a message goes to the DLQ after its third delivery, and comes
#: back a second or four after its invisible time.
CONSUMING_ATTEMPTS = 3
CONSUMING_BACKOFF_S = (1.0, 4.0)
#: Their receives' invisible time, and the durations their ChangeInvisibleDuration asks.
CONSUMING_INVISIBLE_S = 8.0
CHANGED_INVISIBLE_S = (0.5, 3.0, 10.0, 40.0)
#: Their store: messages expire after half an hour, in segments small enough that a
#: schedule fills several.
TIMED_STORE = {"retention_hours": 0.5, "segment_size": 16 * 1024}
DATA_DIR = Path("/sim/broker")
TOPIC = "orders"
GROUPS = ("pg-a", "pg-b")
WORKERS = "workers"
#: The invisible duration of the schedule's consumer group's receives.
WORKERS_INVISIBLE_S = 60.0
CONFIG = BrokerConfig(
    store=StoreConfig(
        segment_size=256 * 1024,
        consume_queue_file_entries=16,
        index_slots=64,
        index_entries=48,
        scrub_bytes_per_s=0,
        checkpoint_interval_s=1e9,
        async_flush_interval_s=1e9,
        retention_hours=1e6,  # off but in the TIMED profiles
    ),
    transaction_timeout_s=6.0,
    check_interval_s=5.0,
    check_max=4,
    service_tick_s=1e6,  # the service thread never acts: the schedule runs the timers
    snapshot_interval_s=30.0,
    sync_consumer_progress=True,
)
_DATABASES = itertools.count()


class SimulationFailure(AssertionError):
    """The broker broke a promise under a seed's schedule."""


class CheckQueue:
    """The broker's checker: check-backs wait here for a step of the schedule to answer."""

    def __init__(self) -> None:
        self.requests: list[CheckRequest] = []

    def request_check(self, request: CheckRequest) -> bool:
        self.requests.append(request)
        return True


class TransactionLog:
    """The clients' database: one in-memory SQLite database (shared cache, so each client's
    local transaction and each check are connections of their own), written by the
    project's SQLAlchemy recorder. The shared cache locks a table, not a row, for a
    writer: one client's local transaction is open at a time (a check-back meanwhile
    answers UNKNOWN for any transaction, as a lock timeout would)."""

    def __init__(self) -> None:
        url = f"sqlite:///file:sim-txlog-{next(_DATABASES)}?mode=memory&cache=shared&uri=true"
        self.engine = sa.create_engine(url, poolclass=NullPool)
        self._keeper = self.engine.connect()  # the database lives while a connection does
        transaction_log.create(self._keeper)
        self._keeper.commit()
        self._reader = self.engine.connect()
        # the model's own reads may not wait for a client's open local transaction
        self._reader.exec_driver_sql("PRAGMA read_uncommitted = 1")

    def begin(self, transaction_id: str, group: str) -> sa.Connection:
        """A client's local transaction with its COMMITTED row inserted first (a new id: no
        check's fence can be there yet)."""
        connection = self.engine.connect()
        connection.begin()
        RECORDER.record_committed(connection, transaction_id, group)
        return connection

    def check(self, transaction_id: str, group: str) -> Resolution:
        """A check-back's answer: the fence, then the row. A client's open local transaction
        holds the row: SQLite's shared cache says ``database table is locked`` at once,
        which is the lock timeout expiring (UNKNOWN) of a real database."""
        try:
            return RECORDER.fence_and_read(self.engine, transaction_id, group, lock_timeout_ms=0)
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            return Resolution.UNKNOWN

    def row(self, transaction_id: str) -> str | None:
        """The row's state as last committed (read outside every transaction)."""
        found = self._reader.execute(sa.select(transaction_log.c.state).where(
            transaction_log.c.transaction_id == transaction_id)).first()
        self._reader.rollback()
        return None if found is None else str(found[0])

    def close(self) -> None:
        self._reader.close()
        self._keeper.close()
        self.engine.dispose()


@dataclass
class Tx:
    """A client's transaction, as the model knows it."""

    transaction_id: str
    group: str
    #: Half messages whose send returned (number -> body size), and those cut or failed.
    halves: dict[int, int] = field(default_factory=dict)
    maybe: dict[int, int] = field(default_factory=dict)
    #: The client's local transaction: "open" (its connection), "committed", "rolled back",
    #: or "fenced" (rolled back, and a check-back's fence wrote its ROLLED_BACK row).
    db: str = "open"
    connection: sa.Connection | None = None
    #: The broker's resolution, once an END that returned or a recovery showed it.
    decided: TransactionState | None = None
    #: Resolutions an END that failed or was cut may have applied.
    attempted: set[TransactionState] = field(default_factory=set)
    #: The client ENDs once its local transaction ends (False: it died first).
    ends: bool = True
    ended: bool = False
    #: The clock's time at the first END or check answer that asked for COMMIT: its
    #: messages reach their topic no earlier (retention may take them once it is past).
    commit_ms: int | None = None
    #: ... and at the last one asked before the model knew it committed: the commit's time
    #: (from which its delayed messages count) is between the two.
    last_commit_ms: int | None = None
    #: Half messages with a delay level (number -> the delay, ms), counted from the commit.
    delays: dict[int, int] = field(default_factory=dict)
    #: Runs of the timers started when the model learnt it committed (durable): a run
    #: that started before may have looked for due messages before the commit was there.
    committed_after_runs: int = 0
    #: The clock's time at its last call that may have written a record (a half, an END):
    #: once retention's cutoff is past it, the broker may have forgotten the transaction.
    touched_ms: int | None = None

    @property
    def final(self) -> TransactionState | None:
        """The resolution the client's END states (from its local transaction)."""
        if self.db == "committed":
            return TransactionState.COMMITTED
        if self.db in ("rolled back", "fenced"):
            return TransactionState.ROLLED_BACK
        return None


@dataclass
class Delayed:
    """A delayed message a client sent (no transaction), as the model knows it."""

    size: int
    #: When it is due: never delivered before, written to its topic no earlier.
    due_ms: int
    #: Its send returned (else it failed or was cut: it may be there).
    acked: bool = False
    #: The recall handle its send returned; in how many moves of the clock a client
    #: recalls it (at the start of that move; 0: never), and how that went: "" (not yet),
    #: "recalled", "maybe" (the call failed or was cut), "too late" (refused: delivered).
    handle: str | None = None
    recall_in: int = 0
    recall: str = ""
    #: A group received it.
    delivered: bool = False


_RESOLUTION = {TransactionState.COMMITTED: Resolution.COMMIT, TransactionState.ROLLED_BACK: Resolution.ROLLBACK}
_STATE = {Resolution.COMMIT: TransactionState.COMMITTED, Resolution.ROLLBACK: TransactionState.ROLLED_BACK}
_CUT = object()


class TxSimulation:
    """The broker on ``disk``, the clients, their database, the model, and the steps of a
    schedule. ``rng`` decides what a step leaves open (how a failed call ends, a crash
    inside a recovery); the steps' arguments are the driver's."""

    def __init__(self, rng: random.Random, disk: SimulatedDisk, timed: bool = False, delays: bool = False,
                 consuming: bool = False, fifo: bool = False) -> None:
        self.rng = rng
        self.disk = disk
        self.clock = SimClock()
        disk.clock = self.clock
        store = dataclasses.replace(CONFIG.store, filesystem=disk, clock=self.clock, **(TIMED_STORE if timed else {}))
        self.config = dataclasses.replace(CONFIG, store=store)
        if consuming:
            self.config = dataclasses.replace(self.config, max_delivery_attempts=CONSUMING_ATTEMPTS,
                                              retry_backoff_s=CONSUMING_BACKOFF_S)
        #: The consumer group keeps receipts (the ``CONSUMING`` profiles), received for this long.
        self.consuming = consuming
        self.workers_invisible_s = CONSUMING_INVISIBLE_S if consuming else WORKERS_INVISIBLE_S
        self.retention_ms = int(store.retention_hours * 3_600_000)
        #: Messages written to their topic before this time may be gone (retention ran,
        #: or may have, with this cutoff); None: it never ran.
        self.expired_before: int | None = None
        #: Half messages with delay levels, and recalls (the ``DELAYS`` profiles).
        self.delays = delays
        #: The clock's time at the last run of the timers that returned: every delayed
        #: message due by then has been delivered (a delivery is a synced put: it outlives
        #: crashes); which run that was (they count from 1 as they start); the time of the
        #: last one started (returned or not).
        self.timers_ran_at: int | None = None
        self.timer_runs = 0
        self.last_returned_run = 0
        self.timers_tried_at: int | None = None
        self.delayed: dict[int, Delayed] = {}  # message number -> a delayed message
        #: Oneway ENDs an fsync covered since they were answered (``EmbeddedBroker.when_durable``),
        #: kept from now on: decided by the model once the call that made them durable returns.
        self.covered_ends: list[tuple[Tx, TransactionState, str]] = []
        self.database = TransactionLog()
        self.checks = CheckQueue()
        self.steps: list[str] = []
        self.txs: dict[str, Tx] = {}
        self.tx_of: dict[int, Tx] = {}  # message number -> its transaction
        self.next_number = 0
        self.fresh_groups = itertools.count()
        #: The schedule's consumer group: per message, the attempt and invisible-until time of
        #: its last delivery that returned, and the messages whose ack returned accepted.
        self.worker_deliveries: dict[str, tuple[int, int]] = {}
        self.worker_acked: set[str] = set()
        #: Its receipts kept past the receive (``CONSUMING``), by message id: the handle and
        #: when it expires, as the receive (or the ChangeInvisibleDuration) that returned gave
        #: them. One whose settling failed or was cut is dropped (it may have been applied),
        #: and so is every one when a receive failed or was cut (it may have delivered a
        #: message again, with a new receipt).
        self.worker_receipts: dict[str, tuple[str, int]] = {}
        #: Messages whose dead-lettering returned: in the group's DLQ, never delivered again.
        self.worker_dead: set[str] = set()
        #: Messages an ack that failed or was cut may have settled.
        self.worker_maybe_acked: set[str] = set()
        #: Half messages in message groups (the ``FIFO`` profiles); the broker's opens so
        #: far; per message, its queue and offset once a delivery told them; the messages of
        #: each message group whose place is known; the messages whose ack failed (not cut)
        #: in which open: the broker refused it, so it stays in flight until a restart.
        self.fifo = fifo
        self.opens = 0
        self.places: dict[str, tuple[int, int]] = {}
        self.placed: dict[str, set[str]] = {}
        self.refused_acks: dict[str, int] = {}
        #: How many deliveries to the schedule's group came after an earlier message of
        #: their message group in their queue (what the FIFO check had to look at).
        self.fifo_followers = 0
        self.broker: EmbeddedBroker | None = None

    def step(self, text: str) -> None:
        self.steps.append(text)

    def fail(self, text: str) -> NoReturn:
        raise SimulationFailure(text)

    # -- clients --------------------------------------------------------------------------
    def begin(self, group: str, size: int, crash_at: int | None) -> None:
        """A new client transaction: its local transaction and row, then a half message."""
        tx = Tx(f"tx{len(self.txs)}", group)
        self.txs[tx.transaction_id] = tx
        tx.connection = self.database.begin(tx.transaction_id, group)
        self.step(f"{tx.transaction_id} ({group}): local transaction begins")
        self.send_half(tx, size, crash_at)

    def send_half(self, tx: Tx, size: int, crash_at: int | None) -> None:
        """Send one more half message of ``tx`` (its local transaction open)."""
        number = self.next_number
        self.next_number += 1
        self.tx_of[number] = tx
        tx.maybe[number] = size
        level = _half_delay_level(number) if self.delays else 0
        message = Message(TOPIC, body_of(number, size), message_id=f"m{number}", delay_level=level,
                          message_group=_message_group(number) if self.fifo else None)
        what = f"{tx.transaction_id}: half m{number} ({size} bytes)"
        if level:
            tx.delays[number] = DELAY_LEVELS_S[level - 1] * 1000
            what += f" (level {level}: due {DELAY_LEVELS_S[level - 1]} s after the commit)"
        broker = self.broker
        assert broker is not None
        tx.touched_ms = self.clock.time_ms()
        outcome = self.attempt(what, lambda: broker.send_half(
            message, producer_group=tx.group, transaction_id=tx.transaction_id), crash_at)
        if isinstance(outcome, TransactionConflictError):
            if self.broker is None or self.broker.transaction_state(tx.transaction_id) is not TransactionState.PARKED:
                self.fail(f"{what}: refused, though its transaction is open and not parked: {outcome}")
            self.step(f"{what}: refused (parked after unanswered checks)")
            return
        if not isinstance(outcome, BaseException) and outcome is not _CUT:
            tx.halves[number] = tx.maybe.pop(number)
            self.step(f"{what}: stored")

    def end_local(self, tx: Tx, commit: bool, ends: bool) -> None:
        """The client's local transaction commits or rolls back (a commit of the database);
        ``ends``: the client will send its END (else it dies now)."""
        assert tx.connection is not None
        if commit:
            tx.connection.commit()
        else:
            tx.connection.rollback()
        tx.connection.close()
        tx.connection = None
        tx.db = "committed" if commit else "rolled back"
        tx.ends = ends
        self.step(f"{tx.transaction_id}: local transaction {tx.db}{'' if ends else '; the client dies'}")

    def end(self, tx: Tx, crash_at: int | None, opposite: bool = False) -> None:
        """The client's END (``opposite``: the other resolution, after its own)."""
        final = tx.final
        assert final is not None
        if opposite:
            final = TransactionState.ROLLED_BACK if final is TransactionState.COMMITTED else TransactionState.COMMITTED
        tx.ended = True
        self._end(tx, _RESOLUTION[final], crash_at, from_check=False, opposite=opposite)

    def send_delayed(self, level: int, size: int, crash_at: int | None) -> None:
        """A client sends a message with delay level ``level`` (no transaction)."""
        number = self.next_number
        self.next_number += 1
        delayed = self.delayed[number] = Delayed(size, self.clock.time_ms() + DELAY_LEVELS_S[level - 1] * 1000)
        message = Message(TOPIC, body_of(number, size), message_id=f"m{number}", delay_level=level)
        what = f"delayed m{number} (level {level}, due in {DELAY_LEVELS_S[level - 1]} s)"
        broker = self.broker
        assert broker is not None
        outcome = self.attempt(what, lambda: broker.send(message), crash_at)
        if not isinstance(outcome, BaseException) and outcome is not _CUT:
            delayed.acked = True
            delayed.handle = outcome.recall_handle
            delayed.recall_in = _recall_in(number) if self.delays else 0
            if delayed.handle is None:
                self.fail(f"{what}: stored with no recall handle")
            self.step(f"{what}: stored{', to be recalled' if delayed.recall_in else ''}")

    def recall(self, number: int, delayed: Delayed) -> None:
        """A client recalls delayed ``m{number}`` (its crash point and a repeat follow from
        its number): never delivered once that returned; refused once it was delivered."""
        broker = self.broker
        assert broker is not None and delayed.handle is not None
        handle = delayed.handle
        early_s = (delayed.due_ms - self.clock.time_ms()) / 1000
        what = f"recall of m{number} ({early_s:g} s before it is due)" if early_s > 0 else \
            f"recall of m{number} ({-early_s:g} s after it was due)"
        crash_at = 1 + number % 4 if number % 5 == 0 else None
        outcome = self.attempt(what, lambda: broker.recall(TOPIC, handle), crash_at)
        if isinstance(outcome, InvalidMessageError):
            if self.timers_tried_at is None or self.timers_tried_at < delayed.due_ms:
                self.fail(f"{what}: refused, though no run of the timers was due to deliver it: {outcome}")
            delayed.recall = "too late"
            self.step(f"{what}: refused (delivered already)")
            return
        if outcome is _CUT or isinstance(outcome, BaseException):
            delayed.recall = "maybe"
            return
        if outcome != f"m{number}":
            self.fail(f"{what}: answered {outcome!r}")
        if delayed.delivered:
            self.fail(f"{what}: recalled, though it was delivered")
        delayed.recall = "recalled"
        self.step(f"{what}: recalled")
        if number % 2 == 0:  # once more: the same answer
            again = self.attempt(f"{what}, again", lambda: broker.recall(TOPIC, handle), None)
            if isinstance(again, InvalidMessageError) or (
                    not isinstance(again, BaseException) and again is not _CUT and again != f"m{number}"):
                self.fail(f"{what}, again: answered {again!r}")

    def _end(self, tx: Tx, resolution: Resolution, crash_at: int | None, *, from_check: bool,
             opposite: bool = False) -> None:
        broker = self.broker
        assert broker is not None
        who = "check answer" if from_check else ("opposite END" if opposite else "END")
        what = f"{tx.transaction_id}: {who} {resolution.value}"
        wanted = _STATE.get(resolution)
        if wanted is not None and not opposite:
            tx.attempted.add(wanted)
        if wanted is TransactionState.COMMITTED and not opposite:
            if tx.commit_ms is None:
                tx.commit_ms = self.clock.time_ms()
            if tx.decided is None:
                tx.last_commit_ms = self.clock.time_ms()
        now = self.clock.time_ms()
        oneway = not from_check and zlib.crc32(tx.transaction_id.encode()) % 2 == 0
        outcome = self.attempt(what, lambda: broker.end_transaction(
            tx.transaction_id, resolution, producer_group=tx.group, from_check=from_check, oneway=oneway), crash_at)
        if outcome is _CUT or (isinstance(outcome, BaseException) and not isinstance(
                outcome, UnknownTransactionError | TransactionConflictError)) or getattr(outcome, "applied", False):
            tx.touched_ms = now  # it may have written the transaction's records
        if outcome is _CUT:
            return
        if isinstance(outcome, UnknownTransactionError):
            if tx.halves and not self.expired(tx.touched_ms):
                self.fail(f"{what}: the broker does not know {tx.transaction_id}, which has stored half "
                          f"messages {sorted(tx.halves)}: {outcome}")
            self.step(f"{what}: unknown (no half message stored)")
            return
        if isinstance(outcome, TransactionConflictError) and str(outcome).endswith("failed; try again"):
            # the same resolution, sent a moment before, was held for the next fsync and dropped
            # when its write failed: the transaction stays pending, this END decided nothing
            self.step(f"{what}: refused for now (a concurrent {resolution.value} failed)")
            return
        if isinstance(outcome, TransactionConflictError):
            if not opposite:
                self.fail(f"{what}: refused, against the fenced row (the model: {tx.decided}): {outcome}")
            self.step(f"{what}: refused")
            return
        if isinstance(outcome, BaseException):
            return  # a failed call (logged by attempt)
        state = outcome.state
        if wanted is None:  # UNKNOWN: nothing changes
            self.step(f"{what}: {state.value}")
            return
        if opposite:
            self.fail(f"{what}: the opposite END was not refused ({tx.decided}): {outcome}")
        if state is not wanted:
            self.fail(f"{what}: answered {state.value}")
        if oneway and outcome.applied and self.broker is not None and self.broker.unsynced:
            self.step(f"{what}: {state.value} (applied oneway, its fsync to come)")
            self.broker.when_durable(lambda: self.covered_ends.append((tx, state, what)))
            return
        self.decide(tx, state, what)
        self.step(f"{what}: {state.value}{' (applied)' if outcome.applied else ''}")

    def _keep_covered_ends(self) -> None:
        """The oneway ENDs that an fsync covered are kept from now on."""
        ends, self.covered_ends = self.covered_ends, []
        for tx, state, what in ends:
            self.decide(tx, state, f"{what}, made durable by a later fsync")

    def decide(self, tx: Tx, state: TransactionState, why: str) -> None:
        """The broker resolved ``tx``: hold it to its fenced row and to what it said before."""
        if tx.decided is not None and tx.decided is not state:
            self.fail(f"{why}: {tx.transaction_id} is {state.value}, after {tx.decided.value}")
        row = self.database.row(tx.transaction_id)
        if state is TransactionState.COMMITTED and (row != "COMMITTED" or tx.db != "committed"):
            self.fail(f"{why}: {tx.transaction_id} committed, its transaction_log row is {row} "
                      f"(local transaction {tx.db})")
        if state is TransactionState.ROLLED_BACK and tx.db == "committed":
            self.fail(f"{why}: {tx.transaction_id} rolled back, its local transaction committed (row {row})")
        if tx.decided is None:
            tx.committed_after_runs = self.timer_runs
        tx.decided = state

    def answer_checks(self, count: int, crash_at: int | None) -> None:
        """Answer the ``count`` oldest check-backs from the fenced transaction_log; now and
        then a checker fences and dies before its answer reaches the broker."""
        for request in self.checks.requests[:count]:
            self.checks.requests.remove(request)
            tx = self.txs[request.transaction_id]
            answer = self.database.check(tx.transaction_id, tx.group)
            if answer is Resolution.ROLLBACK and tx.db == "open":
                self.fail(f"check of {tx.transaction_id}: ROLLBACK while its local transaction holds the row")
            if answer is Resolution.ROLLBACK and tx.db == "rolled back":
                tx.db = "fenced"
            if self.rng.random() < 0.1:
                self.step(f"check of {tx.transaction_id}: {answer.value}, the checker dies before answering")
                continue
            self._end(tx, answer, crash_at, from_check=True)
            crash_at = None
            if self.broker is None:
                return

    # -- the broker's timers and consumers ------------------------------------------------
    def advance(self, seconds: float, crash_at: int | None) -> None:
        """Move the clock on and run the broker's timers (check rounds, parking, snapshots)."""
        for number, delayed in self.delayed.items():
            if delayed.recall_in:
                delayed.recall_in -= 1
                if not delayed.recall_in and self.broker is not None:
                    self.recall(number, delayed)
        broker = self.broker
        assert broker is not None
        self.clock.advance(seconds)
        asked = len(self.checks.requests)
        now = self.clock.time_ms()
        self.expired_before = now - self.retention_ms  # the round may run retention
        self.timers_tried_at = now
        self.timer_runs += 1
        outcome = self.attempt(f"{seconds:g} s later: timers", broker.run_timers, crash_at)
        if outcome is not _CUT and not isinstance(outcome, BaseException):
            self.timers_ran_at = now
            self.last_returned_run = self.timer_runs
            self.step(f"{seconds:g} s later: timers ran, {len(self.checks.requests) - asked} check-backs, "
                      f"{broker.book.parked} parked, the log starts at {broker.store.commitlog.min_offset}")

    def snapshot(self, crash_at: int | None) -> None:
        broker = self.broker
        assert broker is not None
        if self.attempt("snapshots", broker.write_snapshots, crash_at) is None:
            self.step("snapshots written")

    def consume(self, count: int, ack: bool, crash_at: int | None) -> None:
        """The schedule's consumer group receives up to ``count`` and maybe acks them."""
        broker = self.broker
        assert broker is not None
        received = self.attempt(f"{WORKERS}: receive", lambda: broker.receive(
            WORKERS, TOPIC, max_messages=count, invisible_duration_s=self.workers_invisible_s), crash_at)
        if not isinstance(received, list):
            self.worker_receipts.clear()
            return
        now = self.clock.time_ms()
        # a receipt a change made expire now may have lost its message to this receive's
        # DLQ move (its invisible time ends now too): neither current nor stale for sure
        self.worker_receipts = {message_id: kept for message_id, kept in self.worker_receipts.items()
                                if kept[1] != now}
        expires = now + int(self.workers_invisible_s * 1000)
        for message in received:
            self._delivered(message.message.message_id, message.transaction_id, f"{WORKERS} received")
            self._delivered_to_workers(message.message.message_id, message.delivery_attempt)
            self.worker_receipts[message.message.message_id] = (message.receipt_handle, expires)
        self._in_fifo_order(received)
        if received and ack:
            handles = [m.receipt_handle for m in received]
            opens = self.opens
            outcomes = self.attempt(f"{WORKERS}: ack {len(handles)}", lambda: broker.ack_many(WORKERS, handles), None)
            for message in received:
                self.worker_receipts.pop(message.message.message_id, None)
                self.worker_maybe_acked.add(message.message.message_id)
                self._refused_ack(message.message.message_id, outcomes, opens)
            if isinstance(outcomes, list):  # else the call failed or was cut: the acks may not be kept
                for message, outcome in zip(received, outcomes, strict=True):
                    if outcome is not None:
                        self.fail(f"{WORKERS}: the ack of {message.message.message_id} right after its receive "
                                  f"was refused: {outcome}")
                    self.worker_acked.add(message.message.message_id)
        self.step(f"{WORKERS}: received {[m.message.message_id for m in received]}{', acked' if ack else ''}")

    def settle_held(self, message_id: str, action: str, crash_at: int | None) -> None:
        """The consumer group settles a message it kept past its receive (``CONSUMING``):
        ``ack``, ``dead-letter``, or ``change <seconds> keep|new`` its invisible time. A
        receipt is current until it expires (the receive's invisible time, or the change's),
        and a later delivery replaces it: the call must take a current one and refuse any
        other (a dead-lettering repeated after the DLQ took the message returns)."""
        broker = self.broker
        assert broker is not None
        handle, expires = self.worker_receipts.pop(message_id)
        now = self.clock.time_ms()
        current = now <= expires
        verb, _, how = action.partition(" ")
        if verb == "ack":
            self.worker_maybe_acked.add(message_id)
            opens = self.opens
            outcome = self.attempt(f"{WORKERS}: late ack of {message_id}", lambda: broker.ack(WORKERS, handle),
                                   crash_at)
            self._refused_ack(message_id, outcome, opens)
        elif verb == "dead-letter":
            outcome = self.attempt(f"{WORKERS}: dead-letter {message_id}", lambda: broker.dead_letter(WORKERS, handle),
                                   crash_at)
        else:
            seconds, keep = float(how.split()[0]), how.endswith("keep")
            outcome = self.attempt(f"{WORKERS}: change {message_id} to {seconds:g} s", lambda: (
                broker.change_invisible_duration(WORKERS, handle, seconds, keep_receipt=keep)), crash_at)
            attempt, until = self.worker_deliveries[message_id]
            if isinstance(outcome, str):
                if (outcome == handle) != keep:
                    self.fail(f"{WORKERS}: a change of {message_id} with keep_receipt={keep} answered "
                              f"{'its own' if outcome == handle else 'a new'} receipt")
                self.worker_receipts[message_id] = (outcome, now + int(seconds * 1000))
                self.worker_deliveries[message_id] = (attempt, now + int(seconds * 1000))
            elif not isinstance(outcome, UnknownReceiptError):  # failed or cut: maybe applied
                self.worker_deliveries[message_id] = (attempt, min(until, now + int(seconds * 1000)))
        if isinstance(outcome, UnknownReceiptError):
            if current:
                self.fail(f"{WORKERS}: {action} of {message_id} refused its current receipt "
                          f"({(expires - now) / 1000:g} s left): {outcome}")
            self.step(f"{WORKERS}: {action} of {message_id} refused ({(now - expires) / 1000:g} s late)")
            return
        if outcome is _CUT or isinstance(outcome, BaseException):
            return
        if not current and not (verb == "dead-letter" and message_id in self._dead_letters()):
            self.fail(f"{WORKERS}: {action} of {message_id} took a receipt {(now - expires) / 1000:g} s expired")
        if verb == "ack":
            self.worker_acked.add(message_id)
        elif verb == "dead-letter":
            self.worker_dead.add(message_id)
        self.step(f"{WORKERS}: {action} of {message_id} returned")

    def drain_workers(self) -> None:
        """The end of a ``CONSUMING`` schedule: an hour later (every invisible time and
        back-off over), the consumer group receives until nothing comes, acking all (going on
        after a clean restart if the broker refuses writes since an fsync, or the undo of a
        failed append, failed). Every message of a
        committed transaction must then have been received, or be in the group's DLQ, or
        have had an ack (maybe cut) sent: nothing is stuck between them, not even after a
        settling call that failed."""
        self.clock.advance(3600.0)
        self.disk.faults_on = False
        broker = self.broker
        assert broker is not None
        drained: set[str] = set()
        try:
            broker.flush()
            self._drain_into(broker, drained)
        except BrokerClosedError:  # it refuses writes since an fsync, or the undo of an append, failed
            self.restart()
            self.disk.faults_on = False
            broker = self.broker
            assert broker is not None
            self._drain_into(broker, drained)
        settled = drained | set(self._dead_letters()) | self.worker_maybe_acked
        stuck = sorted(f"m{number}" for tx in self.txs.values() if tx.decided is TransactionState.COMMITTED
                       for number in tx.halves if self.due_and_kept(tx, number) and f"m{number}" not in settled)
        if stuck:
            self.fail(f"{WORKERS} never gets {stuck} again, nor does its DLQ hold them, though no ack of them was sent")
        followers = f"; {self.fifo_followers} deliveries after an earlier message of their group" if self.fifo else ""
        self.step(f"{WORKERS}: drained {sorted(drained)}{followers}")

    def _drain_into(self, broker: EmbeddedBroker, drained: set[str]) -> None:
        """Receive as the schedule's consumer group until nothing comes, acking all; what it
        got into ``drained``."""
        while received := broker.receive(WORKERS, TOPIC, max_messages=64, invisible_duration_s=3600.0):
            for message in received:
                message_id = message.message.message_id
                self._delivered(message_id, message.transaction_id, f"{WORKERS} drained")
                self._delivered_to_workers(message_id, message.delivery_attempt)
                drained.add(message_id)
            self._in_fifo_order(received)
            outcomes = broker.ack_many(WORKERS, [message.receipt_handle for message in received])
            self.worker_acked.update(message.message.message_id
                                     for message, outcome in zip(received, outcomes, strict=True) if outcome is None)

    def _refused_ack(self, message_id: str, outcome: object, opens: int) -> None:
        """An ack of ``message_id`` made in open ``opens`` failed without a crash since:
        the broker refused it, and keeps the message in flight until a restart."""
        if isinstance(outcome, OSError | BrokerError) and not isinstance(outcome, UnknownReceiptError) \
                and self.opens == opens:
            self.refused_acks[message_id] = opens

    def _in_fifo_order(self, received: list[ReceivedMessage]) -> None:
        """(``FIFO``) Hold the messages a receive of the schedule's consumer group gave to
        their message groups' order: every message of the group earlier in its queue (as
        far as the model knows their places) is done for the group: its ack or
        dead-lettering returned, an ack that may have been applied was sent (none the
        broker refused since it last opened), or it is in the group's DLQ."""
        if not self.fifo:
            return
        self._place(received)
        dead: set[str] | None = None
        for message in received:
            message_id = message.message.message_id
            message_group = _message_group(int(message_id[1:]))
            queue, offset = self.places[message_id]
            earlier = [other for other in sorted(self.placed[message_group])
                       if self.places[other][0] == queue and self.places[other][1] < offset]
            self.fifo_followers += bool(earlier)
            for other in earlier:
                if other in self.worker_acked or other in self.worker_dead or (
                        other in self.worker_maybe_acked and self.refused_acks.get(other) != self.opens):
                    continue
                dead = set(self._dead_letters()) if dead is None else dead
                if other not in dead:
                    self.fail(f"{WORKERS} received {message_id} of message group {message_group} while {other}, "
                              "earlier in its queue, was not done for it")

    def _place(self, received: list[ReceivedMessage]) -> None:
        """Learn the queue and offset of each message ``received`` (``FIFO``)."""
        for message in received:
            message_id = message.message.message_id
            self.places[message_id] = (message.queue_id, message.queue_offset)
            self.placed.setdefault(_message_group(int(message_id[1:])), set()).add(message_id)

    def _dead_letters(self) -> list[str]:
        """The message ids in the consumer group's DLQ, in order."""
        assert self.broker is not None
        return [stored.message.message_id for stored in self.broker.list_dlq(WORKERS, max_messages=100_000)]

    def _delivered_to_workers(self, message_id: str, attempt: int) -> None:
        """Hold a delivery to the schedule's consumer group to what the group was promised
        (its progress events are fsync'd before a call returns, so crashes change none of
        it): no message again once its ack or dead-lettering returned, none before its
        invisible time ended (a restart keeps it; the clock never goes back here), attempts
        that only go up, to ``max_delivery_attempts`` at most."""
        if message_id in self.worker_acked:
            self.fail(f"{WORKERS} received {message_id} again after its ack returned")
        if message_id in self.worker_dead:
            self.fail(f"{WORKERS} received {message_id} again after its dead-lettering returned")
        if attempt > self.config.max_delivery_attempts:
            self.fail(f"{WORKERS} received {message_id} as attempt {attempt}, past the maximum of "
                      f"{self.config.max_delivery_attempts}")
        now = self.clock.time_ms()
        last = self.worker_deliveries.get(message_id)
        if last is not None:
            last_attempt, invisible_until = last
            if now < invisible_until:
                self.fail(f"{WORKERS} received {message_id} again {(invisible_until - now) / 1000:g} s before the "
                          f"invisible time of its attempt {last_attempt} ended")
            if attempt <= last_attempt:
                self.fail(f"{WORKERS} received {message_id} as attempt {attempt} after attempt {last_attempt}")
        self.worker_deliveries[message_id] = (attempt, now + int(self.workers_invisible_s * 1000))

    def _delivered(self, message_id: str, transaction_id: str | None, how: str) -> int:
        """Hold a delivery of ``message_id`` to the model; the message's body size."""
        number = int(message_id[1:])
        delayed = self.delayed.get(number)
        if delayed is not None:
            if transaction_id is not None:
                self.fail(f"{how} {message_id} as of {transaction_id}; it was sent with no transaction")
            if self.clock.time_ms() < delayed.due_ms:
                self.fail(f"{how} delayed {message_id} {(delayed.due_ms - self.clock.time_ms()) / 1000:g} s "
                          "before it is due")
            if delayed.recall == "recalled":
                self.fail(f"{how} delayed {message_id}, which was recalled")
            delayed.delivered = True
            return delayed.size
        tx = self.tx_of.get(number)
        if tx is None or tx.transaction_id != transaction_id:
            self.fail(f"{how} {message_id} of {transaction_id}, which no client sent so")
        if number not in tx.halves and number not in tx.maybe:
            self.fail(f"{how} {message_id}, not a half message of {tx.transaction_id}")
        assert self.broker is not None
        try:
            state = self.broker.transaction_state(tx.transaction_id)
        except UnknownTransactionError:
            if not self.expired(tx.touched_ms):
                raise
            # retention took the transaction's records, not yet the copy it committed: the
            # model's word stands (an END for COMMIT was sent, and nothing decided otherwise)
            state = tx.decided or (TransactionState.COMMITTED if TransactionState.COMMITTED in tx.attempted
                                   else TransactionState.PENDING)
        if state is not TransactionState.COMMITTED:
            self.fail(f"{how} {message_id} of {tx.transaction_id}, which is {state.value}")
        delay = tx.delays.get(number)
        if delay is not None and (tx.commit_ms is None or self.clock.time_ms() < tx.commit_ms + delay):
            early = "with no COMMIT asked" if tx.commit_ms is None else \
                f"{(tx.commit_ms + delay - self.clock.time_ms()) / 1000:g} s before its commit's delay ran out"
            self.fail(f"{how} delayed {message_id} of {tx.transaction_id} {early}")
        self.decide(tx, state, f"{how} {message_id}")
        return tx.halves.get(number, tx.maybe.get(number, -1))

    # -- calls, crashes, recovery ---------------------------------------------------------
    def attempt(self, what: str, call: Callable[[], Any], crash_at: int | None) -> Any:
        """Run a broker call with a crash armed at its ``crash_at``-th change to the disk:
        its value, its typed error (the broker goes on, or is restarted), or ``_CUT``."""
        if crash_at is not None:
            self.disk.crash_after(crash_at)
        try:
            outcome = call()
            self._keep_covered_ends()
            return outcome
        except PowerCut as cut:
            self.disk.crash_after(None)
            self.step(f"{what}: cut short before {cut}")
            self.crash(power=self.rng.random() < 0.7, armed=True)
            return _CUT
        except (OSError, BrokerError) as exc:
            self.disk.crash_after(None)
            if isinstance(exc, TransactionConflictError | UnknownTransactionError | InvalidMessageError
                          | UnknownReceiptError):
                return exc
            self.step(f"{what}: failed ({type(exc).__name__}: {exc})")
            if self.rng.random() < 0.5:
                self.crash(power=self.rng.random() < 0.5)
            return exc
        finally:
            self.disk.crash_after(None)

    def crash(self, power: bool, armed: bool = False) -> None:
        """Kill the broker (``armed``: it stopped at a ``PowerCut``), lose power or not,
        reopen (maybe crashing inside the recovery, then once more)."""
        assert self.broker is not None
        self._keep_covered_ends()  # an fsync that returned covered them: durable, whatever follows
        abandon(self.broker)
        self.broker = None
        self._lose(power)
        cause = "power loss" if power else "process crash"
        while self.rng.random() < 0.35:
            crash_at = self.rng.randint(1, 30)
            if self.open(f"{cause}, reopen cut at {crash_at}", crash_at):
                return
            power = self.rng.random() < 0.7
            self._lose(power)
        self.open(cause)

    def _lose(self, power: bool) -> None:
        if power:
            self.disk.power_loss()
        else:
            self.disk.process_crash()

    def restart(self) -> None:
        """Close the broker cleanly (a process crash if the close fails) and reopen it."""
        assert self.broker is not None
        try:
            self.broker.close()
        except (OSError, BrokerError) as exc:
            self.step(f"close: failed ({type(exc).__name__}: {exc})")
            abandon(self.broker)
            self.disk.process_crash()
            self.covered_ends = []
        else:
            self._keep_covered_ends()  # the close's fsync covered every oneway END
        self.broker = None
        self.open("clean restart")

    def open(self, cause: str, crash_at: int | None = None) -> bool:
        """Open the broker and check it (both without injected faults); False when the
        armed crash fell inside the open."""
        self.disk.faults_on = False
        self.opens += 1
        broker = EmbeddedBroker.__new__(EmbeddedBroker)
        self.disk.crash_after(crash_at)
        try:
            broker.__init__(DATA_DIR, self.config, self.checks)  # type: ignore[misc]
        except PowerCut as cut:
            self.step(f"{cause}: cut short before {cut}")
            abandon(broker)
            return False
        except Exception as exc:
            self.step(f"{cause}: the broker refuses to open")
            self.fail(f"the broker does not reopen after a {cause}: {type(exc).__name__}: {exc}")
        finally:
            self.disk.crash_after(None)
        self.broker = broker
        try:
            self.check(cause)
        finally:
            self.disk.faults_on = True
        return True

    def check(self, cause: str) -> None:
        """Hold the reopened broker to the model."""
        broker = self.broker
        assert broker is not None
        losses = broker.store.losses.all()
        if losses:
            self.fail(f"after a {cause} the loss ledger names losses with no media fault injected: {losses}")
        for tx in self.txs.values():
            try:
                state = broker.transaction_state(tx.transaction_id)
            except UnknownTransactionError:
                if tx.halves and not self.expired(tx.touched_ms):
                    self.fail(f"after a {cause} the broker does not know {tx.transaction_id}, whose half "
                              f"messages {sorted(tx.halves)} were stored")
                continue
            if state in (TransactionState.PENDING, TransactionState.PARKED):
                if tx.decided is not None:
                    self.fail(f"after a {cause} {tx.transaction_id} is {state.value}, "
                              f"though it was {tx.decided.value}")
                continue
            if tx.decided is None and state not in tx.attempted:
                self.fail(f"after a {cause} {tx.transaction_id} is {state.value}, which no END asked for")
            self.decide(tx, state, f"after a {cause}")
        group = f"fresh{next(self.fresh_groups)}"
        seen: dict[int, int] = {}
        while received := broker.receive(group, TOPIC, max_messages=64, invisible_duration_s=3600.0):
            for message in received:
                size = self._delivered(message.message.message_id, message.transaction_id, f"{group} read")
                number = int(message.message.message_id[1:])
                seen[number] = seen.get(number, 0) + 1
                if message.message.body != body_of(number, size):
                    self.fail(f"{group} read m{number} with a damaged body")
            if self.fifo:  # a message group's next message comes once its head is acked
                self._place(received)
                broker.ack_many(group, [message.receipt_handle for message in received])
        twice = sorted(number for number, count in seen.items() if count > 1)
        if twice:
            self.fail(f"after a {cause} a fresh group reads {[f'm{n}' for n in twice]} more than once")
        for tx in self.txs.values():
            if tx.decided is TransactionState.COMMITTED:
                missing = sorted(number for number in set(tx.halves) - set(seen) if self.due_and_kept(tx, number))
                if missing:
                    self.fail(f"after a {cause} committed {tx.transaction_id} lacks {[f'm{n}' for n in missing]} "
                              f"(read {sorted(n for n in seen if self.tx_of.get(n) is tx)})")
        due = self.timers_ran_at
        late = sorted(number for number, delayed in self.delayed.items()
                      if delayed.acked and number not in seen and not self.expired(delayed.due_ms)
                      and (delayed.recall == "too late" or (
                          not delayed.recall and due is not None and delayed.due_ms <= due)))
        if late:
            self.fail(f"after a {cause} delayed messages due and delivered by the timers are not read: "
                      f"{[f'm{n}' for n in late]}")
        for number in seen:
            tx = self.tx_of.get(number)
            if tx is not None and number in tx.maybe:
                tx.halves[number] = tx.maybe.pop(number)
        dead = self._dead_letters() if self.consuming else []
        if len(set(dead)) < len(dead):
            self.fail(f"after a {cause} the DLQ of {WORKERS} holds a message twice: {dead}")
        if acked := sorted(self.worker_acked & set(dead)):
            self.fail(f"after a {cause} the DLQ of {WORKERS} holds {acked}, whose ack returned")
        if lacking := sorted(self.worker_dead - set(dead)):
            self.fail(f"after a {cause} the DLQ of {WORKERS} lacks {lacking}, whose dead-lettering returned")
        delayed = sum(1 for number in seen if number in self.delayed)
        halves = sum(1 for number in seen if number in self.tx_of and number in self.tx_of[number].delays)
        of_them = f" ({halves} of them delayed)" if self.delays else ""
        most = self.config.max_delivery_attempts
        spent = sum(1 for message_id in set(dead) - self.worker_dead
                    if self.worker_deliveries.get(message_id, (0, 0))[0] == most)
        in_dlq = f", {len(dead)} in the DLQ of {WORKERS} ({spent} after {most} deliveries)" if self.consuming else ""
        self.step(f"{cause}, reopen: {len(seen) - delayed} committed{of_them} and {delayed} delayed messages read "
                  f"once, {len(broker.book.by_id)} open transactions{in_dlq}")

    def due_and_kept(self, tx: Tx, number: int) -> bool:
        """Whether a fresh group must read ``m{number}`` of ``tx``, committed: not delayed,
        or the timers ran at or after its last possible due time since the model learnt of
        the commit; and retention cannot have taken it."""
        delay = tx.delays.get(number)
        if delay is None:
            return not self.expired(tx.commit_ms)
        assert tx.commit_ms is not None and tx.last_commit_ms is not None
        ran = self.timers_ran_at
        return (self.last_returned_run > tx.committed_after_runs and ran is not None and ran >= tx.last_commit_ms + delay
                and not self.expired(tx.commit_ms + delay))

    def expired(self, written_ms: int | None) -> bool:
        """Whether retention may have taken a message written to its topic no earlier than
        ``written_ms``."""
        return written_ms is not None and self.expired_before is not None and written_ms < self.expired_before

    def close(self) -> None:
        """End the schedule: stop the broker as a killed process, drop the database."""
        if self.broker is not None:
            abandon(self.broker)
            self.broker = None
        for tx in self.txs.values():
            if tx.connection is not None:
                tx.connection.close()
        self.database.close()


#: How far the seeded driver moves the clock in one step (seconds).
ADVANCES = (0.5, 2.0, 5.0, 7.0, 15.0)
#: In the TIMED profiles, also: past delay levels of minutes and hours, and retention's cutoff.
LONG_ADVANCES = (60.0, 300.0, 900.0, 2400.0, 3600.0)
#: The delay levels delayed messages are sent with (1 s to 2 h; the short ones oftener).
LEVELS = (1, 1, 2, 3, 4, 5, 6, 9, 14, 16, 18)


def _half_delay_level(number: int) -> int:
    """The delay level of half message ``m{number}`` in a DELAYS profile (a third have one;
    0: none), from its number: the schedule's draws stay those of the seed."""
    digest = zlib.crc32(f"m{number}".encode())
    return LEVELS[digest // 3 % len(LEVELS)] if digest % 3 == 0 else 0


def _message_group(number: int) -> str:
    """The message group of half message ``m{number}`` in the ``FIFO`` profiles."""
    return f"g{number % FIFO_GROUPS}"


def _recall_in(number: int) -> int:
    """In how many moves of the clock a client recalls delayed ``m{number}`` (a third of
    them, at the next move or the one after; 0: never), from its number."""
    digest = zlib.crc32(f"recall m{number}".encode())
    return 1 + digest // 3 % 2 if digest % 3 == 0 else 0


class _SeededSchedule:
    """The seeded driver: every step and its arguments drawn from one ``random.Random``."""

    def __init__(self, seed: int, profile: str) -> None:
        self.rng = random.Random(seed)
        disk = SimulatedDisk(random.Random(self.rng.getrandbits(64)), PROFILES[profile])
        self.timed = profile in TIMED
        self.consuming = profile in CONSUMING
        self.simulation = TxSimulation(self.rng, disk, self.timed, profile in DELAYS, self.consuming, profile in FIFO)

    def run(self, steps: int) -> None:
        sim, rng = self.simulation, self.rng
        sim.open("open")
        for _ in range(steps):
            txs = list(sim.txs.values())
            open_txs = [tx for tx in txs if tx.connection is not None]
            to_end = [tx for tx in txs if tx.final is not None and tx.ends and not tx.ended]
            ended = [tx for tx in txs if tx.ended and tx.decided is not None]
            if self.consuming:
                draw = rng.random()
                if draw < 0.15 and sim.worker_receipts:
                    message_id = rng.choice(sorted(sim.worker_receipts))
                    action = rng.choice(("ack", "dead-letter", "change", "change"))
                    if action == "change":
                        action += f" {rng.choice(CHANGED_INVISIBLE_S):g} s {rng.choice(('keep', 'new'))}"
                    sim.settle_held(message_id, action, self.crash_at())
                    continue
                if draw < 0.3:
                    sim.consume(rng.randint(1, 8), rng.random() < 0.3, self.crash_at())
                    continue
                if draw < 0.4:
                    sim.advance(rng.choice(ADVANCES), self.crash_at())
                    continue
            timed = rng.random() if self.timed else 1.0
            if timed < 0.12:
                sim.send_delayed(rng.choice(LEVELS), self.size(), self.crash_at())
                continue
            if timed < 0.2:
                sim.advance(rng.choice(LONG_ADVANCES), self.crash_at())
                continue
            choice = rng.random()
            if choice < 0.28 and open_txs:
                tx = open_txs[0]
                if len(tx.halves) + len(tx.maybe) < rng.randint(1, 3):
                    sim.send_half(tx, self.size(), self.crash_at())
                else:
                    sim.end_local(tx, rng.random() < 0.7, rng.random() < 0.85)
            elif choice < 0.40 and not open_txs:
                sim.begin(rng.choice(GROUPS), self.size(), self.crash_at())
            elif choice < 0.54 and to_end:
                sim.end(rng.choice(to_end), self.crash_at())
            elif choice < 0.58 and ended:
                sim.end(rng.choice(ended), self.crash_at(), opposite=rng.random() < 0.5)
            elif choice < 0.68:
                sim.answer_checks(rng.randint(1, 4), self.crash_at())
            elif choice < 0.78:
                sim.advance(rng.choice(ADVANCES), self.crash_at())
            elif choice < 0.84:
                sim.consume(rng.randint(1, 8), rng.random() < 0.8, self.crash_at())
            elif choice < 0.87:
                sim.snapshot(self.crash_at())
            elif choice < 0.94:
                sim.crash(power=True)
            elif choice < 0.97:
                sim.crash(power=False)
            else:
                sim.restart()
        if self.consuming:
            sim.drain_workers()

    def size(self) -> int:
        large = 12_000 if self.timed else 20_000  # within a TIMED profile's segment
        return self.rng.randrange(large) if self.rng.random() < 0.1 else self.rng.randrange(1500)

    def crash_at(self) -> int | None:
        """Mostly none; else often at the first few changes of a call (its append, its
        fsync), where an END's decision and the records it implies part."""
        if self.rng.random() >= 0.3:
            return None
        return self.rng.randint(1, 3) if self.rng.random() < 0.5 else self.rng.randint(1, 12)


def run(seed: int, profile: str = "power", steps: int = 60) -> Result:
    """Run seed ``seed``'s schedule of ``steps`` steps; ``Result.failure`` says what broke."""
    schedule = _SeededSchedule(seed, profile)
    simulation = schedule.simulation
    result = Result(seed, profile, simulation.steps, workload="tx")
    try:
        schedule.run(steps)
    except SimulationFailure as exc:
        result.failure = str(exc)
    except Exception as exc:  # the broker itself raised where it must not
        result.failure = f"unexpected {type(exc).__name__}: {exc}"
    finally:
        simulation.close()
    result.disk_events = simulation.disk.events
    return result
