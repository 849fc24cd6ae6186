"""``outbox reconcile`` on a machine without the PostgreSQL JDBC jar, as a real process:
``HALFMOON_POSTGRES_JDBC_JAR`` points at a missing file, so its SparkSession has no driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outbox.reconcile.synthetic import generate, write_export, write_sqlite


def _now_ms() -> int:
    """Taken per test: the CLI judges "in flight" against the clock when it runs, and a
    timestamp taken at collection is minutes old by the time a long suite gets here."""
    return int(time.time() * 1000)


def _reconcile(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HALFMOON_POSTGRES_JDBC_JAR": str(tmp_path / "no-such-postgresql.jar"),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", "reconcile", "--out", str(tmp_path / "out"), "--master", "local[1]",
         "--conf", "spark.driver.memory=1g", *args],
        capture_output=True, text=True, timeout=600, env=env,
    )


@pytest.mark.spark
@pytest.mark.postgres
def test_without_the_jar_postgresql_is_read_through_sqlalchemy_with_one_warning(
        tmp_path: Path, postgres_url: str) -> None:
    data = generate(150, 2, _now_ms())
    write_sqlite(data, postgres_url, postgres_url)
    write_export(data, tmp_path / "export")
    run = _reconcile(tmp_path, "--producer-db", postgres_url, "--consumer-db", postgres_url,
                     "--broker-export", str(tmp_path / "export"))
    assert run.returncode == 1, run.stderr[-3000:]  # the injected anomalies breach the thresholds
    warnings = [line for line in run.stderr.splitlines() if "no PostgreSQL JDBC driver" in line]
    assert len(warnings) == 1, run.stderr[-3000:]
    assert "libpostgresql-jdbc-java" in warnings[0] and "HALFMOON_POSTGRES_JDBC_JAR" in warnings[0]
    assert "ClassNotFoundException" not in run.stderr and "Traceback" not in run.stderr
    counts = json.loads((tmp_path / "out" / "summary.json").read_text())["counts"]
    for name, expected in data.expected.items():
        assert counts[name] == expected, name


@pytest.mark.spark
@pytest.mark.postgres
def test_jdbc_asked_for_without_the_jar_is_one_line_and_exit_2(tmp_path: Path, postgres_url: str) -> None:
    data = generate(5, 0, _now_ms())
    write_sqlite(data, postgres_url, postgres_url)
    write_export(data, tmp_path / "export")
    run = _reconcile(tmp_path, "--producer-db", postgres_url,
                     "--broker-export", str(tmp_path / "export"), "--postgres-read", "jdbc")
    assert run.returncode == 2, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("outbox reconcile: error:")]
    assert len(errors) == 1 and "no PostgreSQL JDBC driver" in errors[0], run.stderr[-3000:]
    assert "libpostgresql-jdbc-java" in errors[0] and "spark.jars" in errors[0]
    assert "Traceback" not in run.stderr and "\tat " not in run.stderr and "java.lang" not in run.stderr
