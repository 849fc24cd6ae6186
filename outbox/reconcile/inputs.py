"""Reading the three inputs into DataFrames.

Databases are given as SQLAlchemy URLs (or ``parquet:///path`` for a table already exported).
PostgreSQL is read through JDBC when the session has the driver (see ``session``),
partitioned over a numeric column (``partitionColumn`` with bounds from a min/max query,
``numPartitions``, ``fetchsize``); without the driver it is read like SQLite: through
SQLAlchemy on the driver, in Arrow batches. The broker export is Parquet or JSON lines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from ..errors import ConfigurationError
from ..integrations.sqlalchemy.tables import consumed_message, transaction_log
from .session import HOW_TO_ADD_JDBC_DRIVER, has_postgres_driver

log = logging.getLogger("outbox.reconcile")

TRANSACTION_LOG = "outbox_transaction_log"
CONSUMED_MESSAGE = "outbox_consumed_message"

TRANSACTION_LOG_SCHEMA = "transaction_id string, producer_group string, state string, created_at timestamp"
CONSUMED_SCHEMA = ("consumer_group string, message_id string, topic string, transaction_id string, "
                   "consumed_at timestamp")
#: The broker export contract, for JSON lines (Parquet carries its own schema).
EXPORT_SCHEMAS = {
    "messages": ("message_id string, transaction_id string, producer_group string, topic string, queue_id int, "
                 "keys string, tag string, state string, born_ms bigint, store_ms bigint, commit_ms bigint, "
                 "copies int"),
    "deliveries": ("message_id string, consumer_group string, topic string, delivery_attempts int, "
                   "first_delivered_ms bigint, acked_ms bigint, dead_lettered boolean, transaction_id string"),
}
#: How PostgreSQL inputs are read: JDBC when the driver is there (else SQLAlchemy, with a
#: warning), JDBC only (a missing driver is an error), or SQLAlchemy only.
POSTGRES_READS = ("auto", "jdbc", "sqlalchemy")
#: Rows per Arrow batch when a table is read through SQLAlchemy.
BATCH_ROWS = 50_000


class JdbcDriverMissingError(ConfigurationError):
    """JDBC was asked for PostgreSQL inputs, and the Spark session cannot load the driver."""


def _is_postgres(url: str) -> bool:
    return not url.startswith("parquet://") and make_url(url).get_backend_name() == "postgresql"


def use_jdbc(spark: SparkSession, postgres_read: str, urls: Iterable[str]) -> bool:
    """Whether PostgreSQL inputs go through JDBC; says once (a warning) when ``auto`` falls
    back to SQLAlchemy, raises ``JdbcDriverMissingError`` when ``jdbc`` cannot be had."""
    if postgres_read == "sqlalchemy" or not any(_is_postgres(url) for url in urls):
        return False
    if has_postgres_driver(spark):
        return True
    if postgres_read == "jdbc":
        raise JdbcDriverMissingError(
            f"PostgreSQL through JDBC was asked for, but this Spark session has no PostgreSQL JDBC "
            f"driver; {HOW_TO_ADD_JDBC_DRIVER}; or read through SQLAlchemy (--postgres-read auto)")
    log.warning("warning: no PostgreSQL JDBC driver in this Spark session; reading PostgreSQL through "
                "SQLAlchemy on the driver (not in parallel). For JDBC, %s", HOW_TO_ADD_JDBC_DRIVER)
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


def _read_postgres(spark: SparkSession, url: str, table: str, schema: str, partitions: int) -> DataFrame:
    """The framework columns through JDBC (never ``*``: Django's table has an ``id`` and a
    user's may have more), partitioned on the epoch of the table's timestamp column."""
    time_column = "created_at" if table == TRANSACTION_LOG else "consumed_at"
    engine = create_engine(url)
    with engine.connect() as conn:
        low, high = conn.execute(text(
            f"SELECT coalesce(min(extract(epoch from {time_column}))::bigint, 0), "
            f"coalesce(max(extract(epoch from {time_column}))::bigint, 0) FROM {table}"
        )).one()
    engine.dispose()
    jdbc, props = _jdbc_url(url)
    columns = ", ".join(_column_names(schema))
    query = f"(SELECT {columns}, extract(epoch from {time_column})::bigint AS _part FROM {table}) AS src"
    frame = spark.read.jdbc(
        jdbc, query, column="_part", lowerBound=int(low), upperBound=int(high) + 1,
        numPartitions=max(1, partitions), properties=props,
    )
    return frame.drop("_part")


def _arrow_schema(schema: str) -> pa.Schema:
    """A Spark DDL schema of string and timestamp columns as Arrow (timestamps in UTC)."""
    types = {"string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([(name, types[kind]) for name, kind in (part.split() for part in schema.split(", "))])


def _read_sqlalchemy(spark: SparkSession, url: str, table: str, schema: str) -> DataFrame:
    """Any SQLAlchemy database: the known columns, streamed in Arrow batches into Spark."""
    source = {TRANSACTION_LOG: transaction_log, CONSUMED_MESSAGE: consumed_message}[table]
    arrow_schema = _arrow_schema(schema)
    batches = []
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execution_options(yield_per=BATCH_ROWS).execute(
                select(*[source.c[name] for name in arrow_schema.names]))
            for rows in result.partitions():
                columns = list(zip(*rows, strict=True))
                batches.append(pa.RecordBatch.from_arrays(
                    [pa.array(values, type=column.type) for values, column in zip(columns, arrow_schema, strict=True)],
                    schema=arrow_schema))
    finally:
        engine.dispose()
    return spark.createDataFrame(pa.Table.from_batches(batches, arrow_schema), schema)


def read_table(spark: SparkSession, url: str, table: str, partitions: int = 4,
               jdbc: bool = True) -> DataFrame:
    """One framework table from a database URL, tagged with its source; PostgreSQL through
    JDBC when ``jdbc`` (see ``use_jdbc``), else through SQLAlchemy."""
    schema = TRANSACTION_LOG_SCHEMA if table == TRANSACTION_LOG else CONSUMED_SCHEMA
    if url.startswith("parquet://"):  # a table exported to Parquet (large runs, benchmarks)
        frame = spark.read.parquet(url[len("parquet://"):]).select(*_column_names(schema))
        return frame.withColumn("source_db", F.lit(url))
    if jdbc and _is_postgres(url):
        frame = _read_postgres(spark, url, table, schema, partitions)
    else:
        frame = _read_sqlalchemy(spark, url, table, schema)
    return frame.withColumn("source_db", F.lit(make_url(url).render_as_string(hide_password=True)))


def union_tables(spark: SparkSession, urls: list[str], table: str, partitions: int = 4,
                 jdbc: bool = True) -> DataFrame:
    """The same table from several databases, as one DataFrame."""
    schema = TRANSACTION_LOG_SCHEMA if table == TRANSACTION_LOG else CONSUMED_SCHEMA
    frames = [read_table(spark, url, table, partitions, jdbc) for url in urls]
    if not frames:
        return spark.createDataFrame([], schema + ", source_db string")
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def export_files(export_dir: str | Path) -> dict[str, Path]:
    """The export's ``messages`` and ``deliveries`` files (Parquet preferred, else JSON lines).

    Raises ``FileNotFoundError`` naming what is missing, before any Spark work starts.
    """
    folder = Path(export_dir)
    files = {}
    for name in ("messages", "deliveries"):
        candidates = [folder / f"{name}.parquet", folder / f"{name}.jsonl"]
        found = next((path for path in candidates if path.exists()), None)
        if found is None:
            raise FileNotFoundError(f"no {name}.parquet or {name}.jsonl in {folder}")
        files[name] = found
    return files


def read_export(spark: SparkSession, export_dir: str | Path) -> tuple[DataFrame, DataFrame]:
    """``messages`` and ``deliveries`` from the broker's export directory."""
    tables = []
    for name, path in export_files(export_dir).items():
        if path.suffix == ".parquet":
            tables.append(spark.read.parquet(str(path)))
        else:
            tables.append(spark.read.schema(EXPORT_SCHEMAS[name]).json(str(path)))
    return tables[0], tables[1]
