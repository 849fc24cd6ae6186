"""Reading the three inputs into DataFrames.

Databases are given as SQLAlchemy URLs (or ``parquet:///path`` for a table already exported;
a producer's ``outbox_stored_message`` is then the file beside it whose name says
``stored_message`` where the transaction_log's says ``transaction_log``, see ``stored_path``).
A producer database's ``outbox_stored_message`` is read only when it has one (``has_table``).
PostgreSQL is read through JDBC when the session has the driver (see ``session``),
partitioned over a numeric column (``partitionColumn`` with bounds from a min/max query,
``numPartitions``, ``fetchsize``); without the driver, through SQLAlchemy in parallel
Spark tasks, each reading one range of the timestamp column in Arrow batches
(``_read_postgres_ranges``). SQLite is read through SQLAlchemy on the driver. The broker
export is Parquet or JSON lines.

A ``TimeWindow`` limits what is read, at the source: a WHERE on the table's timestamp
column (``TIME_COLUMNS``) in the database, a filter Spark pushes down into Parquet, or on
the export's ``store_ms`` (messages) and ``first_delivered_ms`` (deliveries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlalchemy import BigInteger, Column, String, create_engine, func, inspect, literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Select

from ..errors import ConfigurationError
from ..integrations.sqlalchemy.tables import consumed_message, stored_message, transaction_log
from .preflight import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG, export_files
from .session import HOW_TO_ADD_JDBC_DRIVER, has_postgres_driver, python_workers_here

log = logging.getLogger(__name__)

#: The timestamp column a window applies to, per table and per export file.
TIME_COLUMNS = {TRANSACTION_LOG: "created_at", CONSUMED_MESSAGE: "consumed_at", STORED_MESSAGE: "created_at"}
EXPORT_TIME_COLUMNS = {"messages": "store_ms", "deliveries": "first_delivered_ms"}

TRANSACTION_LOG_SCHEMA = "transaction_id string, producer_group string, state string, created_at timestamp"
CONSUMED_SCHEMA = ("consumer_group string, message_id string, topic string, transaction_id string, "
                   "consumed_at timestamp")
#: Of a stored message, only what the classification needs (not its bytes).
STORED_SCHEMA = "transaction_id string, topic string, created_at timestamp, relayed_at timestamp"
SCHEMAS = {TRANSACTION_LOG: TRANSACTION_LOG_SCHEMA, CONSUMED_MESSAGE: CONSUMED_SCHEMA, STORED_MESSAGE: STORED_SCHEMA}
#: The broker export contract. Both formats are read with it, so Spark starts no job to
#: infer a schema; a column an older export lacks (deliveries' ``transaction_id``) reads as null.
EXPORT_SCHEMAS = {
    "messages": ("message_id string, transaction_id string, producer_group string, topic string, queue_id int, "
                 "keys string, tag string, state string, born_ms bigint, store_ms bigint, commit_ms bigint, "
                 "copies int"),
    "deliveries": ("message_id string, consumer_group string, topic string, delivery_attempts int, "
                   "first_delivered_ms bigint, acked_ms bigint, dead_lettered boolean, transaction_id string"),
}
#: Rows per Arrow batch when a table is read through SQLAlchemy.
BATCH_ROWS = 50_000
#: A PostgreSQL table read through SQLAlchemy with fewer rows (in the window) than this is
#: read in one range: more tasks would cost more than they save.
SMALL_TABLE_ROWS = 50_000


class JdbcDriverMissingError(ConfigurationError):
    """JDBC was asked for PostgreSQL inputs, and the Spark session cannot load the driver."""


@dataclass(frozen=True)
class TimeWindow:
    """The rows to read: ``low_ms <= t < high_ms`` (epoch milliseconds; None is unbounded)."""

    low_ms: int | None = None
    high_ms: int | None = None


def _conditions(column: Any, window: TimeWindow | None, bound: Callable[[int], Any]) -> list[Any]:
    """``column >= low`` and ``column < high`` for the bounds the window has, each bound
    made by ``bound`` from epoch ms; for SQLAlchemy and Spark columns alike."""
    conditions = []
    if window is not None and window.low_ms is not None:
        conditions.append(column >= bound(window.low_ms))
    if window is not None and window.high_ms is not None:
        conditions.append(column < bound(window.high_ms))
    return conditions


def _where(frame: DataFrame, column: str, window: TimeWindow | None, timestamp: bool) -> DataFrame:
    """The frame's rows in the window, as a filter Spark pushes into Parquet scans;
    ``timestamp``: the column is a timestamp, else epoch ms."""
    bound = (lambda ms: F.timestamp_millis(F.lit(ms))) if timestamp else F.lit
    conditions = _conditions(F.col(column), window, bound)
    return frame.where(reduce(lambda a, b: a & b, conditions)) if conditions else frame


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def _datetime(ms: int) -> datetime:
    return _EPOCH + ms * _MILLISECOND


def _epoch_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // _MILLISECOND


def _sqlite_bound(ms: int) -> Any:
    """A bound as SQLite compares it, as text: whole seconds without a fraction, so that a
    stored ``12:00:00`` (Django's form) and ``12:00:00.000000`` (SQLAlchemy's) both sort
    where they belong."""
    moment = _datetime(ms).replace(tzinfo=None)
    return literal(str(moment) if moment.microsecond else moment.isoformat(" ", "seconds"), String)


def _time_column(table: str) -> Column[Any]:
    """The SQLAlchemy column a window applies to in ``table``."""
    source = {TRANSACTION_LOG: transaction_log, CONSUMED_MESSAGE: consumed_message,
              STORED_MESSAGE: stored_message}[table]
    return source.c[TIME_COLUMNS[table]]


def _select(table: str, schema: str, window: TimeWindow | None, dialect: str) -> Select[Any]:
    """The framework columns of ``table``, in the window, as SQLAlchemy selects them."""
    time_column = _time_column(table)
    bound = _sqlite_bound if dialect == "sqlite" else _datetime
    return select(*[time_column.table.c[name] for name in _column_names(schema)]).where(
        *_conditions(time_column, window, bound))


def _is_postgres(url: str) -> bool:
    return not url.startswith("parquet://") and make_url(url).get_backend_name() == "postgresql"


def use_jdbc(spark: SparkSession, postgres_read: str, urls: Iterable[str], partitions: int = 4) -> bool:
    """Whether PostgreSQL inputs go through JDBC; says once (a warning) when ``auto`` falls
    back to SQLAlchemy (``partitions`` range reads), raises ``JdbcDriverMissingError`` when
    ``jdbc`` cannot be had."""
    if postgres_read == "sqlalchemy" or not any(_is_postgres(url) for url in urls):
        return False
    if has_postgres_driver(spark):
        return True
    if postgres_read == "jdbc":
        raise JdbcDriverMissingError(
            f"PostgreSQL through JDBC was asked for, but this Spark session has no PostgreSQL JDBC "
            f"driver; {HOW_TO_ADD_JDBC_DRIVER}; or read through SQLAlchemy (--postgres-read auto)")
    log.warning("warning: no PostgreSQL JDBC driver in this Spark session; reading PostgreSQL through "
                "SQLAlchemy in %d parallel range reads (one for a table under %d rows). For JDBC, %s",
                max(1, partitions), SMALL_TABLE_ROWS, HOW_TO_ADD_JDBC_DRIVER)
    return False


def _jdbc_url(url: str) -> tuple[str, dict[str, str]]:
    parsed = make_url(url)
    jdbc = f"jdbc:postgresql://{parsed.host or '127.0.0.1'}:{parsed.port or 5432}/{parsed.database}"
    props = {"user": parsed.username or "postgres", "driver": "org.postgresql.Driver", "fetchsize": "10000"}
    if parsed.password:
        props["password"] = parsed.password
    return jdbc, props


def _column_names(schema: str) -> list[str]:
    return [part.split()[0] for part in schema.split(", ")]


def _read_postgres(spark: SparkSession, url: str, table: str, schema: str, partitions: int,
                   window: TimeWindow | None) -> DataFrame:
    """The framework columns through JDBC (never ``*``: Django's table has an ``id`` and a
    user's may have more), in the window, partitioned on the epoch of the table's timestamp
    column (bounds from a min/max query over the same window)."""
    query = _select(table, schema, window, "postgresql")
    epoch = func.extract("epoch", _time_column(table)).cast(BigInteger)
    engine = create_engine(url)
    with engine.connect() as conn:
        low, high = conn.execute(query.with_only_columns(
            func.coalesce(func.min(epoch), 0), func.coalesce(func.max(epoch), 0))).one()
    engine.dispose()
    jdbc, props = _jdbc_url(url)
    subquery = query.add_columns(epoch.label("_part")).compile(
        dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    frame = spark.read.jdbc(
        jdbc, f"({subquery}) AS src", column="_part", lowerBound=int(low), upperBound=int(high) + 1,
        numPartitions=max(1, partitions), properties=props,
    )
    return frame.drop("_part")


def _arrow_schema(schema: str) -> pa.Schema:
    """A Spark DDL schema of string and timestamp columns as Arrow (timestamps in UTC)."""
    types = {"string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([(name, types[kind]) for name, kind in (part.split() for part in schema.split(", "))])


def _arrow_batches(url: str, table: str, schema: str, window: TimeWindow | None) -> Iterator[pa.RecordBatch]:
    """The known columns in the window through SQLAlchemy, streamed in Arrow batches of
    ``BATCH_ROWS`` rows over a connection of their own."""
    arrow_schema = _arrow_schema(schema)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            result = conn.execution_options(yield_per=BATCH_ROWS).execute(
                _select(table, schema, window, engine.dialect.name))
            for rows in result.partitions():
                columns = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(values, type=column.type) for values, column in zip(columns, arrow_schema, strict=True)],
                    schema=arrow_schema)
    finally:
        engine.dispose()


def _read_sqlalchemy(spark: SparkSession, url: str, table: str, schema: str,
                     window: TimeWindow | None) -> DataFrame:
    """Any SQLAlchemy database, read on the driver (a SQLite file may be on no executor)."""
    batches = list(_arrow_batches(url, table, schema, window))
    return spark.createDataFrame(pa.Table.from_batches(batches, _arrow_schema(schema)), schema)


def _ranges(url: str, table: str, window: TimeWindow | None, partitions: int) -> list[TimeWindow]:
    """The window split into up to ``partitions`` ranges of equal time between the first and
    last row in it (one min/max/count query), one range for a small table. The outer ranges
    reach the window's own ends, so a row written meanwhile falls in one range, never none."""
    column = _time_column(table)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            first, last, rows = conn.execute(
                select(func.min(column), func.max(column), func.count()).where(
                    *_conditions(column, window, _datetime))).one()
    finally:
        engine.dispose()
    window = window or TimeWindow()
    if rows < SMALL_TABLE_ROWS or partitions <= 1:
        return [window]
    low, high = _epoch_ms(first), _epoch_ms(last) + 1
    cuts = sorted({low + (high - low) * i // partitions for i in range(1, partitions)} - {low})
    edges = [window.low_ms, *cuts, window.high_ms]
    return [TimeWindow(start, end) for start, end in zip(edges, edges[1:], strict=False)]


def _read_postgres_ranges(spark: SparkSession, url: str, table: str, schema: str, partitions: int,
                          window: TimeWindow | None) -> DataFrame:
    """PostgreSQL without JDBC, in parallel: one Spark task per range of ``_ranges``, each
    streaming its range through SQLAlchemy as Arrow batches (executors need halfmoon and
    the database driver, and must reach the database)."""
    ranges = _ranges(url, table, window, partitions)

    def read(indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in indexes:
            for index in batch.column(0).to_pylist():
                yield from _arrow_batches(url, table, schema, ranges[index])

    python_workers_here(spark)
    return spark.range(len(ranges), numPartitions=len(ranges)).mapInArrow(read, schema)


def stored_path(transaction_log_path: str) -> Path | None:
    """Where a producer's stored messages are beside its transaction_log exported to Parquet:
    ``.../shop_transaction_log.parquet`` -> ``.../shop_stored_message.parquet``; None when the
    name does not say ``transaction_log``."""
    path = Path(transaction_log_path)
    if "transaction_log" not in path.name:
        return None
    return path.with_name(path.name.replace("transaction_log", "stored_message"))


def _parquet_path(url: str, table: str) -> Path | None:
    """The Parquet file or folder of ``table`` for a ``parquet://`` input (for
    ``STORED_MESSAGE``, the producer's transaction_log URL: see ``stored_path``)."""
    path = url[len("parquet://"):]
    return stored_path(path) if table == STORED_MESSAGE else Path(path)


def has_table(url: str, table: str) -> bool:
    """Whether the database (or, for ``parquet://``, the folder) has ``table``: the stored
    messages are read only where there are some, since older databases lack the table."""
    if url.startswith("parquet://"):
        path = _parquet_path(url, table)
        return path is not None and path.exists()
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return inspect(conn).has_table(table)
    finally:
        engine.dispose()


def read_table(spark: SparkSession, url: str, table: str, partitions: int = 4,
               jdbc: bool = True, window: TimeWindow | None = None) -> DataFrame:
    """One framework table from a database URL, tagged with its source, only the rows whose
    timestamp column is in ``window``; PostgreSQL through JDBC when ``jdbc`` (see
    ``use_jdbc``), else through SQLAlchemy in up to ``partitions`` parallel range reads."""
    schema = SCHEMAS[table]
    if url.startswith("parquet://"):  # a table exported to Parquet (large runs, benchmarks)
        path = _parquet_path(url, table)
        if path is None:
            raise ConfigurationError(f"{url}: no {table} beside a Parquet file not named *transaction_log*")
        frame = spark.read.schema(schema).parquet(str(path))  # a schema: no inference job
        return _where(frame, TIME_COLUMNS[table], window, timestamp=True).withColumn("source_db", F.lit(url))
    if jdbc and _is_postgres(url):
        frame = _read_postgres(spark, url, table, schema, partitions, window)
    elif _is_postgres(url):
        frame = _read_postgres_ranges(spark, url, table, schema, partitions, window)
    else:
        frame = _read_sqlalchemy(spark, url, table, schema, window)
    return frame.withColumn("source_db", F.lit(make_url(url).render_as_string(hide_password=True)))


def union_tables(spark: SparkSession, urls: list[str], table: str, partitions: int = 4,
                 jdbc: bool = True, window: TimeWindow | None = None) -> DataFrame:
    """The same table from several databases, as one DataFrame (each read in ``window``);
    the stored messages only of the databases that have the table (``has_table``)."""
    if table == STORED_MESSAGE:
        urls = [url for url in urls if has_table(url, table)]
    frames = [read_table(spark, url, table, partitions, jdbc, window) for url in urls]
    if not frames:
        return spark.createDataFrame([], SCHEMAS[table] + ", source_db string")
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def read_export(spark: SparkSession, export_dir: str | Path,
                window: TimeWindow | None = None) -> tuple[DataFrame, DataFrame]:
    """``messages`` and ``deliveries`` from the broker's export directory, in ``window``
    (messages by ``store_ms``, deliveries by ``first_delivered_ms``)."""
    tables = []
    for name, path in export_files(export_dir).items():
        reader = spark.read.schema(EXPORT_SCHEMAS[name])
        frame = reader.parquet(str(path)) if path.suffix == ".parquet" else reader.json(str(path))
        tables.append(_where(frame, EXPORT_TIME_COLUMNS[name], window, timestamp=False))
    return tables[0], tables[1]
