"""What ``outbox reconcile`` checks before Spark starts, and the names it checks against.

Nothing here imports PySpark, so ``--help`` and bad input are answered without the
``spark`` extra's JVM. ``check_inputs`` opens nothing for writing: a SQLite file that does
not exist is an error, never created (SQLAlchemy would create it empty); a server database
is connected to once, to see that it answers and has the table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from .. import schema
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

FLAGS = ("committed", "rolled_back", "half_pending", "parked", "phantom", "lost",
         "duplicate_delivery", "duplicate_effect", "conflict", "stored_unrelayed", "unrelayed_stale")
#: What a threshold can gate on (a count of transactions with that flag).
GATES = (*FLAGS, "clock_skew")
#: How PostgreSQL inputs are read: JDBC when the driver is there (else SQLAlchemy, with a
#: warning), JDBC only (a missing driver is an error), or SQLAlchemy only.
POSTGRES_READS = ("auto", "jdbc", "sqlalchemy")
#: How long a server database may take to answer the check (seconds).
CONNECT_TIMEOUT_S = 10
TRANSACTION_LOG = "outbox_transaction_log"
CONSUMED_MESSAGE = "outbox_consumed_message"
#: Read when a producer database has it (store mode); never required.
STORED_MESSAGE = schema.STORED_MESSAGE


class InputError(ConfigurationError):
    """An input of the job is missing or unusable (found before Spark starts)."""


def export_files(export_dir: str | Path) -> dict[str, Path]:
    """The export's ``messages`` and ``deliveries`` files (Parquet preferred, else JSON lines).

    Raises ``InputError`` naming what is missing, before any Spark work starts.
    """
    folder = Path(export_dir)
    if not folder.is_dir():
        raise InputError(f"--broker-export {folder} is not a directory")
    files = {}
    for name in ("messages", "deliveries"):
        candidates = [folder / f"{name}.parquet", folder / f"{name}.jsonl"]
        found = next((path for path in candidates if path.exists()), None)
        if found is None:
            raise InputError(f"no {name}.parquet or {name}.jsonl in {folder}")
        files[name] = found
    return files


def _check_sqlite(option: str, url: str, database: str | None, table: str) -> None:
    """The SQLite file exists and has ``table``, read through a read-only connection."""
    if not database or database == ":memory:" or database.startswith("file:"):
        raise InputError(f"{option} {url}: give a SQLite file (sqlite:///path/to/file), not an in-memory database")
    path = Path(database)
    if not path.is_file():
        raise InputError(f"{option} {url}: no such SQLite file {path.resolve()}")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{option} {url}: cannot read {path}: {exc}") from None
    if found is None:
        raise InputError(f"{option} {url}: {path} has no {table} table (run the outbox migrations there, "
                         "or name the right file)")


def check_database(option: str, url: str, table: str) -> None:
    """One ``--producer-db``/``--consumer-db`` URL: it parses, a ``parquet://`` path exists, a
    SQLite file exists (opened read-only, never created) and a server database answers, and
    either has ``table``.

    Raises ``InputError`` saying which option and what is wrong.
    """
    if url.startswith("parquet://"):
        if not Path(url[len("parquet://"):]).exists():
            raise InputError(f"{option} {url}: no such file or directory")
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InputError(f"{option} {url!r} is not a database URL (sqlite:///path, postgresql+psycopg://..., "
                         "parquet:///path)") from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(option, parsed.render_as_string(hide_password=True), parsed.database, table)
    else:
        _check_server(option, parsed, table)


def _check_server(option: str, url: URL, table: str) -> None:
    """A server database answers (within ``CONNECT_TIMEOUT_S`` for PostgreSQL) and has ``table``."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    shown = url.render_as_string(hide_password=True)
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.get_backend_name() == "postgresql" else {}
    try:
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except (SQLAlchemyError, ImportError) as exc:  # an unknown dialect, or its driver is not installed
        raise InputError(f"{option} {shown}: {exc}") from None
    try:
        with engine.connect() as conn:
            found = inspect(conn).has_table(table)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise InputError(f"{option} {shown}: cannot read it: {reason}") from None
    finally:
        engine.dispose()
    if not found:
        raise InputError(f"{option} {shown} has no {table} table (run the outbox migrations there, "
                         "or name the right database)")


def check_inputs(producer_databases: list[str], consumer_databases: list[str], broker_export: str,
                 out_dir: str) -> None:
    """Every input of a run, before Spark starts; raises ``InputError`` on the first bad one."""
    if not producer_databases:
        raise InputError("give at least one --producer-db")
    for url in producer_databases:
        check_database("--producer-db", url, TRANSACTION_LOG)
    for url in consumer_databases:
        check_database("--consumer-db", url, CONSUMED_MESSAGE)
    export_files(broker_export)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory")
