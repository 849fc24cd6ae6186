"""The reconciliation job on synthetic data with known anomalies, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, select

from outbox.integrations.sqlalchemy.tables import consumed_message, stored_message, transaction_log
from outbox.reconcile import ReconcileInputs, ReconcileOptions, reconcile
from outbox.reconcile.classify import ANOMALIES
from outbox.reconcile.cli import _thresholds, build_parser
from outbox.reconcile.session import has_postgres_driver, postgres_jdbc_jar
from outbox.reconcile.synthetic import (
    DELIVERIES_SCHEMA,
    MESSAGES_SCHEMA,
    RELAY_DELAY_MS,
    Synthetic,
    generate,
    write_export,
    write_sqlite,
)
from tests.conftest import unavailable

NOW = int(time.time() * 1000)


def _dataset(tmp_path: Path, n: int = 200, each: int = 3, producer_url: str | None = None, fmt: str = "parquet",
             consumer_url: str | None = None):
    data = generate(n, each, NOW)
    producer = producer_url or f"sqlite:///{tmp_path / 'producer.sqlite3'}"
    consumer = consumer_url or f"sqlite:///{tmp_path / 'consumer.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export", fmt)
    return data, ReconcileInputs([producer], [consumer], str(tmp_path / "export"))


@pytest.mark.spark
def test_every_anomaly_kind_is_counted_exactly(spark, tmp_path: Path) -> None:
    data, inputs = _dataset(tmp_path)
    # A second producer database repeats one transaction id and holds a state nobody writes;
    # it predates store mode: it has no outbox_stored_message table.
    extra = f"sqlite:///{tmp_path / 'producer2.sqlite3'}"
    engine = create_engine(extra)
    transaction_log.create(engine)
    with engine.begin() as conn:
        conn.execute(transaction_log.insert(), [
            {**data.transaction_log[0]},
            {"transaction_id": "tx-odd", "producer_group": "shop", "state": "PENDING",
             "created_at": data.transaction_log[0]["created_at"]},
        ])
    engine.dispose()
    inputs.producer_databases.append(extra)
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW))
    counts = result.summary["counts"]
    expected = {**data.expected, "transactions": data.expected["transactions"] + 1}
    for name, value in expected.items():
        assert counts[name] == value, name
    assert not result.passed
    assert set(result.summary["breached"]) == {"lost", "phantom", "duplicate_effect", "unrelayed_stale"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"] == counts
    for category in ("phantom", "lost", "duplicate_delivery", "duplicate_effect", "half_pending", "parked"):
        rows = pq.read_table(tmp_path / "out" / "anomalies" / f"category={category}").to_pylist()
        assert len(rows) == 3 and all(row[category] for row in rows), category
    phantoms = pq.read_table(tmp_path / "out" / "anomalies" / "category=phantom").to_pylist()
    assert all(not row["committed"] for row in phantoms)
    _assert_store_mode_classified(data, tmp_path / "out", inputs.producer_databases[0])
    checks = summary["sanity"]
    assert checks["clock_skew"] == 3
    assert checks["transaction_ids_in_several_producer_rows"] == 1
    assert checks["unknown_local_states"] == 1
    assert checks["consumed_duplicate_keys"] == 0
    latency = summary["latency_ms"]["commit_latency_ms"]
    assert latency["p50"] is not None and latency["max"] >= latency["p99"] >= latency["p50"]
    assert {t["topic"] for t in summary["per_topic"]} == {"topic0", "topic1", "topic2"}
    assert sum(t["transactions"] for t in summary["timeline"]) == counts["transactions"]
    # Every committed transaction lands in one commit-latency bucket, except the skewed ones
    # and those whose stored messages the broker does not hold yet.
    assert sum(summary["histograms"]["commit_latency_ms"]) == \
        counts["committed"] - counts["clock_skew"] - counts["stored_unrelayed"] - 3
    # The relay hop: local commit -> relayed, for the relayed stored transactions only (three
    # relayed after half a minute, three just before the run, minutes after their commit).
    relay = summary["latency_ms"]["relay_latency_ms"]
    assert sum(summary["histograms"]["relay_latency_ms"]) == 6
    assert RELAY_DELAY_MS <= relay["p50"] < RELAY_DELAY_MS + 1000 < 600_000 < relay["max"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "unrelayed_stale" in page and "start a relay" in page


def _assert_store_mode_classified(data: Synthetic, out: Path, producer: str) -> None:
    """Stored-then-relayed transactions are neither lost nor phantom; unrelayed ones are
    never lost; only those waiting past --max-unrelayed-seconds are unrelayed_stale, listed
    with the database they wait in."""
    stored = {row["transaction_id"] for row in data.stored}
    for category in ("lost", "phantom"):
        rows = pq.read_table(out / "anomalies" / f"category={category}").to_pylist()
        assert not stored & {row["transaction_id"] for row in rows}, category
    stale = pq.read_table(out / "anomalies" / "category=unrelayed_stale").to_pylist()
    assert {row["transaction_id"] for row in stale} == {
        row["transaction_id"] for row in data.stored if row["relayed_at"] is None
        and row["created_at"].timestamp() * 1000 < NOW - 3_600_000}
    assert len(stale) == 3 and all(row["stored"] == 2 and row["stored_unrelayed"] for row in stale)
    assert all(row["committed"] and row["producer_databases"] == [producer] for row in stale)


@pytest.mark.spark
def test_empty_inputs_give_an_empty_passing_report(spark, tmp_path: Path) -> None:
    _, inputs = _dataset(tmp_path, n=0, each=0)
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW))
    assert result.passed and result.summary["counts"]["transactions"] == 0
    assert "<svg" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.spark
def test_a_clean_jsonl_export_passes_and_the_window_filters(spark, tmp_path: Path) -> None:
    _, inputs = _dataset(tmp_path, n=100, each=0, fmt="jsonl")
    assert (tmp_path / "export" / "messages.jsonl").exists()
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW))
    assert result.passed and result.summary["counts"]["transactions"] == 100
    assert result.summary["counts"]["deliveries"] == result.summary["counts"]["consumptions"] == 100
    windowed = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "w"), now_ms=NOW, since_ms=NOW))
    assert windowed.summary["counts"]["transactions"] == 0


#: What the JDBC and the SQLAlchemy reads of the same PostgreSQL data must agree on.
COMPARED = ("counts", "anomalies", "latency_ms", "per_topic", "per_hour", "per_topic_counts", "timeline",
            "histograms", "sanity")


@pytest.mark.spark
@pytest.mark.postgres
def test_postgresql_through_jdbc_and_through_sqlalchemy_agree(spark, tmp_path: Path, postgres_url: str) -> None:
    data, inputs = _dataset(tmp_path, producer_url=postgres_url, consumer_url=postgres_url)
    through_sqlalchemy = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "sa"), now_ms=NOW,
                                                                   postgres_read="sqlalchemy"))
    for name, expected in data.expected.items():
        assert through_sqlalchemy.summary["counts"][name] == expected, name
    if not has_postgres_driver(spark):
        unavailable(f"no PostgreSQL JDBC driver in the test SparkSession ({postgres_jdbc_jar()} is missing: "
                    "apt-get install libpostgresql-jdbc-java); the JDBC half of this test did not run")
    through_jdbc = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "jdbc"), now_ms=NOW,
                                                             jdbc_partitions=3, postgres_read="jdbc"))
    for key in COMPARED:
        assert through_jdbc.summary[key] == through_sqlalchemy.summary[key], key


def _tamper(export: Path, consumer_url: str) -> None:
    """One delivery deleted, one phantom committed message, one duplicate write and one
    transaction consumed twice under two message ids."""
    messages = pq.read_table(export / "messages.parquet").to_pylist()
    deliveries = pq.read_table(export / "deliveries.parquet").to_pylist()
    deliveries = [row for row in deliveries if row["message_id"] != messages[5]["message_id"]]
    messages[7]["copies"] = 2
    messages.append({**messages[0], "message_id": "m-phantom", "transaction_id": "tx-phantom"})
    pq.write_table(pa.Table.from_pylist(messages, MESSAGES_SCHEMA), export / "messages.parquet")
    pq.write_table(pa.Table.from_pylist(deliveries, DELIVERIES_SCHEMA), export / "deliveries.parquet")
    engine = create_engine(consumer_url)
    with engine.begin() as conn:
        row = conn.execute(select(consumed_message).limit(1).offset(9)).one()._asdict()
        del row["id"]  # a row of its own: the table numbers it
        conn.execute(consumed_message.insert(), {**row, "message_id": row["message_id"] + "-again"})
    engine.dispose()


def _stored_waiting(producer_url: str, minutes: int) -> None:
    """A transaction committed ``minutes`` ago in store mode whose message no relay handed over."""
    at = datetime.fromtimestamp(NOW / 1000 - minutes * 60, UTC)
    engine = create_engine(producer_url)
    with engine.begin() as conn:
        conn.execute(transaction_log.insert(), {"transaction_id": "tx-waiting", "producer_group": "shop",
                                                "state": "COMMITTED", "created_at": at})
        conn.execute(stored_message.insert(), {"message_id": "m-waiting", "transaction_id": "tx-waiting",
                                               "producer_group": "shop", "topic": "topic0", "message": b"",
                                               "created_at": at})
    engine.dispose()


@pytest.mark.spark
def test_cli_catches_a_tampered_copy_and_the_report_renders(spark, tmp_path: Path) -> None:
    _, inputs = _dataset(tmp_path, n=60, each=0)
    clean = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "clean"), now_ms=NOW))
    assert clean.passed
    _tamper(Path(inputs.broker_export), inputs.consumer_databases[0])
    _stored_waiting(inputs.producer_databases[0], minutes=50)  # stale only by the limit given below
    out = tmp_path / "cli-out"
    run = subprocess.run(
        [sys.executable, "-m", "outbox.reconcile", "--producer-db", inputs.producer_databases[0],
         "--consumer-db", inputs.consumer_databases[0], "--broker-export", inputs.broker_export,
         "--out", str(out), "--master", "local[1]", "--threshold", "duplicate_delivery=0",
         "--max-unrelayed-seconds", "1800"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "FAIL" in run.stdout and "[reconcile" in run.stderr
    # Spark's start-up notices and WARN lines are quiet: the progress lines are the output
    # (besides the JVM's own notice of the vector module Spark adds, which it cannot silence).
    noise = [line for line in run.stderr.splitlines()
             if not line.startswith(("[reconcile", "WARNING: Using incubator modules"))]
    assert noise == [], run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["breached"] == {"lost": 1, "phantom": 1, "duplicate_effect": 1, "duplicate_delivery": 1,
                                   "unrelayed_stale": 1}
    assert summary["counts"]["transactions"] == 62 and summary["window"]["max_unrelayed_s"] == 1800
    report = out / "report.html"
    page = report.read_text()
    assert "<svg" in page
    assert "<script src" not in page and "<link" not in page and "url(" not in page  # opens offline
    assert_screenshot_not_blank(report, tmp_path)


def assert_screenshot_not_blank(report: Path, tmp_path: Path) -> None:
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        unavailable("Chromium is not installed (apt-get install chromium)")
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chrome'}", f"--screenshot={shot}", "--window-size=1280,2000",
         report.as_uri()],
        capture_output=True, timeout=120,
    )
    assert shot.exists(), "Chromium wrote no screenshot"
    colours = png_colour_count(shot.read_bytes())
    assert colours > 8, f"the report looks blank ({colours} colours)"


def png_colour_count(png: bytes) -> int:
    """Distinct RGB colours in a PNG (8-bit RGB/RGBA, no interlace), by zlib and struct."""
    import struct
    import zlib

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    channels = 4
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        chunk = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, _height, _depth, colour_type = struct.unpack(">IIBB", chunk[:10])
            channels = {2: 3, 6: 4}[colour_type]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    colours, previous = set(), bytearray(stride)
    row_start = 0
    while row_start < len(raw):
        kind, line = raw[row_start], bytearray(raw[row_start + 1:row_start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 255
        for x in range(0, stride, channels * 16):
            colours.add(bytes(line[x:x + 3]))
        previous = line
        row_start += 1 + stride
    return len(colours)


def test_options_reject_unknown_or_negative_thresholds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown thresholds"):
        ReconcileOptions(str(tmp_path), thresholds={"lots": 0})
    with pytest.raises(ValueError, match="negative"):
        ReconcileOptions(str(tmp_path), thresholds={"lost": -1})
    with pytest.raises(ValueError, match="negative"):
        ReconcileOptions(str(tmp_path), max_unrelayed_s=-1)
    assert ReconcileOptions(str(tmp_path)).thresholds["unrelayed_stale"] == 0  # fails the run by default
    assert ReconcileOptions(str(tmp_path), thresholds={"parked": 5}).thresholds == {"parked": 5}


@pytest.mark.spark
def test_a_relay_after_the_windows_reads_is_not_lost(spark, tmp_path: Path) -> None:
    """A transaction of a window three hours ago whose stored message was relayed ten minutes
    ago: the window's read of the broker messages stops an hour after the window, so an
    export from before deliveries named their transaction (joined through the messages)
    shows no delivery; it is not judged lost on that."""
    data = generate(0, 0, NOW)
    committed_ms, relayed_ms = NOW - 10_740_000, NOW - 600_000
    committed_at = datetime.fromtimestamp(committed_ms / 1000, UTC)
    data.transaction_log.append({"transaction_id": "tx-late", "producer_group": "shop", "state": "COMMITTED",
                                 "created_at": committed_at})
    data.stored.append({"message_id": "m-late", "transaction_id": "tx-late", "producer_group": "shop",
                        "topic": "topic0", "message_group": None, "message": b"", "created_at": committed_at,
                        "relayed_at": datetime.fromtimestamp(relayed_ms / 1000, UTC)})
    data.messages.append({"message_id": "m-late", "transaction_id": "tx-late", "producer_group": "shop",
                          "topic": "topic0", "queue_id": 0, "keys": "", "tag": "", "state": "committed",
                          "born_ms": relayed_ms, "store_ms": relayed_ms, "commit_ms": relayed_ms + 1, "copies": 1})
    data.deliveries.append({"message_id": "m-late", "consumer_group": "points", "topic": "topic0",
                            "delivery_attempts": 1, "first_delivered_ms": relayed_ms + 5, "acked_ms": relayed_ms + 6,
                            "dead_lettered": False, "transaction_id": None})
    producer, consumer = f"sqlite:///{tmp_path / 'p.sqlite3'}", f"sqlite:///{tmp_path / 'c.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export", with_delivery_transaction_ids=False)
    result = reconcile(spark, ReconcileInputs([producer], [], str(tmp_path / "export")),
                       ReconcileOptions(str(tmp_path / "out"), now_ms=NOW, since_ms=committed_ms - 60_000,
                                        until_ms=committed_ms + 60_000))
    counts = result.summary["counts"]
    assert counts["transactions"] == counts["committed"] == counts["stored"] == 1
    assert counts["deliveries"] == 0 and counts["lost"] == 0 and result.passed


def test_the_cli_gates_stale_stored_messages_by_default_and_max_unrelayed_allows_some() -> None:
    base = ["--producer-db", "sqlite://", "--broker-export", "x", "--out", "y"]
    args = build_parser().parse_args(base)
    assert _thresholds(args)["unrelayed_stale"] == 0 and args.max_unrelayed_seconds == 3600
    assert _thresholds(build_parser().parse_args([*base, "--max-unrelayed", "3"]))["unrelayed_stale"] == 3


@pytest.mark.spark
def test_a_window_reads_only_around_it_and_agrees_with_the_whole_run(spark, tmp_path: Path) -> None:
    data, inputs = _dataset(tmp_path, n=300, each=3)
    # A producer row two days before the window, with a state nobody writes: read only by the whole run.
    far = {**data.transaction_log[0], "transaction_id": "tx-far", "state": "PENDING",
           "created_at": datetime.fromtimestamp((NOW - 2 * 86_400_000) / 1000, UTC)}
    engine = create_engine(inputs.producer_databases[0])
    with engine.begin() as conn:
        conn.execute(transaction_log.insert(), [far])
    engine.dispose()
    whole = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "whole"), now_ms=NOW))
    since, until = NOW - 600_000 - 200_000, NOW - 600_000 - 100_000  # synthetic rows span 327 s before that
    windowed = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "window"), now_ms=NOW,
                                                         since_ms=since, until_ms=until))
    assert whole.summary["sanity"]["unknown_local_states"] == 1
    assert windowed.summary["sanity"]["unknown_local_states"] == 0  # never read
    counts = windowed.summary["counts"]
    assert 0 < counts["transactions"] < whole.summary["counts"]["transactions"]
    for category in ANOMALIES:
        folder = tmp_path / "whole" / "anomalies" / f"category={category}"
        rows = pq.read_table(folder).to_pylist() if folder.exists() else []
        assert counts[category] == sum(1 for row in rows if since <= row["event_ms"] < until), category
