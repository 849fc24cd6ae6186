"""The demo in short mode: every process real, faults injected, the books must agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

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


@pytest.mark.slow
def test_demo_on_sqlite_and_the_filesystem_transport(tmp_path: Path) -> None:
    out = run_demo(tmp_path / "shop")
    assert_books(out)
    assert "fault: crash-after-commit" in out and "fault: broker restarts" in out
    assert (tmp_path / "shop" / "broker-export" / "messages.parquet").exists()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_demo_on_postgresql_and_redis(tmp_path: Path, postgres_url: str, redis_url: str) -> None:
    out = run_demo(tmp_path / "shop", "--database-url", postgres_url, "--redis-url", redis_url)
    assert_books(out)
    base = postgres_url.rsplit("/", 1)[1]
    admin = create_engine(POSTGRES_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for service in ("account", "member"):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{base}_shop_{service}" WITH (FORCE)'))
    admin.dispose()
