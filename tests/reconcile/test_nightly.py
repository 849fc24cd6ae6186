"""The nightly reconciliation through its Celery beat task: a report per night, the last N
kept, ``LATEST`` pointing at the newest, and a breached threshold failing the task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.schedules import crontab

from broker_embedded.http.console.reconcile import latest
from outbox.integrations.celery.reconcile import (
    BEAT_ENTRY,
    RECONCILE_TASK,
    ReconcileBreachedError,
    from_env,
    register_reconcile,
)
from outbox.reconcile.nightly import LATEST, midnight, publish
from outbox.reconcile.synthetic import generate, write_export, write_sqlite


def test_publishing_points_latest_at_the_new_report_and_keeps_the_last_n(tmp_path: Path) -> None:
    for name in ("2026-11-01", "2026-11-02", "2026-11-03"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{}")
    (tmp_path / ".state").mkdir()
    deleted = publish(tmp_path, tmp_path / "2026-11-03", keep=2)
    assert [path.name for path in deleted] == ["2026-11-01"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        ".state",
        "2026-11-02",
        "2026-11-03",
        LATEST,
    ]
    assert latest(tmp_path) == tmp_path / "2026-11-03"
    (tmp_path / LATEST).write_text("../etc\n")
    assert latest(tmp_path) is None


def test_the_worker_registers_the_task_only_when_told_where_reports_go() -> None:
    assert from_env({}) is None
    args = from_env(
        {
            "OUTBOX_RECONCILE_REPORTS": "/srv/r",
            "OUTBOX_RECONCILE_ARGS": "--producer-db 'sqlite:///a b'",
        }
    )
    assert args == {
        "reports": "/srv/r",
        "state_dir": "/srv/r/.state",
        "keep": 14,
        "reconcile_args": ["--producer-db", "sqlite:///a b"],
    }


def test_the_standalone_worker_schedules_it_when_told_where_reports_go(tmp_path: Path) -> None:
    code = (
        "from celery.app.utils import find_app; app = find_app('outbox.integrations.celery.worker'); "
        f"print(sorted(app.conf.beat_schedule or {{}}), {RECONCILE_TASK!r} in app.tasks)"
    )
    env = {
        **os.environ,
        "OUTBOX_CELERY_DATA_DIR": str(tmp_path / "celery"),
        "OUTBOX_CELERY_BROKER_URL": "filesystem://",
        "OUTBOX_RELAY": "0",
    }
    for extra, expected in (
        ({}, "[] False"),
        ({"OUTBOX_RECONCILE_REPORTS": str(tmp_path)}, f"['{BEAT_ENTRY}'] True"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.strip() == expected


@pytest.mark.spark
def test_the_nightly_task_reconciles_to_midnight_rotates_and_fails_on_a_breach(
    tmp_path: Path,
) -> None:
    until = midnight()
    data = generate(50, 1, int((until - timedelta(hours=2)).timestamp() * 1000))
    producer, consumer = (
        f"sqlite:///{tmp_path / 'p.sqlite3'}",
        f"sqlite:///{tmp_path / 'c.sqlite3'}",
    )
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export")
    reports = tmp_path / "reports"
    (reports / "2000-01-01").mkdir(parents=True)
    app = Celery("nightly-test")
    task = register_reconcile(
        app,
        reports=str(reports),
        state_dir=str(tmp_path / "state"),
        keep=1,
        reconcile_args=[
            "--producer-db",
            producer,
            "--consumer-db",
            consumer,
            "--broker-export",
            str(tmp_path / "export"),
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--master",
            "local[1]",
        ],
    )
    entry = app.conf.beat_schedule[BEAT_ENTRY]
    assert entry["task"] == RECONCILE_TASK and entry["schedule"] == crontab(hour=0, minute=30)

    with pytest.raises(ReconcileBreachedError, match="FAILED a threshold"):
        task()
    folder = reports / until.strftime("%Y-%m-%d")
    assert latest(reports) == folder and not (reports / "2000-01-01").exists()
    summary = json.loads((folder / "summary.json").read_text())
    # judged at midnight: the synthetic in-flight ones are past the grace period by then
    assert not summary["passed"] and summary["breached"]["lost"] >= data.expected["lost"]
    assert summary["incremental"]["until_ms"] == int(until.timestamp() * 1000)
    assert summary["incremental"]["from_ms"] == int((until - timedelta(days=1)).timestamp() * 1000)
    assert (tmp_path / "state" / f"until={int(until.timestamp() * 1000)}" / "meta.json").exists()
