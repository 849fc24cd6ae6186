"""The fenced transaction_log on a SQLAlchemy engine or session (the rule: ``outbox.fence``).

``record_committed`` is the producer's insert, the first statement of its transaction;
``check_transaction`` answers a check-back on a connection of its own. Both run the
core's SQL (``outbox.sql``) with ``exec_driver_sql``; a missing table raises
``SchemaMissingError`` naming ``outbox migrate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from broker_embedded import Resolution

from ...fence import (
    DEFAULT_LOCK_TIMEOUT_MS,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    fence_and_read,
    fenced_error,
    row_params,
    unknown_on_timeout,
)
from ...schema import COMMITTED
from ...sql import NUMBERED, OutboxSQL, outbox_sql, schema_missing

#: The core statements' placeholder for each DB-API paramstyle SQLAlchemy's drivers use.
PLACEHOLDERS = {"qmark": "?", "numeric_dollar": NUMBERED}


def sql_for(connection: Connection | Engine) -> OutboxSQL:
    """The core statements for this engine's dialect and driver placeholder (an async
    engine's sync ``Connection``, inside ``run_sync``, included)."""
    dialect = connection.dialect
    return outbox_sql(dialect.name, PLACEHOLDERS.get(dialect.paramstyle, "%s"))


def run(connection: Connection, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """One core statement on ``connection``; its rows, if it returns any.
    ``SchemaMissingError`` if a framework table is missing."""
    try:
        result = connection.exec_driver_sql(statement, tuple(params))
    except DBAPIError as exc:
        missing = schema_missing(exc, connection.engine.url.render_as_string(hide_password=True),
                                 "`outbox migrate --database-url URL`")
        if missing is not None:
            raise missing from exc
        raise
    return result.fetchall() if result.returns_rows else []


def record_committed(db: Connection | Session, transaction_id: str, producer_group: str) -> None:
    """The producer's insert (first statement of its transaction); raises
    ``TransactionFencedError`` if a checker's fence got there first."""
    connection = db.connection() if isinstance(db, Session) else db
    sql = sql_for(connection)
    try:
        run(connection, sql.record_transaction, row_params(transaction_id, producer_group, COMMITTED))
    except IntegrityError as exc:
        raise fenced_error(transaction_id, producer_group) from exc


def check_transaction(
    engine: Engine, transaction_id: str, producer_group: str, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
) -> Resolution:
    """Answer a check-back by the fencing rule on a connection of ``engine``; UNKNOWN when
    the lock or statement timeout expires."""
    sql = sql_for(engine)

    def check() -> Resolution:
        with engine.connect() as conn:
            for statement in sql.connection_setup(lock_timeout_ms):  # no transaction may begin yet
                conn.connection.dbapi_connection.execute(statement)  # type: ignore[union-attr]
            with conn.begin():
                return fence_and_read(lambda s, p: run(conn, s, p), sql, transaction_id, producer_group,
                                      lock_timeout_ms, statement_timeout_ms)

    return unknown_on_timeout(transaction_id, check)
