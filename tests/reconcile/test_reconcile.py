"""The reconciliation job on synthetic data with known anomalies, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from outbox.reconcile import ReconcileInputs, ReconcileOptions, reconcile
from outbox.reconcile.synthetic import generate, write_export, write_sqlite

pytestmark = pytest.mark.spark
NOW = int(time.time() * 1000)


def _dataset(tmp_path: Path, n: int = 200, each: int = 3, producer_url: str | None = None):
    data = generate(n, each, NOW)
    producer = producer_url or f"sqlite:///{tmp_path / 'producer.sqlite3'}"
    consumer = f"sqlite:///{tmp_path / 'consumer.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export")
    return data, ReconcileInputs([producer], [consumer], str(tmp_path / "export"))


def test_every_anomaly_kind_is_counted_exactly(spark, tmp_path: Path) -> None:
    data, inputs = _dataset(tmp_path)
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW))
    counts = result.summary["counts"]
    for name, expected in data.expected.items():
        assert counts[name] == expected, name
    assert not result.passed
    assert set(result.summary["breached"]) == {"lost", "phantom", "duplicate_effect"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"] == counts
    phantoms = pq.read_table(tmp_path / "out" / "anomalies" / "phantom").to_pylist()
    assert len(phantoms) == 3 and all(not row["committed"] for row in phantoms)
    assert summary["sanity"]["clock_skew"] == 3
    latency = summary["latency_ms"]["commit_latency_ms"]
    assert latency["p50"] is not None and latency["max"] >= latency["p99"] >= latency["p50"]
    assert {t["topic"] for t in summary["per_topic"]} == {"topic0", "topic1", "topic2"}


def test_a_clean_dataset_passes_and_the_window_filters(spark, tmp_path: Path) -> None:
    data, inputs = _dataset(tmp_path, n=100, each=0)
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW))
    assert result.passed and result.summary["counts"]["transactions"] == 100
    windowed = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "w"), now_ms=NOW, since_ms=NOW))
    assert windowed.summary["counts"]["transactions"] == 0


@pytest.mark.postgres
def test_postgresql_through_jdbc(spark, tmp_path: Path, postgres_url: str) -> None:
    data, inputs = _dataset(tmp_path, producer_url=postgres_url)
    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=NOW, jdbc_partitions=3))
    for name, expected in data.expected.items():
        assert result.summary["counts"][name] == expected, name


def test_cli_exit_codes_and_report_screenshot(spark, tmp_path: Path) -> None:
    _, inputs = _dataset(tmp_path, n=50, each=1)
    out = tmp_path / "cli-out"
    run = subprocess.run(
        [sys.executable, "-m", "outbox.reconcile", "--producer-db", inputs.producer_databases[0],
         "--consumer-db", inputs.consumer_databases[0], "--broker-export", inputs.broker_export,
         "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 1, run.stderr[-2000:]  # lost, phantom and duplicate effect breach
    assert "FAIL" in run.stdout and "[reconcile]" in run.stderr
    report = out / "report.html"
    page = report.read_text()
    assert "<svg" in page
    assert "<script src" not in page and "<link" not in page and "url(" not in page  # opens offline
    assert_screenshot_not_blank(report, tmp_path)


def assert_screenshot_not_blank(report: Path, tmp_path: Path) -> None:
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        from tests.conftest import unavailable

        unavailable("Chromium is not installed (apt-get install chromium)")
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chrome'}", f"--screenshot={shot}", "--window-size=1280,1600",
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
