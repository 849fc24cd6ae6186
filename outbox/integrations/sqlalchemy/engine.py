"""Engines the fence works on: SQLite needs ``BEGIN IMMEDIATE`` semantics.

PostgreSQL needs nothing: the producer's transaction_log insert holds the row's unique
key until its transaction ends, and the checker's insert waits on it. SQLite locks the
whole database instead, and a deferred ``BEGIN`` takes no lock until the first write, so
a transaction that read first can fail to upgrade its lock (``database is locked``) rather
than wait. ``prepare_engine`` makes every transaction of the engine take the write lock at
``BEGIN IMMEDIATE`` (waiting up to the busy timeout), in WAL mode so readers outside
transactions are not blocked. Use it for producers and checkers on SQLite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy import Engine, event

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: How long (ms) a SQLite transaction waits for the write lock at BEGIN.
SQLITE_BUSY_TIMEOUT_MS = 30_000


def prepare_engine(engine: Engine) -> Engine:
    """Give a SQLite engine ``BEGIN IMMEDIATE`` transactions (no-op for other databases)."""
    if engine.dialect.name != "sqlite" or event.contains(engine, "begin", _begin_immediate):
        return engine
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _begin_immediate)
    return engine


def create_engine(url: str, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` followed by :func:`prepare_engine`."""
    return prepare_engine(sqlalchemy.create_engine(url, **kwargs))


def create_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """``sqlalchemy.ext.asyncio.create_async_engine`` (``sqlite+aiosqlite``,
    ``postgresql+asyncpg``, ...) with :func:`prepare_engine` applied to its sync engine."""
    from sqlalchemy.ext.asyncio import create_async_engine as create

    engine = create(url, **kwargs)
    prepare_engine(engine.sync_engine)
    return engine


def checker_engine(url: str, connect_timeout_s: int) -> Engine:
    """An engine for answering check-backs: a PostgreSQL connection attempt gives up after
    ``connect_timeout_s`` (psycopg's own default is 130 s), so a database that accepts
    connections and never answers costs a check that long instead of a worker thread."""
    postgres = sqlalchemy.make_url(url).get_backend_name() == "postgresql"
    return create_engine(url, pool_pre_ping=True,
                         connect_args={"connect_timeout": connect_timeout_s} if postgres else {})


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # the driver must not emit its own BEGIN
    dbapi_connection.execute("PRAGMA journal_mode=WAL")
    dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


def _begin_immediate(conn: sqlalchemy.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")
