"""Reconciliation across several producer and consumer databases: producer databases that
disagree on a transaction fail the run, and consumer tables made by Django and by
SQLAlchemy, on PostgreSQL and SQLite, are read together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sqlalchemy import Table, create_engine, make_url

from outbox.integrations.sqlalchemy.tables import (
    consumed_message,
    metadata,
    stored_message,
    transaction_log,
)
from outbox.reconcile import ReconcileInputs, ReconcileOptions, reconcile
from outbox.reconcile.cli import _thresholds, build_parser
from outbox.reconcile.session import has_postgres_driver
from outbox.reconcile.synthetic import generate, write_export, write_sqlite

ROOT = Path(__file__).resolve().parents[2]


def _insert(url: str, table: Table, rows: list[dict[str, Any]]) -> None:
    engine = create_engine(url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), rows)
    engine.dispose()


@pytest.mark.spark
def test_producer_databases_that_disagree_are_a_conflict_that_fails_the_run(spark, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    data = generate(40, 0, now)
    first = f"sqlite:///{tmp_path / 'accounts.sqlite3'}"
    consumer = f"sqlite:///{tmp_path / 'points.sqlite3'}"
    write_sqlite(data, first, consumer)
    # What an admin fencing another service's transaction leaves: committed (and delivered)
    # in the service's database, ROLLED_BACK in the other.
    committed = data.transaction_log[3]
    second = f"sqlite:///{tmp_path / 'orders.sqlite3'}"
    _insert(second, transaction_log, [{**committed, "state": "ROLLED_BACK"}])
    # And a transaction rolled back in its only database whose message was delivered all the same.
    rolled_back = {"transaction_id": "tx-rolled-back", "producer_group": "shop", "state": "ROLLED_BACK",
                   "created_at": committed["created_at"]}
    _insert(second, transaction_log, [rolled_back])
    message = {**data.messages[5], "message_id": "m-rolled-back", "transaction_id": "tx-rolled-back",
               "state": "rolled_back", "commit_ms": None}
    data.messages.append(message)
    data.deliveries.append({**data.deliveries[5], "message_id": "m-rolled-back", "transaction_id": "tx-rolled-back"})
    write_export(data, tmp_path / "export")
    inputs = ReconcileInputs([first, second], [consumer], str(tmp_path / "export"))

    result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "out"), now_ms=now))

    counts = result.summary["counts"]
    assert counts["conflict"] == 2
    assert counts["committed"] == 40 and counts["rolled_back"] == 1  # committed anywhere counts as committed
    assert counts["lost"] == counts["phantom"] == 0
    assert not result.passed and result.summary["breached"] == {"conflict": 2}
    rows = pq.read_table(tmp_path / "out" / "anomalies" / "category=conflict").to_pylist()
    assert sorted(row["transaction_id"] for row in rows) == sorted([committed["transaction_id"], "tx-rolled-back"])
    assert "conflict 2 &gt; 0" in (tmp_path / "out" / "report.html").read_text()

    allowed = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / "allowed"), now_ms=now,
                                                        thresholds={"conflict": 2}))
    assert allowed.passed


def test_the_cli_gates_conflicts_by_default_and_max_conflict_allows_some() -> None:
    base = ["--producer-db", "sqlite://", "--broker-export", "x", "--out", "y"]
    assert _thresholds(build_parser().parse_args(base))["conflict"] == 0
    assert _thresholds(build_parser().parse_args([*base, "--max-conflict", "3"]))["conflict"] == 3


def _django_migrate(database: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "tests.outbox.django_migrate", json.dumps(database)],
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=120)


@pytest.mark.spark
@pytest.mark.postgres
def test_django_and_sqlalchemy_consumer_tables_on_postgresql_and_sqlite_are_read_together(
        spark, tmp_path: Path, postgres_url: str) -> None:
    now = int(time.time() * 1000)
    data = generate(90, 2, now)
    producer = f"sqlite:///{tmp_path / 'producer.sqlite3'}"
    _insert(producer, transaction_log, data.transaction_log)
    _insert(producer, stored_message, data.stored)
    parsed = make_url(postgres_url)
    django_sqlite = tmp_path / "django.sqlite3"
    _django_migrate({"ENGINE": "django.db.backends.postgresql", "NAME": parsed.database,
                     "USER": parsed.username, "HOST": parsed.host, "PORT": str(parsed.port)})
    _django_migrate({"ENGINE": "django.db.backends.sqlite3", "NAME": str(django_sqlite)})
    consumers = [postgres_url, f"sqlite:///{django_sqlite}", f"sqlite:///{tmp_path / 'sqlalchemy.sqlite3'}"]
    for index, url in enumerate(consumers):  # every third consumption in each database
        _insert(url, consumed_message, data.consumed[index::3])
    write_export(data, tmp_path / "export")
    inputs = ReconcileInputs([producer], consumers, str(tmp_path / "export"))

    reads = ["sqlalchemy", "jdbc"] if has_postgres_driver(spark) else ["sqlalchemy"]
    if os.environ.get("CI"):
        assert reads == ["sqlalchemy", "jdbc"], "CI installs the PostgreSQL JDBC driver"
    for read in reads:
        result = reconcile(spark, inputs, ReconcileOptions(str(tmp_path / read), now_ms=now, postgres_read=read))
        for name, expected in data.expected.items():
            assert result.summary["counts"][name] == expected, (read, name)
        assert result.summary["counts"]["consumptions"] == len(data.consumed), read


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_from_before_deliveries_named_their_transaction_still_reconciles(
        spark, tmp_path: Path, fmt: str) -> None:
    now = int(time.time() * 1000)
    data = generate(60, 2, now)
    for delivery in data.deliveries:
        del delivery["transaction_id"]
    producer, consumer = f"sqlite:///{tmp_path / 'p.sqlite3'}", f"sqlite:///{tmp_path / 'c.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export", fmt, with_delivery_transaction_ids=False)
    result = reconcile(spark, ReconcileInputs([producer], [consumer], str(tmp_path / "export")),
                       ReconcileOptions(str(tmp_path / "out"), now_ms=now))
    for name, expected in data.expected.items():
        assert result.summary["counts"][name] == expected, name
