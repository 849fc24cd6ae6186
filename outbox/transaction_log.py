"""The fenced transaction_log: what makes every check-back answer final.

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

No answer depends on clocks. Works on PostgreSQL (``SET LOCAL lock_timeout``,
``ON CONFLICT DO NOTHING``) and SQLite (busy timeout, ``INSERT OR IGNORE``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from broker_embedded import Resolution

from .errors import TransactionFencedError
from .integrations.sqlalchemy.tables import COMMITTED, ROLLED_BACK, transaction_log

log = logging.getLogger("outbox.transaction_log")

DEFAULT_LOCK_TIMEOUT_MS = 2000


def utcnow() -> datetime:
    return datetime.now(UTC)


def record_committed(db: Connection | Session, transaction_id: str, producer_group: str) -> None:
    """The producer's insert (first statement of its transaction); raises
    ``TransactionFencedError`` if a checker's fence got there first."""
    statement = transaction_log.insert().values(
        transaction_id=transaction_id, producer_group=producer_group, state=COMMITTED, created_at=utcnow()
    )
    try:
        db.execute(statement)
    except IntegrityError as exc:
        raise TransactionFencedError(
            f"transaction {transaction_id} was fenced by a check-back (answered ROLLBACK); "
            "it has been rolled back"
        ) from exc


def _fence_statement(dialect: str, transaction_id: str, producer_group: str):  # type: ignore[no-untyped-def]
    values = dict(transaction_id=transaction_id, producer_group=producer_group, state=ROLLED_BACK,
                  created_at=utcnow())
    if dialect == "postgresql":
        return postgresql.insert(transaction_log).values(**values).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(transaction_log).values(**values).on_conflict_do_nothing()
    return transaction_log.insert().values(**values)


def check_transaction(
    engine: Engine, transaction_id: str, producer_group: str, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
) -> Resolution:
    """Answer a check-back by the fencing rule (see the module docstring)."""
    dialect = engine.dialect.name
    try:
        with engine.connect() as conn:
            if dialect == "sqlite":  # on the raw connection: no transaction may begin yet
                conn.connection.dbapi_connection.execute(  # type: ignore[union-attr]
                    f"PRAGMA busy_timeout = {int(lock_timeout_ms)}"
                )
            with conn.begin():
                if dialect == "postgresql":
                    conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'"))
                try:
                    conn.execute(_fence_statement(dialect, transaction_id, producer_group))
                except IntegrityError:
                    pass  # other databases: the row exists, which is all the fence needs
                state = conn.execute(
                    select(transaction_log.c.state).where(transaction_log.c.transaction_id == transaction_id)
                ).scalar_one()
    except OperationalError as exc:
        if _is_lock_timeout(exc):
            log.info("check of %s: lock timeout after %d ms, answering UNKNOWN", transaction_id, lock_timeout_ms)
            return Resolution.UNKNOWN
        raise
    resolution = Resolution.COMMIT if state == COMMITTED else Resolution.ROLLBACK
    log.info("check of %s (group %s): %s", transaction_id, producer_group, resolution.value)
    return resolution


def _is_lock_timeout(exc: OperationalError) -> bool:
    code = getattr(exc.orig, "sqlstate", None)
    message = str(exc.orig).lower()
    return code == "55P03" or "lock timeout" in message or "database is locked" in message
