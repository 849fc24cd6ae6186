"""Reading the reconciliation inputs: windows pushed down to every kind of source."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from sqlalchemy import create_engine, text

from outbox.integrations.sqlalchemy.tables import (
    consumed_message,
    metadata,
    stored_message,
    transaction_log,
)
from outbox.reconcile import inputs
from outbox.reconcile.inputs import (
    TIME_COLUMNS,
    TimeWindow,
    has_table,
    read_export,
    read_table,
    union_tables,
)
from outbox.reconcile.preflight import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG
from outbox.reconcile.session import has_postgres_driver
from outbox.reconcile.synthetic import DELIVERIES_SCHEMA, MESSAGES_SCHEMA
from tests.conftest import unavailable

START = datetime(2024, 3, 1, tzinfo=UTC)
START_MS = int(START.timestamp() * 1000)
MINUTE_MS = 60_000
#: Rows one minute and a few ms apart; the window holds minutes 20 to 39.
ROWS = 60
WINDOW = TimeWindow(START_MS + 20 * MINUTE_MS, START_MS + 40 * MINUTE_MS)


def _ms(i: int) -> int:
    return START_MS + i * MINUTE_MS + i % 7


def _in(window: TimeWindow, ms: int) -> bool:
    return (window.low_ms is None or ms >= window.low_ms) and (window.high_ms is None or ms < window.high_ms)


def _tables(n: int = ROWS) -> dict[str, list[dict[str, Any]]]:
    """The framework tables' columns the job reads, ``n`` rows each; every third consumption
    without a transaction id, every other stored message not relayed yet."""
    at = [START + timedelta(milliseconds=_ms(i) - START_MS) for i in range(n)]
    return {
        TRANSACTION_LOG: [{"transaction_id": f"tx{i:03d}", "producer_group": "shop", "state": "COMMITTED",
                           "created_at": at[i]} for i in range(n)],
        CONSUMED_MESSAGE: [{"consumer_group": "points", "message_id": f"m{i:03d}", "topic": "t",
                            "transaction_id": None if i % 3 == 0 else f"tx{i:03d}", "consumed_at": at[i]}
                           for i in range(n)],
        STORED_MESSAGE: [{"transaction_id": f"tx{i:03d}", "topic": "t", "created_at": at[i],
                          "relayed_at": at[i] + timedelta(seconds=1) if i % 2 else None} for i in range(n)],
    }


def _expected(table: str, window: TimeWindow | None = WINDOW, n: int = ROWS) -> list[tuple[Any, ...]]:
    """The table's rows in the window (timestamps aware, in UTC)."""
    rows = _tables(n)[table]
    return sorted((*row.values(),) for row in rows
                  if window is None or _in(window, int(row[TIME_COLUMNS[table]].timestamp() * 1000)))


def _rows(frame: DataFrame) -> list[tuple[Any, ...]]:
    """The frame's rows without source_db. PySpark gives timestamps as naive datetimes in the
    process's local zone (which a Django test earlier in the run may have changed): made aware."""
    return sorted(tuple(value.astimezone(UTC) if isinstance(value, datetime) else value for value in row)[:-1]
                  for row in frame.collect())


