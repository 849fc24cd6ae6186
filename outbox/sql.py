"""The framework tables' SQL, per dialect, as plain strings any driver runs; and what a
driver error means for the framework (a lock timeout, a missing table).

Both integrations run these statements: SQLAlchemy with ``exec_driver_sql``, Django on
its cursors. Supported: PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import ConfigurationError, SchemaMissingError
from .schema import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG

#: SQLSTATEs of PostgreSQL's lock_timeout and statement_timeout.
TIMEOUT_SQLSTATES = frozenset({"55P03", "57014"})
#: SQLSTATE of PostgreSQL's "relation does not exist".
UNDEFINED_TABLE_SQLSTATE = "42P01"

#: The placeholder of drivers that number their parameters (``$1``; asyncpg).
NUMBERED = "$"

#: How SQLite stores a timestamp (naive UTC text), as SQLAlchemy and Django write it.
_SQLITE_FORMAT = "%Y-%m-%d %H:%M:%S.%f"

#: Runs one statement with its parameters and returns the rows it produced (maybe none).
Execute = Callable[[str, Sequence[Any]], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class OutboxSQL:
    """The statements of one dialect, with the driver's placeholder (``%s``: psycopg and
    Django's cursors; ``?``: sqlite3 and aiosqlite; ``$``: numbered ``$1, $2, ...``, asyncpg)."""

    dialect: str
    placeholder: str = "%s"

    def _parameter(self, number: int) -> str:
        return f"${number}" if self.placeholder == NUMBERED else self.placeholder

    def _values(self, count: int) -> str:
        return ", ".join(self._parameter(n) for n in range(1, count + 1))

    @property
    def now(self) -> str:
        """The database's clock as an SQL expression, in the column's stored form:
        PostgreSQL's ``statement_timestamp()``; on SQLite UTC text to the millisecond, the
        format SQLAlchemy and Django write there. (No ``%`` in the statement: drivers with
        the ``format`` paramstyle, Django's SQLite cursor among them, read it as a
        placeholder or unescape it, depending on whether there are parameters.)"""
        if self.dialect == "sqlite":
            return "strftime(replace('#Y-#m-#d #H:#M:#f000', '#', char(37)), 'now')"
        return "statement_timestamp()"

    @property
    def read_now(self) -> str:
        """The database's clock (``database_time`` makes it a datetime)."""
        return f"SELECT {self.now}"

    @property
    def record_transaction(self) -> str:
        """The producer's insert; parameters: ``fence.row_params(...)``. ``created_at`` is
        the database's clock, never the producer host's (retention ages rows by it)."""
        return (f"INSERT INTO {TRANSACTION_LOG} (transaction_id, producer_group, state, created_at) "
                f"VALUES ({self._values(3)}, {self.now})")

    @property
    def fence(self) -> str:
        """The checker's insert-if-absent; parameters: ``fence.row_params(...)``."""
        return f"{self.record_transaction} ON CONFLICT (transaction_id) DO NOTHING"

    @property
    def read_state(self) -> str:
        """The row's state; parameter: the transaction id."""
        return f"SELECT state FROM {TRANSACTION_LOG} WHERE transaction_id = {self._parameter(1)}"

    @property
    def record_consumed(self) -> str:
        """The idempotent consumer's insert; parameters: ``ConsumedRow.params(...)``.
        ``consumed_at`` is the database's clock."""
        return (f"INSERT INTO {CONSUMED_MESSAGE} (consumer_group, message_id, topic, transaction_id, "
                f"consumed_at) VALUES ({self._values(4)}, {self.now})")

    @property
    def store_message(self) -> str:
        """A call's stored message (store mode); parameters: message id, transaction id,
        producer group, topic, message group (or None), the encoded message
        (``outbox.stored.store_messages``). ``seq`` numbers the rows in the order stored."""
        return (f"INSERT INTO {STORED_MESSAGE} (message_id, transaction_id, producer_group, topic, message_group, "
                f"message, created_at) VALUES ({self._values(6)}, {self.now})")

    @property
    def group_waiting(self) -> str:
        """A row if a message group's stored messages wait for the relay; parameters:
        producer group, message group."""
        return (f"SELECT 1 FROM {STORED_MESSAGE} WHERE relayed_at IS NULL AND producer_group = {self._parameter(1)} "
                f"AND message_group = {self._parameter(2)} LIMIT 1")

    def claim_stored(self, limit: int) -> str:
        """The relay's next unrelayed rows (seq, transaction id, producer group, message),
        oldest first, locked for its transaction; rows another relay holds are skipped
        (PostgreSQL's ``SKIP LOCKED``; on SQLite the relay's ``BEGIN IMMEDIATE`` takes the
        whole database)."""
        lock = " FOR UPDATE SKIP LOCKED" if self.dialect == "postgresql" else ""
        return (f"SELECT seq, transaction_id, producer_group, message FROM {STORED_MESSAGE} "
                f"WHERE relayed_at IS NULL ORDER BY seq LIMIT {int(limit)}{lock}")

    def group_head(self, limit: int) -> str:
        """The seqs of a message group's oldest unrelayed rows; parameters: producer group,
        message group. A relay hands over a group's rows only from its head on."""
        return (f"SELECT seq FROM {STORED_MESSAGE} WHERE relayed_at IS NULL AND producer_group = "
                f"{self._parameter(1)} AND message_group = {self._parameter(2)} ORDER BY seq LIMIT {int(limit)}")

    def mark_relayed(self, count: int) -> str:
        """Sets ``relayed_at`` (the database's clock) on ``count`` rows; parameters: their seqs."""
        return f"UPDATE {STORED_MESSAGE} SET relayed_at = {self.now} WHERE seq IN ({self._values(count)})"

    @property
    def stored_backlog(self) -> str:
        """Per producer group: unrelayed rows and the oldest one's ``created_at``."""
        return (f"SELECT producer_group, count(*), min(created_at) FROM {STORED_MESSAGE} "
                "WHERE relayed_at IS NULL GROUP BY producer_group")

    @property
    def begin(self) -> str:
        """Starts the checker's transaction (SQLite: takes the write lock at once)."""
        return "BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN"

    def connection_setup(self, lock_timeout_ms: int) -> list[str]:
        """Before the checker's transaction begins: on SQLite the busy timeout of its own
        connection is the lock timeout."""
        return [f"PRAGMA busy_timeout = {int(lock_timeout_ms)}"] if self.dialect == "sqlite" else []

    def transaction_setup(self, lock_timeout_ms: int, statement_timeout_ms: int) -> list[str]:
        """First statements of the checker's transaction (PostgreSQL's timeouts)."""
        if self.dialect != "postgresql":
            return []
        return [f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'",
                f"SET LOCAL statement_timeout = '{int(statement_timeout_ms)}ms'"]

    def timestamp(self, moment: datetime) -> object:
        """``moment`` as the driver stores it: aware for PostgreSQL; naive UTC text on
        SQLite, the format SQLAlchemy and Django both write and read there."""
        if self.dialect == "sqlite":
            return moment.astimezone(UTC).strftime(_SQLITE_FORMAT)
        return moment

    def database_time(self, value: object) -> datetime:
        """A value of ``read_now`` (or of a timestamp column) as an aware datetime."""
        if isinstance(value, str):
            return datetime.strptime(value, _SQLITE_FORMAT).replace(tzinfo=UTC)
        if not isinstance(value, datetime):
            raise TypeError(f"not a database timestamp: {value!r}")
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def outbox_sql(dialect: str, placeholder: str = "%s") -> OutboxSQL:
    """The statements of ``dialect`` (``postgresql`` or ``sqlite``); ``ConfigurationError``
    for any other database."""
    if dialect not in ("postgresql", "sqlite"):
        raise ConfigurationError(f"the outbox tables work on PostgreSQL and SQLite, not {dialect}")
    return OutboxSQL(dialect, placeholder)


