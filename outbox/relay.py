"""The relay: hands the messages store mode kept in a producer database to the broker.

A call of a producer with ``on_broker_down="store"`` that could not reach the broker
committed its messages in ``outbox_stored_message`` (``outbox.stored``). ``Relay.relay_once``
hands them over in one transaction of its own on that database:

1. claim the oldest unrelayed rows (``sql.claim_stored``: locked, and on PostgreSQL rows
   another relay holds are skipped, so several relays at once share the work; SQLite's
   ``BEGIN IMMEDIATE`` lets one relay in at a time);
2. per message group keep only the rows from the group's head on (``sql.group_head``): a
   group whose older rows another relay holds waits for it, so the broker receives a
   group's messages in the order they were stored;
3. hand each transaction's rows, in ``seq`` order, to ``broker.relay_committed``, which
   stores each message unless it already holds it (a half message that did arrive, a copy
   an earlier relay handed over), so a repeat never makes a second copy;
4. mark them relayed (``sql.mark_relayed``) and commit.

A relay killed at any point loses nothing (its rows stay unrelayed until the commit) and
doubles nothing (the broker recognises the repeat). A transaction the broker refuses is
logged and left, with the rows behind it in its message groups, for a later pass; a broker
that cannot be reached ends the pass (what was relayed before is committed) and raises
``BrokerUnavailableError``. ``run`` loops until stopped, backing off while the broker is
down (``outbox.outage``); ``relay_task`` runs it as an asyncio task. ``stored_backlog``
says what waits (``outbox status``).

The core knows no ORM: an integration gives its recorder (``checker_transaction``) and a
database (``outbox.integrations.sqlalchemy.relay``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from broker_embedded import BrokerAPI, BrokerClient, BrokerError, SendResult
from broker_embedded.errors import BrokerUnavailableError

from . import instrumentation
from .outage import BrokerOutage
from .schema import DEFAULT_LOCK_TIMEOUT_MS
from .sql import Execute, OutboxSQL
from .stored import StoredMessage, stored_message
from .transaction_log import TransactionLogRecorder

log = logging.getLogger(__name__)

Database = TypeVar("Database")

#: Rows claimed by one pass (one database transaction).
DEFAULT_BATCH_SIZE = 100
#: How long ``run`` waits after a pass that relayed nothing.
DEFAULT_IDLE_S = 1.0
#: How often ``run`` counts what waits (``Relay.report_backlog``).
BACKLOG_EVERY_S = 5.0

#: A message group of a producer group.
_Group = tuple[str, str]


class Relay(Generic[Database]):
    """Relays the stored messages of ``database`` (through ``recorder``) to ``broker``,
    ``batch_size`` rows per transaction."""

    def __init__(self, recorder: TransactionLogRecorder[Any, Database], database: Database, broker: BrokerAPI, *,
                 batch_size: int = DEFAULT_BATCH_SIZE, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                 name: str = "relay") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.recorder = recorder
        self.database = database
        self.broker = broker
        self.batch_size = batch_size
        self.lock_timeout_ms = lock_timeout_ms
        self.name = name
        self._reported: set[str] = set()  # producer groups the last backlog report named

    def relay_once(self) -> int:
        """One pass (see the module docstring); the number of messages relayed.
        ``BrokerUnavailableError`` once what could be relayed is committed, if the broker
        could not be reached."""
        unreachable: BrokerUnavailableError | None = None
        relayed: list[int] = []
        per_group: Counter[str] = Counter()
        with self.recorder.checker_transaction(self.database, self.lock_timeout_ms) as (execute, sql):
            claimed = [stored_message(row) for row in execute(sql.claim_stored(self.batch_size), ())]
            ready = _at_group_heads(execute, sql, claimed)
            waiting: set[_Group] = set()  # groups whose rows wait behind one not relayed
            eligible: list[list[StoredMessage]] = []
            for rows in _transactions(claimed, full=len(claimed) == self.batch_size):
                groups = {group for row in rows if (group := _group(row)) is not None}
                if groups & waiting or any(_group(row) is not None and row.seq not in ready for row in rows):
                    waiting |= groups
                    continue
                eligible.append(rows)
            while eligible and unreachable is None:
                wave, eligible = _wave(eligible, waiting)
                for rows, outcome in zip(wave, self._hand_over(wave), strict=True):
                    if isinstance(outcome, BrokerUnavailableError):
                        unreachable = outcome
                    elif isinstance(outcome, BrokerError):
                        log.warning("%s: transaction %s (producer group %s) not relayed, left for a later pass: %s",
                                    self.name, rows[0].transaction_id, rows[0].producer_group, outcome)
                        waiting |= {group for row in rows if (group := _group(row)) is not None}
                    else:
                        relayed.extend(row.seq for row in rows)
                        per_group[rows[0].producer_group] += len(rows)
            if relayed:
                execute(sql.mark_relayed(len(relayed)), relayed)
        if relayed:
            log.info("%s: relayed %d stored message(s) to the broker", self.name, len(relayed))
            for producer_group, count in per_group.items():
                instrumentation.announce(instrumentation.MESSAGES_RELAYED, producer_group=producer_group, count=count)
        if unreachable is not None:
            raise unreachable
        return len(relayed)

    def _hand_over(self, transactions: list[list[StoredMessage]]) -> list[BrokerError | None]:
        """``relay_committed`` for each transaction; per transaction None or the broker's
        error. Over a ``BrokerClient`` all are on the wire before the first answer is awaited
        (the server stores them in one group commit); other brokers take them one by one."""
        def request(rows: list[StoredMessage]) -> dict[str, Any]:
            return {"producer_group": rows[0].producer_group, "transaction_id": rows[0].transaction_id}

        outcomes: list[BrokerError | None] = []
        if isinstance(self.broker, BrokerClient):
            client = self.broker
            futures: list[Future[list[SendResult]] | BrokerError] = []
            for rows in transactions:
                try:
                    futures.append(client.start_relay_committed([row.message for row in rows], **request(rows)))
                except BrokerError as exc:
                    futures.append(exc)
            for future in futures:
                if isinstance(future, BrokerError):
                    outcomes.append(future)
                    continue
                try:
                    future.result(client.timeout_s)
                    outcomes.append(None)
                except FutureTimeout:
                    outcomes.append(BrokerUnavailableError(f"no answer to a relay within {client.timeout_s:.1f}s"))
                except BrokerError as exc:
                    outcomes.append(exc)
            return outcomes
        for rows in transactions:
            try:
                self.broker.relay_committed([row.message for row in rows], **request(rows))
                outcomes.append(None)
            except BrokerError as exc:
                outcomes.append(exc)
        return outcomes

    def report_backlog(self) -> list[Backlog]:
        """What waits in this database (``stored_backlog``), announced per producer group as
        ``STORED_BACKLOG`` (the metrics' gauges); a group no longer waiting is announced at 0."""
        with self.recorder.checker_transaction(self.database, self.lock_timeout_ms) as (execute, sql):
            backlog = stored_backlog(execute, sql)
        named = {entry.producer_group for entry in backlog}
        for entry in backlog:
            instrumentation.announce(instrumentation.STORED_BACKLOG, producer_group=entry.producer_group,
                                     unrelayed=entry.unrelayed, oldest_age_s=entry.oldest_age_s)
        for producer_group in self._reported - named:
            instrumentation.announce(instrumentation.STORED_BACKLOG, producer_group=producer_group, unrelayed=0,
                                     oldest_age_s=0.0)
        self._reported = named
        return backlog

    def run(self, stop: threading.Event, idle_s: float = DEFAULT_IDLE_S) -> None:
        """``relay_once`` until ``stop`` is set (``run_relays``)."""
        run_relays([self], stop, idle_s)


def run_relays(relays: Sequence[Relay[Any]], stop: threading.Event, idle_s: float = DEFAULT_IDLE_S) -> None:
    """Pass over each of ``relays`` (one per database) until ``stop`` is set: again at once
    while they relay, after ``idle_s`` when none did, with back-off while the broker
    cannot be reached. A database error is logged and retried after ``idle_s``. Every
    ``BACKLOG_EVERY_S`` each relay reports what waits (``Relay.report_backlog``)."""
    outage = BrokerOutage(log, "relay")
    database_errors = tuple({error for relay in relays for error in relay.recorder.database_errors})
    backlog_due = 0.0
    while not stop.is_set():
        relayed = 0
        try:
            if time.monotonic() >= backlog_due:
                backlog_due = time.monotonic() + BACKLOG_EVERY_S
                for relay in relays:
                    relay.report_backlog()
            for relay in relays:
                relayed += relay.relay_once()
        except BrokerUnavailableError as exc:
            stop.wait(outage.failed(exc))
            continue
        except database_errors as exc:
            log.warning("relay: database error, retrying in %.1fs: %s", idle_s, str(exc).partition("\n")[0])
            stop.wait(idle_s)
            continue
        if relayed:
            outage.recovered()
        else:
            stop.wait(idle_s)


async def relay_task(relays: Sequence[Relay[Any]], idle_s: float = DEFAULT_IDLE_S) -> None:
    """``run_relays`` in a worker thread, as an asyncio task for an application's event
    loop (a FastAPI lifespan): cancelling the task stops the loop, waits for the pass under
    way to end (its transaction commits or rolls back), then raises ``CancelledError``::

        task = asyncio.create_task(relay_task([relay]))
        ...
        task.cancel()
    """
    stop = threading.Event()
    running = asyncio.ensure_future(asyncio.to_thread(run_relays, relays, stop, idle_s))
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        stop.set()
        await running
        raise


def relay_thread(relays: Sequence[Relay[Any]], idle_s: float = DEFAULT_IDLE_S) -> Callable[[], None]:
    """``run_relays`` in a daemon thread started now; returns what stops it (and waits for
    the pass under way to end)."""
    stop = threading.Event()
    thread = threading.Thread(target=run_relays, args=(relays, stop, idle_s), name="outbox-relay", daemon=True)
    thread.start()

    def stopped() -> None:
        stop.set()
        thread.join()

    return stopped


@dataclass(frozen=True)
class Backlog:
    """A producer group's stored messages not relayed yet, and the oldest one's age."""

    producer_group: str
    unrelayed: int
    oldest_age_s: float


def stored_backlog(execute: Execute, sql: OutboxSQL) -> list[Backlog]:
    """Per producer group with stored messages waiting: how many, and how long the oldest
    has waited (by the database's clock)."""
    now = sql.database_time(execute(sql.read_now, ())[0][0])
    return [Backlog(str(group), int(count), (now - sql.database_time(oldest)).total_seconds())
            for group, count, oldest in execute(sql.stored_backlog, ())]


def _group(row: StoredMessage) -> _Group | None:
    group = row.message.message_group
    return None if group is None else (row.producer_group, group)


def _transactions(claimed: list[StoredMessage], full: bool) -> list[list[StoredMessage]]:
    """The claimed rows per transaction, in the order of their first row. A full batch may
    have cut its last transaction: that one waits for the next pass, unless it is alone."""
    by_transaction: dict[str, list[StoredMessage]] = {}
    for row in claimed:
        by_transaction.setdefault(row.transaction_id, []).append(row)
    transactions = list(by_transaction.values())
    if full and len(transactions) > 1:
        transactions.pop()
    return transactions


def _wave(transactions: list[list[StoredMessage]],
          waiting: set[_Group]) -> tuple[list[list[StoredMessage]], list[list[StoredMessage]]]:
    """The transactions that can go to the broker together (at most one per message group,
    none of a group that waits), and the rest, in order: a group's next transaction goes
    only once the one before it was stored."""
    wave: list[list[StoredMessage]] = []
    rest: list[list[StoredMessage]] = []
    taken: set[_Group] = set()
    for rows in transactions:
        groups = {group for row in rows if (group := _group(row)) is not None}
        if groups & waiting:
            continue
        (rest if groups & taken else wave).append(rows)
        taken |= groups
    return wave, rest


def _at_group_heads(execute: Execute, sql: OutboxSQL, claimed: list[StoredMessage]) -> set[int]:
    """The seqs of the claimed rows that are their message group's oldest unrelayed ones
    (with the group's claimed rows before them): those may go to the broker now."""
    by_group: dict[_Group, list[int]] = {}
    for row in claimed:
        if (group := _group(row)) is not None:
            by_group.setdefault(group, []).append(row.seq)
    ready: set[int] = set()
    for group, seqs in by_group.items():
        head = [row[0] for row in execute(sql.group_head(len(seqs)), group)]
        for seq, oldest in zip(seqs, head, strict=False):
            if seq != oldest:
                break
            ready.add(seq)
    return ready
