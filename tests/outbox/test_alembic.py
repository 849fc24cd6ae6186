"""Alembic creates the framework tables and finds nothing left to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect

ROOT = Path(__file__).resolve().parents[2]


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), *args],
        env={**os.environ, "OUTBOX_DATABASE_URL": url}, capture_output=True, text=True, timeout=120,
    )


def test_upgrade_head_then_check_is_clean(db_url: str) -> None:
    upgraded = _alembic(db_url, "upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    checked = _alembic(db_url, "check")
    assert checked.returncode == 0, checked.stderr
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
    tables = set(inspect(create_engine(db_url)).get_table_names())
    assert {"outbox_transaction_log", "outbox_consumed_message"} <= tables