def _write(url: str, n: int = ROWS) -> None:
    engine = create_engine(url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(transaction_log.insert(), _tables(n)[TRANSACTION_LOG])
        conn.execute(consumed_message.insert(), _tables(n)[CONSUMED_MESSAGE])
        conn.execute(stored_message.insert(), [
            {**row, "message_id": f"m{i:03d}", "producer_group": "shop", "message": b""}
            for i, row in enumerate(_tables(n)[STORED_MESSAGE])])
    engine.dispose()


@pytest.mark.spark
def test_a_window_filters_sqlite_tables_including_rows_stored_without_a_fraction(spark, sqlite_url: str) -> None:
    _write(sqlite_url)
    # Django stores 12:00:00 where SQLAlchemy stores 12:00:00.000000: one exactly on each bound.
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        for name, ms in (("tx-on-low", WINDOW.low_ms), ("tx-on-high", WINDOW.high_ms)):
            assert ms is not None and ms % 1000 == 0
            conn.execute(text("INSERT INTO outbox_transaction_log VALUES (:id, 'shop', 'COMMITTED', :at)"),
                         {"id": name, "at": datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")})
    engine.dispose()

    rows = _rows(read_table(spark, sqlite_url, TRANSACTION_LOG, window=WINDOW))
    assert [row for row in rows if row[0].startswith("tx-on")] == [
        ("tx-on-low", "shop", "COMMITTED", datetime.fromtimestamp(WINDOW.low_ms / 1000, UTC))]
    assert [row for row in rows if not row[0].startswith("tx-on")] == _expected(TRANSACTION_LOG)
    open_ended = TimeWindow(low_ms=WINDOW.high_ms)
    consumed = union_tables(spark, [sqlite_url], CONSUMED_MESSAGE, window=open_ended)
    assert _rows(consumed) == _expected(CONSUMED_MESSAGE, open_ended)
    assert _rows(read_table(spark, sqlite_url, STORED_MESSAGE, window=WINDOW)) == _expected(STORED_MESSAGE)


@pytest.mark.spark
def test_databases_without_the_stored_message_table_add_no_stored_rows(spark, tmp_path: Path) -> None:
    with_table, without = f"sqlite:///{tmp_path / 'new.sqlite3'}", f"sqlite:///{tmp_path / 'old.sqlite3'}"
    _write(with_table)
    engine = create_engine(without)
    transaction_log.create(engine)  # a database from before store mode
    engine.dispose()
    assert has_table(with_table, STORED_MESSAGE) and not has_table(without, STORED_MESSAGE)
    frame = union_tables(spark, [without, with_table], STORED_MESSAGE, window=WINDOW)
    assert _rows(frame) == _expected(STORED_MESSAGE)
    assert union_tables(spark, [without], STORED_MESSAGE).count() == 0


def _postgres_with_poison(postgres_url: str) -> None:
    """The tables, plus a row on each side of the window that cannot be read: an infinite
    timestamp fails the epoch cast in PostgreSQL and the conversion in psycopg, so the
    reads below only pass when the window is applied in the database."""
    _write(postgres_url)
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        for name, at in (("tx-past", "-infinity"), ("tx-future", "infinity")):
            conn.execute(text("INSERT INTO outbox_transaction_log VALUES (:id, 'shop', 'COMMITTED', :at)"),
                         {"id": name, "at": at})
            conn.execute(text("INSERT INTO outbox_consumed_message (consumer_group, message_id, topic, "
                              "transaction_id, consumed_at) VALUES ('points', :id, 't', :id, :at)"),
                         {"id": name, "at": at})
            conn.execute(text("INSERT INTO outbox_stored_message (message_id, transaction_id, producer_group, "
                              "topic, message, created_at) VALUES (:id, :id, 'shop', 't', '', :at)"),
                         {"id": name, "at": at})
    engine.dispose()


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.parametrize("jdbc", [False, True], ids=["sqlalchemy", "jdbc"])
def test_a_window_is_applied_in_postgresql(spark, postgres_url: str, jdbc: bool) -> None:
    if jdbc and not has_postgres_driver(spark):
        unavailable("no PostgreSQL JDBC driver in the Spark session")
    _postgres_with_poison(postgres_url)
    with pytest.raises(Exception, match="infinity|out of range|too large"):
        read_table(spark, postgres_url, TRANSACTION_LOG, partitions=3, jdbc=jdbc).collect()
    for table in (TRANSACTION_LOG, CONSUMED_MESSAGE, STORED_MESSAGE):
        assert _rows(read_table(spark, postgres_url, table, partitions=3, jdbc=jdbc, window=WINDOW)) == \
            _expected(table), table


def _parquet_tables(folder: Path) -> dict[str, str]:
    """The tables as Parquet files, by the ``parquet://`` URL they are read from: the stored
    messages through the transaction_log's URL (they are found beside it)."""
    urls = {}
    for table, rows in _tables().items():
        path = folder / f"{table}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        urls[table] = f"parquet://{path}"
    urls[STORED_MESSAGE] = urls[TRANSACTION_LOG]
    return urls


@pytest.mark.spark
def test_a_window_is_pushed_into_parquet_tables(spark, tmp_path: Path) -> None:
    for table, url in _parquet_tables(tmp_path).items():
        frame = read_table(spark, url, table, window=WINDOW)
        assert _rows(frame) == _expected(table), table
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert "PushedFilters: [" in plan and f"GreaterThanOrEqual({TIME_COLUMNS[table]}" in plan


def _export_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = [{"message_id": f"m{i:03d}", "transaction_id": f"tx{i:03d}", "producer_group": "shop", "topic": "t",
                 "queue_id": 0, "keys": "", "tag": "", "state": "committed", "born_ms": _ms(i) - 1,
                 "store_ms": _ms(i), "commit_ms": _ms(i) + 5, "copies": 1} for i in range(ROWS)]
    # Delivered five minutes after being stored: a different set of rows is in the window.
    deliveries = [{"message_id": f"m{i:03d}", "consumer_group": "points", "topic": "t", "delivery_attempts": 1,
                   "first_delivered_ms": _ms(i) + 5 * MINUTE_MS, "acked_ms": _ms(i) + 5 * MINUTE_MS + 1,
                   "dead_lettered": False, "transaction_id": f"tx{i:03d}"} for i in range(ROWS)]
    return messages, deliveries


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_window_filters_the_export(spark, tmp_path: Path, fmt: str) -> None:
    import json

    messages, deliveries = _export_rows()
    for name, rows, schema in (("messages", messages, MESSAGES_SCHEMA), ("deliveries", deliveries, DELIVERIES_SCHEMA)):
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(rows, schema), tmp_path / f"{name}.parquet")
        else:
            (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    got_messages, got_deliveries = read_export(spark, tmp_path, WINDOW)
    assert sorted(row.message_id for row in got_messages.collect()) == \
        [row["message_id"] for row in messages if _in(WINDOW, row["store_ms"])]
    assert sorted(row.message_id for row in got_deliveries.collect()) == \
        [row["message_id"] for row in deliveries if _in(WINDOW, row["first_delivered_ms"])]
    if fmt == "parquet":
        plan = got_messages._jdf.queryExecution().executedPlan().toString()
        assert "GreaterThanOrEqual(store_ms" in plan


@pytest.mark.spark
def test_parquet_inputs_are_read_with_their_known_schema_without_a_spark_job(spark, tmp_path: Path) -> None:
    messages, deliveries = _export_rows()
    pq.write_table(pa.Table.from_pylist(messages, MESSAGES_SCHEMA), tmp_path / "messages.parquet")
    old_schema = DELIVERIES_SCHEMA.remove(DELIVERIES_SCHEMA.get_field_index("transaction_id"))
    pq.write_table(pa.Table.from_pylist(deliveries, old_schema), tmp_path / "deliveries.parquet")
    urls = _parquet_tables(tmp_path)
    group = "halfmoon-test-input-frames"
    context = spark.sparkContext
    context.setJobGroup(group, "building the input DataFrames")
    try:
        tables = {table: read_table(spark, url, table, window=WINDOW) for table, url in urls.items()}
        got_messages, got_deliveries = read_export(spark, tmp_path)
        assert context.statusTracker().getJobIdsForGroup(group) == []
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    # An export from before deliveries named their transaction: the column is there, null.
    assert got_deliveries.schema["transaction_id"].dataType.simpleString() == "string"
    assert {row.transaction_id for row in got_deliveries.collect()} == {None}
    assert got_messages.count() == ROWS
    for table, frame in tables.items():
        assert _rows(frame) == _expected(table), table


@pytest.mark.spark
@pytest.mark.postgres
def test_postgresql_without_jdbc_is_read_in_parallel_range_reads(spark, postgres_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    n = 300
    _write(postgres_url, n)
    reads = ["sqlalchemy", "jdbc"] if has_postgres_driver(spark) else ["sqlalchemy"]
    monkeypatch.setattr(inputs, "SMALL_TABLE_ROWS", 0)  # a few hundred rows, split all the same
    for table in (TRANSACTION_LOG, CONSUMED_MESSAGE):
        frame = read_table(spark, postgres_url, table, partitions=3, jdbc=False)
        assert frame.rdd.getNumPartitions() == 3, table
        per_task = frame.groupBy(F.spark_partition_id()).count().collect()
        assert len(per_task) == 3 and all(row["count"] >= n // 4 for row in per_task), (table, per_task)
        for read in reads:
            everything = read_table(spark, postgres_url, table, partitions=3, jdbc=read == "jdbc")
            assert _rows(everything) == _expected(table, None, n), (table, read)
        windowed = read_table(spark, postgres_url, table, partitions=3, jdbc=False, window=WINDOW)
        assert windowed.rdd.getNumPartitions() == 3
        assert _rows(windowed) == _expected(table, WINDOW, n), table
    monkeypatch.undo()
    small = read_table(spark, postgres_url, CONSUMED_MESSAGE, partitions=3, jdbc=False)
    assert small.rdd.getNumPartitions() == 1
    assert _rows(small) == _expected(CONSUMED_MESSAGE, None, n)
