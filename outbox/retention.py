"""Retention of the framework tables (ORM-free): what may be deleted, and deleting it in
small batches, each its own short transaction.

* ``outbox_transaction_log``: a row is needed while the broker may still send a check-back
  for its transaction. It may go once it is older than the broker's full check horizon
  (transaction timeout + check interval x check max, plus a margin; never less than the
  horizon itself, ``RetentionPolicy.min_age_s``) AND its transaction is not open at the
  broker (pending or parked: ``BrokerAPI.open_transactions``), whatever its age: a broker
  that was down for days still checks those. Once the broker cannot be asked, no more
  transaction_log rows are deleted.
* ``outbox_consumed_message``: a row is what makes a redelivery a no-op. It may go once it
  is older than the dedup window (7 days by default): a redelivery older than that would
  run its handler a second time.
* ``outbox_stored_message`` (store mode, ``outbox.stored``): a row the relay has not
  handed to the broker (``relayed_at`` NULL) is a committed message still to deliver and
  is never deleted, whatever its age. A relayed row may go once it was relayed longer ago
  than transaction_log rows live (the same age and override): the reconciliation reads it
  beside its transaction's row. Like transaction_log, only the purged producer groups' rows.

No application host's clock takes part. Rows are stamped by the database's clock
(``OutboxSQL.now`` in the producer's, the checker's and the consumer's inserts), and the
purge reads the database's clock once, when it begins, for its horizons: a row written
after that is never a candidate, and a producer or purging host whose clock is off by an
hour changes nothing.

Why no row of a transaction the broker may still check is ever deleted (the order of each
transaction_log batch: select the candidates, THEN ask the broker for its open set, then
delete the candidates that are not in it):

* a row a batch selects is committed, so its transaction was known to the broker before
  the select: the producer's row (COMMITTED) commits only after the broker acknowledged the
  transaction's half message, and a checker's fence (ROLLED_BACK) is written because the
  broker checked the transaction;
* so when the open set is read, after the select, that transaction is either still open
  (pending or parked: in the set, the row is kept) or resolved at the broker, which then
  never asks about it again. A transaction that becomes open after the open set was read
  has no row this batch selected: its half message precedes its row;
* the delete names the selected ids and repeats ``created_at < horizon``, so a row written
  since the select (a fence for the same id) is not deleted.

Reading the open set once per purge, before the deletes, was the bug of issue 21: a row
committed during a long purge was not in that set and went, its END lost, and the check
fenced a committed order. The age floor keeps what the open set cannot speak for: a fence
(ROLLED_BACK) row of a resolved transaction stops a producer that stalled before its first
statement from committing later; it stays at least the broker's horizon (and the margin).

Each batch selects the oldest rows through the ``created_at`` / ``consumed_at`` index
(transaction_log: a keyset walk on ``(created_at, transaction_id)``, so rows kept open are
stepped over, not selected again) and deletes at most ``batch_size`` of them by key, so a
batch holds its row locks for milliseconds and never scans a table; batches are separated
by a pause. The statements follow ``outbox.sql``'s dialects (PostgreSQL; SQLite 3.35 or
later, for ``RETURNING``). The integrations hand ``purge`` a way to run a transaction on
their connection (``outbox.integrations.sqlalchemy.retention``,
``outbox.integrations.django.retention``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from broker_embedded import BrokerConfig, BrokerError

from . import instrumentation
from .errors import ConfigurationError
from .schema import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG
from .sql import Execute, OutboxSQL

log = logging.getLogger(__name__)

#: NServiceBus's default deduplication window.
DEFAULT_DEDUP_WINDOW_S = 7 * 24 * 3600.0
#: Beyond the broker's horizon, transaction_log rows stay as long as consumed_message rows:
#: the reconciliation (and an operator) read both sides of the same week.
DEFAULT_MARGIN_S = 7 * 24 * 3600.0
DEFAULT_BATCH_SIZE = 1000
#: The most rows one batch deletes (SQLite allows 32766 parameters in a statement).
MAX_BATCH_SIZE = 10_000
DEFAULT_PAUSE_S = 0.05
TABLES = (TRANSACTION_LOG, CONSUMED_MESSAGE, STORED_MESSAGE)
#: Open transaction ids per statement when counting the rows they keep.
_ID_CHUNK = 500

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``15m``, ``12h`` or ``7d``; ``ConfigurationError`` otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigurationError(f"{text!r} is not a duration (e.g. 90s, 15m, 12h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows are kept. The three broker settings must be the broker's own
    (``halfmoon-broker serve --transaction-timeout/--check-interval/--check-max``); the
    defaults are the broker's defaults."""

    transaction_timeout_s: float = BrokerConfig.transaction_timeout_s
    check_interval_s: float = BrokerConfig.check_interval_s
    check_max: int = BrokerConfig.check_max
    #: Kept beyond the broker's horizon.
    margin_s: float = DEFAULT_MARGIN_S
    #: consumed_message rows are kept this long; an older redelivery runs twice.
    dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S

    def __post_init__(self) -> None:
        for name in ("transaction_timeout_s", "check_interval_s", "check_max", "margin_s", "dedup_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ConfigurationError(f"retention setting {name} must be a number >= 0, not {value!r}")

    @property
    def min_age_s(self) -> float:
        """The broker's own check horizon (transaction timeout + check interval x check
        max): after this long it has resolved or parked every transaction. No purge deletes
        a younger transaction_log row, whatever age it is asked for."""
        return self.transaction_timeout_s + self.check_interval_s * self.check_max

    @property
    def check_horizon_s(self) -> float:
        """The broker's horizon plus the margin: the age from which a resolved
        transaction's row goes by default."""
        return self.min_age_s + self.margin_s


@dataclass(frozen=True)
class PurgeOptions:
    """What one purge does: which tables, in batches of how many rows with what pause,
    and age overrides (seconds) of the policy's horizon and dedup window."""

    tables: Collection[str] = TABLES
    batch_size: int = DEFAULT_BATCH_SIZE
    pause_s: float = DEFAULT_PAUSE_S
    dry_run: bool = False
    transaction_log_older_than_s: float | None = None
    consumed_message_older_than_s: float | None = None
    #: Only these producer groups' transaction_log and stored_message rows (None: every row).
    producer_groups: Collection[str] | None = None

    def __post_init__(self) -> None:
        if unknown := set(self.tables) - set(TABLES):
            raise ConfigurationError(f"no table {sorted(unknown)} to purge (the tables: {', '.join(TABLES)})")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ConfigurationError(f"batch size must be 1..{MAX_BATCH_SIZE}, not {self.batch_size!r}")
        for name in ("pause_s", "transaction_log_older_than_s", "consumed_message_older_than_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigurationError(f"{name} must be >= 0, not {value!r}")
        if self.producer_groups is not None and not self.producer_groups:
            raise ConfigurationError("producer_groups must name at least one group (None: every group)")


@dataclass(frozen=True)
class TablePurge:
    """One table's outcome: ``rows`` deleted (with ``dry_run``: that would be), in
    ``batches``; ``kept_open`` rows past the horizon kept because their transaction is
    open at the broker; ``skipped`` says why the table was left alone (else None)."""

    table: str
    rows: int = 0
    batches: int = 0
    seconds: float = 0.0
    kept_open: int = 0
    skipped: str | None = None

    @property
    def rate(self) -> float:
        """Rows per second."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def summary(self, dry_run: bool = False) -> str:
        """One line: the table and what happened to it."""
        if self.skipped is not None and self.rows:
            return f"{self.table}: stopped after {self.rows} rows deleted ({self.skipped})"
        if self.skipped is not None:
            return f"{self.table}: skipped ({self.skipped})"
        done = (f"{self.rows} rows would be deleted" if dry_run else
                f"{self.rows} rows deleted in {self.batches} batches, {self.seconds:.1f}s, {self.rate:.0f} rows/s")
        kept = f", {self.kept_open} kept (open at the broker)" if self.table == TRANSACTION_LOG else ""
        return f"{self.table}: {done}{kept}"


@dataclass(frozen=True)
class PurgeReport:
    """The outcome of one purge of one database, table by table."""

    database: str
    dry_run: bool
    tables: tuple[TablePurge, ...] = field(default_factory=tuple)

    def rows(self) -> dict[str, int]:
        """Rows deleted (or that would be) per table: what a metrics counter adds up."""
        return {table.table: table.rows for table in self.tables if table.skipped is None}

    @property
    def skipped(self) -> dict[str, str]:
        """Tables left alone, with the reason."""
        return {table.table: table.skipped for table in self.tables if table.skipped is not None}

    def __str__(self) -> str:
        head = f"{self.database}{' (dry run)' if self.dry_run else ''}:"
        return "\n".join([head, *(f"  {table.summary(self.dry_run)}" for table in self.tables)])


#: Opens one short transaction on the database and hands its statement runner; commits
#: when the block ends, rolls back if it raises.
Transaction = Callable[[], AbstractContextManager[Execute]]
#: Told after each batch: the table's progress so far.
Progress = Callable[[TablePurge], None]


@dataclass(frozen=True)
class PurgeSQL:
    """The retention statements of one dialect (``outbox.sql``'s placeholders)."""

    sql: OutboxSQL

    def _list(self, count: int) -> str:
        return ", ".join([self.sql.placeholder] * count)

    def _groups(self, groups: Sequence[str]) -> str:
        return f" AND producer_group IN ({self._list(len(groups))})" if groups else ""

    def old_transactions(self, groups: Sequence[str], after: bool = False) -> str:
        """The oldest rows (id, created_at) before a moment, in (created_at, id) order;
        parameters: the moment, *groups, when ``after`` the last row's created_at twice
        and its id, then the limit."""
        p = self.sql.placeholder
        cursor = f" AND created_at >= {p} AND (created_at > {p} OR transaction_id > {p})" if after else ""
        # SQLite: the stored text itself, which no driver converter rounds (a cursor compares exactly)
        created_at = "CAST(created_at AS TEXT)" if self.sql.dialect == "sqlite" else "created_at"
        return (f"SELECT transaction_id, {created_at} FROM {TRANSACTION_LOG} WHERE created_at < {p}"
                f"{self._groups(groups)}{cursor} ORDER BY created_at, transaction_id LIMIT {p}")

    def delete_transactions(self, count: int) -> str:
        """Delete these ids if still before the moment; parameters: the moment, *ids."""
        return (f"DELETE FROM {TRANSACTION_LOG} WHERE created_at < {self.sql.placeholder} "
                f"AND transaction_id IN ({self._list(count)}) RETURNING transaction_id")

    def count_transactions(self, groups: Sequence[str], ids: int = 0) -> str:
        """Rows before a moment (of these ids); parameters: the moment, *groups, *ids."""
        among = f" AND transaction_id IN ({self._list(ids)})" if ids else ""
        return (f"SELECT count(*) FROM {TRANSACTION_LOG} WHERE created_at < {self.sql.placeholder}"
                f"{self._groups(groups)}{among}")

    @property
    def delete_consumed(self) -> str:
        """Delete the oldest rows before a moment; parameters: the moment, the limit."""
        p = self.sql.placeholder
        return (f"DELETE FROM {CONSUMED_MESSAGE} WHERE id IN (SELECT id FROM {CONSUMED_MESSAGE} "
                f"WHERE consumed_at < {p} ORDER BY consumed_at LIMIT {p}) RETURNING id")

    @property
    def count_consumed(self) -> str:
        """Rows before a moment; parameter: the moment."""
        return f"SELECT count(*) FROM {CONSUMED_MESSAGE} WHERE consumed_at < {self.sql.placeholder}"

    def delete_relayed(self, groups: Sequence[str]) -> str:
        """Delete the stored messages relayed longest ago, before a moment (an unrelayed
        one never: NULL is before nothing); parameters: the moment, *groups, the limit."""
        p = self.sql.placeholder
        return (f"DELETE FROM {STORED_MESSAGE} WHERE seq IN (SELECT seq FROM {STORED_MESSAGE} "
                f"WHERE relayed_at < {p}{self._groups(groups)} ORDER BY relayed_at LIMIT {p}) RETURNING seq")

    def count_relayed(self, groups: Sequence[str]) -> str:
        """Stored messages relayed before a moment; parameters: the moment, *groups."""
        return (f"SELECT count(*) FROM {STORED_MESSAGE} WHERE relayed_at < {self.sql.placeholder}"
                f"{self._groups(groups)}")


def open_transaction_ids(list_open: Callable[[str | None], Collection[str]],
                         producer_groups: Collection[str] | None) -> frozenset[str]:
    """The ids open at the broker (``list_open`` is ``broker.open_transactions``), of
    ``producer_groups`` only if given."""
    if producer_groups is None:
        return frozenset(list_open(None))
    return frozenset(tx for group in producer_groups for tx in list_open(group))


class _Batches:
    """One table's batches: timing, counts, pauses and progress."""

    def __init__(self, table: str, pause_s: float, progress: Progress | None) -> None:
        self.table, self.pause_s, self.progress = table, pause_s, progress
        self.started = time.monotonic()
        self.rows = self.batches = 0

    def done(self, deleted: int, kept_open: int = 0) -> None:
        """Count a committed batch, announce it (``ROWS_PURGED``) and tell the progress callback."""
        self.rows += deleted
        self.batches += 1
        instrumentation.announce(instrumentation.ROWS_PURGED, table=self.table, rows=deleted)
        outcome = self.outcome(kept_open)
        log.debug("%s", outcome.summary())
        if self.progress is not None:
            self.progress(outcome)

    def outcome(self, kept_open: int = 0) -> TablePurge:
        return TablePurge(self.table, self.rows, self.batches, time.monotonic() - self.started, kept_open)

    def pause(self) -> None:
        if self.pause_s > 0:
            time.sleep(self.pause_s)


def _count(transaction: Transaction, statement: str, params: Sequence[object]) -> int:
    with transaction() as execute:
        ((count,),) = execute(statement, params)
    return int(count)


def _kept_open(transaction: Transaction, statements: PurgeSQL, before: object, groups: list[str],
               open_ids: frozenset[str]) -> int:
    """How many rows before ``before`` belong to open transactions."""
    ids = sorted(open_ids)
    return sum(_count(transaction, statements.count_transactions(groups, len(chunk)), [before, *groups, *chunk])
               for chunk in (ids[i:i + _ID_CHUNK] for i in range(0, len(ids), _ID_CHUNK)))


def database_now(transaction: Transaction, sql: OutboxSQL) -> datetime:
    """The database's clock, read in a transaction of its own."""
    with transaction() as execute:
        ((now,),) = execute(sql.read_now, ())
    return sql.database_time(now)


def purge_transaction_log(transaction: Transaction, sql: OutboxSQL, before: datetime,
                          list_open: Callable[[str | None], Collection[str]], options: PurgeOptions,
                          progress: Progress | None = None) -> TablePurge:
    """Delete the transaction_log rows created before ``before`` (the database's clock)
    whose transaction is not open at the broker, in batches (with ``dry_run``: count them).
    Each batch asks ``list_open`` (the broker's ``open_transactions``) after selecting its
    candidates (why: the module's docstring). A ``BrokerError`` stops the purge of the
    table: the outcome's ``skipped`` says why (its ``rows`` were deleted before)."""
    statements, moment = PurgeSQL(sql), sql.timestamp(before)
    groups = sorted(options.producer_groups or ())
    batches = _Batches(TRANSACTION_LOG, options.pause_s, progress)
    kept, cursor = 0, list[object]()
    try:
        if options.dry_run:
            total = _count(transaction, statements.count_transactions(groups), [moment, *groups])
            kept = _kept_open(transaction, statements, moment, groups,
                              open_transaction_ids(list_open, options.producer_groups))
            return TablePurge(TRANSACTION_LOG, total - kept, 0, 0.0, kept)
        while True:
            with transaction() as execute:
                found = execute(statements.old_transactions(groups, bool(cursor)),
                                [moment, *groups, *cursor, options.batch_size])
            if not found:
                return batches.outcome(kept)
            open_ids = open_transaction_ids(list_open, options.producer_groups)  # after the select
            doomed = [row[0] for row in found if row[0] not in open_ids]
            kept += len(found) - len(doomed)
            if doomed:
                with transaction() as execute:
                    deleted = execute(statements.delete_transactions(len(doomed)), [moment, *doomed])
                batches.done(len(deleted), kept)
            if len(found) < options.batch_size:
                return batches.outcome(kept)
            last_id, last_created_at = found[-1][0], found[-1][1]
            cursor = [last_created_at, last_created_at, last_id]
            batches.pause()
    except BrokerError as exc:
        return dataclasses.replace(batches.outcome(kept),
                                   skipped=f"the broker cannot say which transactions are open: {exc}")


def _purge_oldest(transaction: Transaction, table: str, delete: str, count: str, params: Sequence[object],
                  options: PurgeOptions, progress: Progress | None) -> TablePurge:
    """Run ``delete`` (parameters: ``params``, then the batch size; it returns a row per
    row deleted) in batches until one deletes fewer than a batch (``dry_run``: ``count``)."""
    if options.dry_run:
        return TablePurge(table, _count(transaction, count, params))
    batches = _Batches(table, options.pause_s, progress)
    while True:
        with transaction() as execute:
            deleted = len(execute(delete, [*params, options.batch_size]))
        if deleted == 0:
            return batches.outcome()
        batches.done(deleted)
        if deleted < options.batch_size:
            return batches.outcome()
        batches.pause()


def purge_consumed_messages(transaction: Transaction, sql: OutboxSQL, before: datetime, options: PurgeOptions,
                            progress: Progress | None = None) -> TablePurge:
    """Delete the consumed_message rows consumed before ``before`` (the database's clock),
    in batches (with ``dry_run``: count them)."""
    statements = PurgeSQL(sql)
    return _purge_oldest(transaction, CONSUMED_MESSAGE, statements.delete_consumed, statements.count_consumed,
                         [sql.timestamp(before)], options, progress)


def purge_stored_messages(transaction: Transaction, sql: OutboxSQL, before: datetime, options: PurgeOptions,
                          progress: Progress | None = None) -> TablePurge:
    """Delete the stored messages relayed before ``before`` (the database's clock), of
    ``options.producer_groups`` if given, in batches (with ``dry_run``: count them);
    unrelayed ones stay."""
    statements, groups = PurgeSQL(sql), sorted(options.producer_groups or ())
    return _purge_oldest(transaction, STORED_MESSAGE, statements.delete_relayed(groups),
                         statements.count_relayed(groups), [sql.timestamp(before), *groups], options, progress)


def transaction_log_age_s(policy: RetentionPolicy, options: PurgeOptions) -> float:
    """The age transaction_log rows are purged at: the override, else the policy's horizon
    with its margin; ``ConfigurationError`` for an override below the broker's own horizon
    (``policy.min_age_s``), where the broker may still check a transaction."""
    age_s = options.transaction_log_older_than_s
    if age_s is None:
        return policy.check_horizon_s
    if age_s < policy.min_age_s:
        raise ConfigurationError(
            f"transaction_log rows younger than {policy.min_age_s:g}s may still be checked by the broker "
            f"(transaction timeout {policy.transaction_timeout_s:g}s + check interval "
            f"{policy.check_interval_s:g}s x check max {policy.check_max}): {age_s:g}s is too young")
    return age_s


def purge(database: str, transaction: Transaction, sql: OutboxSQL, policy: RetentionPolicy,
          list_open: Callable[[str | None], Collection[str]], options: PurgeOptions | None = None,
          progress: Progress | None = None) -> PurgeReport:
    """Purge the framework tables of one database (named ``database`` in the report) by
    ``policy``; ``list_open`` is the broker's ``open_transactions``. Ages count from the
    database's clock, read when the purge begins. A ``BrokerError`` from ``list_open``
    stops transaction_log (reported in ``skipped``); the other tables are purged anyway.
    ``ConfigurationError`` for a transaction_log age below the broker's horizon."""
    options = options or PurgeOptions()
    aged_like_the_log = {TRANSACTION_LOG, STORED_MESSAGE} & set(options.tables)
    log_age_s = transaction_log_age_s(policy, options) if aged_like_the_log else 0.0
    now = database_now(transaction, sql)
    outcomes: list[TablePurge] = []
    if TRANSACTION_LOG in options.tables:
        outcome = purge_transaction_log(transaction, sql, now - timedelta(seconds=log_age_s), list_open, options,
                                        progress)
        if outcome.skipped is not None:
            log.warning("%s: not purging %s: %s", database, TRANSACTION_LOG, outcome.skipped)
        outcomes.append(outcome)
    if CONSUMED_MESSAGE in options.tables:
        age_s = options.consumed_message_older_than_s
        before = now - timedelta(seconds=policy.dedup_window_s if age_s is None else age_s)
        outcomes.append(purge_consumed_messages(transaction, sql, before, options, progress))
    if STORED_MESSAGE in options.tables:
        outcomes.append(purge_stored_messages(transaction, sql, now - timedelta(seconds=log_age_s), options,
                                              progress))
    report = PurgeReport(database, options.dry_run, tuple(outcomes))
    log.info("%s", report)
    return report
