"""The transaction log: the fencing rule that makes every check-back answer final, and
the recorder interface each ORM implements (ORM-free).

* The producer inserts its row (COMMITTED) as the first statement of its local
  transaction, so the row's key is held until that transaction ends.
* The checker inserts a ROLLED_BACK row for the same id if absent, waiting at most a lock
  timeout, then reads the row:
  - the local transaction is still running: the insert waits for it; its commit makes the
    answer COMMIT, its rollback lets the fence in and the answer is ROLLBACK;
  - the local transaction has not started: the fence wins, and that transaction fails on
    its own insert (``TransactionFencedError``), so it never commits after the broker was
    told ROLLBACK;
  - the lock timeout expires: UNKNOWN, and the broker checks again later.

No answer depends on clocks. PostgreSQL: ``SET LOCAL lock_timeout`` and
``statement_timeout`` in the checker's transaction (a statement that outlives either
answers UNKNOWN). SQLite: the busy timeout of the checker's own connection. The
statements are in ``outbox.sql``.

``TransactionLogRecorder`` is what an ORM supplies: ``record_committed`` (the producer's
insert), ``fence_and_read`` (the check, on a connection of its own) and
``record_consumed`` (the idempotent consumer's insert), with its driver errors translated
here, once: a duplicate key is ``TransactionFencedError`` or ``AlreadyConsumed``, a lock or
statement timeout is UNKNOWN, and ``database_errors`` names the ORM's error family that a
check-back answers UNKNOWN (``outbox.check_back``). One implementation per ORM:
``outbox.integrations.sqlalchemy.recorder``, ``outbox.integrations.django.recorder``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import ClassVar, Generic, TypeVar

from broker_embedded import Resolution

from . import instrumentation
from .errors import TransactionFencedError
from .idempotency import AlreadyConsumed, ConsumedRow
from .schema import COMMITTED, DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS, ROLLED_BACK
from .sql import Execute, OutboxSQL, is_timeout

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_LOCK_TIMEOUT_MS", "DEFAULT_STATEMENT_TIMEOUT_MS", "TransactionLogRecorder", "fenced_error",
           "resolution_of", "row_params"]

#: What an ORM's recorder writes in: the caller's transaction (a session, an alias).
Db = TypeVar("Db")
#: What its check runs on, with a connection of its own (an engine, an alias).
Database = TypeVar("Database")


def row_params(transaction_id: str, producer_group: str, state: str) -> tuple[object, ...]:
    """The parameters of ``record_transaction`` and ``fence``, in their order (the row's
    ``created_at`` is the database's clock)."""
    return transaction_id, producer_group, state


def fenced_error(transaction_id: str, producer_group: str) -> TransactionFencedError:
    """The producer's insert found the checker's fence: announced as ``TRANSACTION_FENCED``."""
    instrumentation.announce(instrumentation.TRANSACTION_FENCED, producer_group=producer_group,
                             transaction_id=transaction_id)
    return TransactionFencedError(
        f"transaction {transaction_id} was fenced by a check-back (answered ROLLBACK); it has been rolled back"
    )


def resolution_of(state: str) -> Resolution:
    """The check-back answer a transaction_log state means."""
    return Resolution.COMMIT if state == COMMITTED else Resolution.ROLLBACK


class TransactionLogRecorder(ABC, Generic[Db, Database]):
    """The framework's rows on one ORM's connections: the producer's, the checker's fence,
    the idempotent consumer's. An ORM gives the two ways it runs the core's statements
    (``statements``, ``checker_transaction``) and its error family; the rule and the
    translation of its errors are here."""

    #: The ORM's database errors: a check-back that meets one (an unreachable or locked
    #: database) answers UNKNOWN, and the broker asks again.
    database_errors: ClassVar[tuple[type[Exception], ...]]
    #: The ORM's error for a duplicate key.
    integrity_error: ClassVar[type[Exception]]

    @abstractmethod
    def statements(self, db: Db) -> tuple[Execute, OutboxSQL]:
        """How to run the core's statements in ``db``'s current transaction, and which."""

    @abstractmethod
    def checker_transaction(self, database: Database,
                            lock_timeout_ms: int) -> AbstractContextManager[tuple[Execute, OutboxSQL]]:
        """A transaction of its own on ``database`` (never the caller's connection), its
        lock timeout set: committed at the end, rolled back on an error."""

    def record_committed(self, db: Db, transaction_id: str, producer_group: str) -> None:
        """The producer's insert, first statement of its transaction in ``db``;
        ``TransactionFencedError`` if a checker's fence got there first."""
        execute, sql = self.statements(db)
        try:
            execute(sql.record_transaction, row_params(transaction_id, producer_group, COMMITTED))
        except self.integrity_error as exc:
            raise fenced_error(transaction_id, producer_group) from exc

    def record_consumed(self, db: Db, row: ConsumedRow) -> None:
        """The idempotent consumer's insert in ``db``'s transaction; ``AlreadyConsumed``
        for a message the group already handled."""
        execute, sql = self.statements(db)
        try:
            execute(sql.record_consumed, row.params())
        except self.integrity_error:
            raise AlreadyConsumed from None

    def fence_and_read(self, database: Database, transaction_id: str, producer_group: str,
                       lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                       statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS) -> Resolution:
        """The check-back's answer on ``database``: the fence (a ROLLED_BACK row if there is
        none), then the row's state; UNKNOWN when the lock or statement timeout expires."""
        try:
            with self.checker_transaction(database, lock_timeout_ms) as (execute, sql):
                for statement in sql.transaction_setup(lock_timeout_ms, statement_timeout_ms):
                    execute(statement, ())
                execute(sql.fence, row_params(transaction_id, producer_group, ROLLED_BACK))
                (row,) = execute(sql.read_state, (transaction_id,))
        except Exception as exc:
            if not is_timeout(exc):
                raise
            log.info("check of %s: %s; answering UNKNOWN", transaction_id, str(exc).partition("\n")[0])
            return Resolution.UNKNOWN
        resolution = resolution_of(row[0])
        log.info("check of %s (group %s): %s", transaction_id, producer_group, resolution.value)
        return resolution
