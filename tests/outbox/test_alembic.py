"""Alembic creates the framework tables and finds nothing left to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

ROOT = Path(__file__).resolve().parents[2]


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), *args],
        env={**os.environ, "OUTBOX_DATABASE_URL": url}, capture_output=True, text=True, timeout=120,
    )


def test_upgrade_head_then_check_is_clean(db_url: str) -> None:
    with create_engine(db_url).begin() as conn:  # the app's own table: not Alembic's business
        conn.execute(text("CREATE TABLE app_orders (id VARCHAR(32) PRIMARY KEY)"))
    upgraded = _alembic(db_url, "upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    checked = _alembic(db_url, "check")
    assert checked.returncode == 0, checked.stderr
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
    tables = set(inspect(create_engine(db_url)).get_table_names())
    assert {"outbox_transaction_log", "outbox_consumed_message", "app_orders"} <= tables
    downgraded = _alembic(db_url, "downgrade", "base")
    assert downgraded.returncode == 0, downgraded.stderr
    assert set(inspect(create_engine(db_url)).get_table_names()) & {"outbox_transaction_log",
                                                                    "outbox_consumed_message"} == set()
