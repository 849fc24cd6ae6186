"""The demo in short mode: every process real, faults injected, the books must agree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from example_shop.demo import broker_figures
from outbox.reconcile import ReconcileInputs, ReconcileOptions, reconcile
from tests.conftest import POSTGRES_ADMIN_URL


def run_demo(work: Path, *extra: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "example_shop", "demo", "--orders", "80", "--work-dir", str(work), *extra],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _row(out: str, name: str) -> str:
    line = next(line for line in out.splitlines() if line.strip().startswith(name))
    return line.split()[-1]


def assert_books(out: str) -> None:
    assert "RESULT: OK" in out
    for invariant in ("lost (paid, no points)", "phantom (points, no payment)", "duplicate effects"):
        assert _row(out, invariant) == "0", invariant
    assert _row(out, "money conserved") == "yes"
    paid = int(_row(out, "amount of paid orders"))
    assert paid > 0 and int(_row(out, "points awarded")) == paid
    assert int(_row(out, "amount taken from balances")) == paid
    assert int(_row(out, "orders paid")) == int(_row(out, "messages consumed"))


def assert_outage_taken(out: str) -> None:
    """The orders placed while the broker was down all succeeded (store mode), and the books,
    checked after the relay handed their messages over, still agree."""
    assert _row(out, "fault: broker outages") == "1"
    assert int(_row(out, "paid while the broker was down")) > 0
    assert "gave up: broker unavailable" not in out and "HTTP 503" not in out


def assert_broker_metrics(out: str, work: Path) -> None:
    """The demo printed where the broker's metrics are, and the scrape it saved at the end
    holds what the shop did: one committed transaction per paid order, check-backs that
    rolled back (a crash before the DB commit), nothing pending, parked or left to consume."""
    assert re.search(r"broker HTTP +http://127\.0\.0\.1:\d+/metrics \(Prometheus\), "
                     r"http://127\.0\.0\.1:\d+/ \(console\)", out)
    figures = dict(broker_figures(work / "broker-metrics.txt"))
    paid = int(_row(out, "orders paid"))
    duplicates = int(_row(out, "fault: duplicate deliveries"))
    assert figures["transactions committed"] == paid
    assert figures["transactions rolled back"] >= 1
    # counted since the broker's restart mid-run: the crash-before-commit of order 54 is after it
    assert figures["check-backs answered ROLLBACK"] >= 1
    assert figures["order.paid messages stored"] == paid + duplicates
    for settled in ("transactions pending", "transactions parked", "member-service lag",
                    "member-service dead letters"):
        assert figures[settled] == 0, settled
    assert _row(out, "transactions committed") == str(paid)  # the summary prints the same scrape


@pytest.mark.slow
@pytest.mark.spark
def test_demo_on_sqlite_and_the_filesystem_transport(tmp_path: Path, spark) -> None:
    out = run_demo(tmp_path / "shop")
    assert_books(out)
    assert_broker_metrics(out, tmp_path / "shop")
    assert "fault: crash-after-commit" in out and "fault: broker restarts" in out
    assert_outage_taken(out)
    assert "reconciliation: clean" in out
    assert_tampered_copy_is_caught(spark, tmp_path / "shop", tmp_path / "tampered")


def assert_tampered_copy_is_caught(spark, shop: Path, copy: Path) -> None:
    """Delete a consumption (lost), consume a rolled-back transaction (phantom) and
    consume one message twice under another id (duplicate effect): all three are found."""
    shutil.copytree(shop, copy, ignore=shutil.ignore_patterns("broker", "celery", "logs"))
    messages = pq.read_table(copy / "broker-export" / "messages.parquet").to_pylist()
    rolled_back = next(m for m in messages if m["state"] == "rolled_back")
    member = create_engine(f"sqlite:///{copy / 'member.sqlite3'}")
    with member.begin() as conn:
        rows = conn.execute(text("SELECT consumer_group, message_id, topic, transaction_id, consumed_at "
                                 "FROM outbox_consumed_message ORDER BY message_id")).all()
        deleted, doubled = rows[0], rows[1]
        conn.execute(text("DELETE FROM outbox_consumed_message WHERE message_id = :m"), {"m": deleted[1]})
        insert = text("INSERT INTO outbox_consumed_message (consumer_group, message_id, topic, transaction_id, "
                      "consumed_at) VALUES (:g, :m, :t, :x, :c)")
        conn.execute(insert, {"g": doubled[0], "m": doubled[1] + "-again", "t": doubled[2], "x": doubled[3],
                              "c": doubled[4]})
        conn.execute(insert, {"g": doubled[0], "m": rolled_back["message_id"], "t": "order.paid",
                              "x": rolled_back["transaction_id"], "c": doubled[4]})
    member.dispose()
    result = reconcile(spark, ReconcileInputs(
        [f"sqlite:///{copy / 'account.sqlite3'}"], [f"sqlite:///{copy / 'member.sqlite3'}"],
        str(copy / "broker-export"),
    ), ReconcileOptions(str(copy / "report"), grace_s=0))
    assert not result.passed
    # the consumed rolled-back transaction is a phantom, and a conflict: its database says ROLLED_BACK
    assert result.summary["breached"] == {"lost": 1, "phantom": 1, "duplicate_effect": 1, "conflict": 1}


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_demo_on_postgresql_and_redis(tmp_path: Path, postgres_url: str, redis_url: str) -> None:
    out = run_demo(tmp_path / "shop", "--database-url", postgres_url, "--redis-url", redis_url, "--no-report")
    assert_books(out)
    assert_broker_metrics(out, tmp_path / "shop")
    assert_outage_taken(out)
    base = postgres_url.rsplit("/", 1)[1]
    admin = create_engine(POSTGRES_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for service in ("account", "member"):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{base}_shop_{service}" WITH (FORCE)'))
    admin.dispose()
