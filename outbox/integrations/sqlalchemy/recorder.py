"""The transaction log on SQLAlchemy (the rule and the interface: ``outbox.transaction_log``).

``RECORDER`` runs the core's SQL (``outbox.sql``) with ``exec_driver_sql``: the
producer's ``record_committed`` and the consumer's ``record_consumed`` in a ``Session``'s
or ``Connection``'s transaction, ``check_transaction`` on a connection of its own from an
``Engine``. A missing table raises ``SchemaMissingError`` naming ``outbox migrate``;
SQLAlchemy's errors are the family a check-back answers UNKNOWN.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from ...sql import NUMBERED, Execute, OutboxSQL, outbox_sql, schema_missing
from ...transaction_log import TransactionLogRecorder

#: The core statements' placeholder for each DB-API paramstyle SQLAlchemy's drivers use.
PLACEHOLDERS = {"qmark": "?", "numeric_dollar": NUMBERED}


def sql_for(connection: Connection | Engine) -> OutboxSQL:
    """The core statements for this engine's dialect and driver placeholder (an async
    engine's sync ``Connection``, inside ``run_sync``, included)."""
    return _sql(connection.dialect.name, connection.dialect.paramstyle)


@functools.cache
def _sql(dialect: str, paramstyle: str) -> OutboxSQL:
    return outbox_sql(dialect, PLACEHOLDERS.get(paramstyle, "%s"))


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


class SQLAlchemyRecorder(TransactionLogRecorder[Connection | Session, Engine]):
    """The recorder on SQLAlchemy: rows in a ``Session``'s or ``Connection``'s
    transaction, checks on an ``Engine``."""

    database_errors = (SQLAlchemyError,)
    integrity_error = IntegrityError

    def statements(self, db: Connection | Session) -> tuple[Execute, OutboxSQL]:
        connection = db.connection() if isinstance(db, Session) else db
        return functools.partial(run, connection), sql_for(connection)

    @contextmanager
    def checker_transaction(self, database: Engine, lock_timeout_ms: int) -> Iterator[tuple[Execute, OutboxSQL]]:
        sql = sql_for(database)
        with database.connect() as conn:
            for statement in sql.connection_setup(lock_timeout_ms):  # no transaction may begin yet
                conn.connection.dbapi_connection.execute(statement)  # type: ignore[union-attr]
            with conn.begin():
                yield functools.partial(run, conn), sql


#: The one SQLAlchemy recorder (it keeps no state).
RECORDER = SQLAlchemyRecorder()
#: ``RECORDER``'s producer insert: ``record_committed(session_or_connection, transaction_id, group)``.
record_committed = RECORDER.record_committed
#: ``RECORDER``'s consumer insert: ``record_consumed(session_or_connection, row)``.
record_consumed = RECORDER.record_consumed
#: ``RECORDER``'s check: ``check_transaction(engine, transaction_id, group, lock_ms, statement_ms)``;
#: UNKNOWN when the lock or statement timeout expires (``outbox.check_transaction``).
check_transaction = RECORDER.fence_and_read
