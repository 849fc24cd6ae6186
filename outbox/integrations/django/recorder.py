"""The transaction log on Django (the rule and the interface: ``outbox.transaction_log``).

``RECORDER`` runs the core's SQL (``outbox.sql``) on Django's cursors: the producer's
``record_committed`` and the consumer's ``record_consumed`` on an alias's connection, in
its ``atomic`` block; Django's ``DatabaseError`` is the family a check-back answers
UNKNOWN. The check (``fenced_answer``) runs on a
connection of its own to the alias's database, opened for the check and closed after
it: never on the caller's connection, which may be inside the very transaction the
check has to wait for. So a check called from anywhere (a view, a decorated function,
``answer_check_backs``' threads) waits on the producer's row as a separate client would.
On SQLite that connection's busy timeout is the lock timeout, and the database must be a
file (an in-memory database has no second connection).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, IntegrityError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from broker_embedded import Resolution

from ...errors import ConfigurationError
from ...sql import Execute, OutboxSQL, outbox_sql, schema_missing
from ...transaction_log import DEFAULT_STATEMENT_TIMEOUT_MS, TransactionLogRecorder
from .conf import outbox_settings


def alias_sql(connection: BaseDatabaseWrapper) -> OutboxSQL:
    """The core statements for a Django connection (Django's cursors take ``%s``)."""
    return outbox_sql(connection.vendor)


def run(connection: BaseDatabaseWrapper, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """One core statement on a Django connection; its rows, if any. ``SchemaMissingError``
    if a framework table is missing."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement, tuple(params) or None)
            return cursor.fetchall() if cursor.description else []
    except DatabaseError as exc:
        missing = schema_missing(exc, f"database {connection.alias!r} ({connection.settings_dict['NAME']})",
                                 f"`manage.py migrate halfmoon_outbox --database {connection.alias}`")
        if missing is not None:
            raise missing from exc
        raise


def _checker_connection(using: str) -> BaseDatabaseWrapper:
    name = str(connections.settings[using].get("NAME", ""))
    if connections.settings[using]["ENGINE"].endswith("sqlite3") and (
            name in ("", ":memory:") or "mode=memory" in name):
        raise ConfigurationError(f"database {using!r} is in memory: the outbox check needs a second "
                                 "connection to it, use a file")
    connection = connections.create_connection(using)
    connection.ensure_connection()
    connection.set_autocommit(True)  # the check begins its own transaction
    return connection


class DjangoRecorder(TransactionLogRecorder[str, str]):
    """The recorder on Django: rows on an alias's connection (in its ``atomic`` block),
    checks on a connection of their own to an alias's database."""

    database_errors = (DatabaseError,)
    integrity_error = IntegrityError

    def statements(self, db: str) -> tuple[Execute, OutboxSQL]:
        connection = connections[db]
        return functools.partial(run, connection), alias_sql(connection)

    @contextmanager
    def checker_transaction(self, database: str, lock_timeout_ms: int) -> Iterator[tuple[Execute, OutboxSQL]]:
        connection = _checker_connection(database)
        try:
            sql = alias_sql(connection)
            for statement in [*sql.connection_setup(lock_timeout_ms), sql.begin]:
                run(connection, statement, ())
            try:
                yield functools.partial(run, connection), sql
            except BaseException:
                run(connection, "ROLLBACK", ())
                raise
            run(connection, "COMMIT", ())
        finally:
            connection.close()


#: The one Django recorder (it keeps no state).
RECORDER = DjangoRecorder()
#: ``RECORDER``'s producer insert: ``record_committed(using, transaction_id, group)``.
record_committed = RECORDER.record_committed


def fenced_answer(transaction_id: str, producer_group: str | None = None, using: str = "default",
                  lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None) -> Resolution:
    """What the transaction_log of ``using`` says of ``transaction_id`` (fencing it if
    absent), checked on a connection of its own; UNKNOWN if its transaction still holds
    the row after the lock timeout (``OUTBOX['CHECK_LOCK_TIMEOUT_MS']`` unless given).
    ``producer_group`` defaults to ``OUTBOX['PRODUCER_GROUP']``."""
    conf = outbox_settings()
    return RECORDER.fence_and_read(using, transaction_id, producer_group or conf.producer_group,
                                   lock_timeout_ms or conf.check_lock_timeout_ms,
                                   statement_timeout_ms or DEFAULT_STATEMENT_TIMEOUT_MS)


def fence_on_group_database(transaction_id: str, producer_group: str) -> Resolution:
    """The fence on the ``DATABASES`` alias holding ``producer_group``'s transaction_log
    (a check-back's answer: the Celery task's and the producer's)."""
    using = outbox_settings().database_for(producer_group)
    return fenced_answer(transaction_id, producer_group=producer_group, using=using)