def driver_errors(exc: BaseException) -> list[BaseException]:
    """``exc`` and the driver errors it wraps (SQLAlchemy's ``orig``, Django's ``__cause__``)."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = getattr(current, "orig", None) or current.__cause__
    return found


def _sqlstate(error: BaseException) -> str | None:
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def is_timeout(exc: BaseException) -> bool:
    """Whether a driver error is a lock or statement timeout (a check answers UNKNOWN):
    SQLSTATE 55P03/57014 on PostgreSQL, ``database is locked`` on SQLite."""
    for error in driver_errors(exc):
        message = str(error).lower()
        if _sqlstate(error) in TIMEOUT_SQLSTATES or "lock timeout" in message \
                or "database is locked" in message:
            return True
    return False


def schema_missing(exc: BaseException, database: str, remedy: str) -> SchemaMissingError | None:
    """A ``SchemaMissingError`` if the driver error says a framework table does not exist
    (``remedy``: the command that creates it), else None."""
    for error in driver_errors(exc):
        message = str(error)
        missing = _sqlstate(error) == UNDEFINED_TABLE_SQLSTATE or "no such table" in message
        for table in (TRANSACTION_LOG, CONSUMED_MESSAGE, STORED_MESSAGE):
            if missing and table in message:
                return SchemaMissingError(f"table {table} does not exist in {database}: run {remedy}")
    return None
