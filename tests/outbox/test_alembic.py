"""Alembic creates the framework tables and finds nothing left to do: with the checkout's
alembic.ini, and with our revisions in an application's own Alembic history."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from outbox.schema import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG
from tests.outbox.alembic_user_project import APP_REVISION_ID, write_user_project

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORK_TABLES = {TRANSACTION_LOG, CONSUMED_MESSAGE, STORED_MESSAGE}


def _alembic(ini: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args], cwd=ini.parent,
        env={**os.environ, "OUTBOX_DATABASE_URL": url}, capture_output=True, text=True, timeout=120,
    )


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_then_check_is_clean(db_url: str) -> None:
    ini = ROOT / "alembic.ini"
    with create_engine(db_url).begin() as conn:  # the app's own table: not Alembic's business
        conn.execute(text("CREATE TABLE app_orders (id VARCHAR(32) PRIMARY KEY)"))
    upgraded = _alembic(ini, db_url, "upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    checked = _alembic(ini, db_url, "check")
    assert checked.returncode == 0, checked.stderr
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
    assert FRAMEWORK_TABLES | {"app_orders", "outbox_alembic_version"} <= _tables(db_url)
    downgraded = _alembic(ini, db_url, "downgrade", "base")
    assert downgraded.returncode == 0, downgraded.stderr
    assert _tables(db_url) & FRAMEWORK_TABLES == set()


def test_our_branch_in_the_apps_own_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    ini = write_user_project(tmp_path / "project", url)
    heads = _alembic(ini, url, "heads")
    assert heads.returncode == 0, heads.stderr
    assert "0004 (halfmoon) (head)" in heads.stdout and f"{APP_REVISION_ID} (app) (head)" in heads.stdout

    ours = _alembic(ini, url, "upgrade", "halfmoon@head")  # our branch alone
    assert ours.returncode == 0, ours.stderr
    assert FRAMEWORK_TABLES <= _tables(url) and "app_orders" not in _tables(url)

    both = _alembic(ini, url, "upgrade", "heads")
    assert both.returncode == 0, both.stderr
    assert FRAMEWORK_TABLES | {"app_orders", "alembic_version"} <= _tables(url)
    assert "outbox_alembic_version" not in _tables(url)  # one history: the app's
    with create_engine(url).connect() as conn:
        assert set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars()) == {
            "0004", APP_REVISION_ID}
    checked = _alembic(ini, url, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
