"""The nightly reconciliation as a Celery beat task (``outbox.reconcile_nightly``).

``register_reconcile(app, reports=..., state_dir=..., reconcile_args=[...])`` adds the task
and its beat entry (every day at 00:30 UTC by default): it runs
``python -m outbox.reconcile.nightly`` in a process of its own (Spark's JVM comes and goes
with it), which reconciles up to the last midnight, keeps the last ``keep`` reports and
points ``<reports>/LATEST`` at the new one. A breached threshold fails the task with
``ReconcileBreachedError`` (logged at ERROR by the worker, a failure in any Celery
monitoring): that is the alert. The standalone worker (``outbox.integrations.celery.worker``)
registers it when ``OUTBOX_RECONCILE_REPORTS`` is set (``from_env``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from celery.schedules import crontab

RECONCILE_TASK = "outbox.reconcile_nightly"
BEAT_ENTRY = "outbox-reconcile-nightly"


class ReconcileBreachedError(RuntimeError):
    """The nightly reconciliation found more anomalies than a threshold allows."""


def register_reconcile(
    app: Celery,
    *,
    reports: str,
    state_dir: str,
    reconcile_args: Sequence[str],
    keep: int = 14,
    hour: int = 0,
    minute: int = 30,
) -> Any:
    """Register the nightly task in ``app`` and its beat entry (``hour:minute`` UTC); returns
    the task. ``reconcile_args``: ``outbox reconcile``'s inputs and thresholds."""
    command = [
        sys.executable,
        "-m",
        "outbox.reconcile.nightly",
        "--reports",
        reports,
        "--state-dir",
        state_dir,
        "--keep",
        str(keep),
        "--",
        *reconcile_args,
    ]

    def reconcile_nightly() -> dict[str, Any]:
        """One nightly run; raises ``ReconcileBreachedError`` when a threshold is breached."""
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 1:
            raise ReconcileBreachedError(
                f"reconciliation FAILED a threshold: {done.stdout.strip()}"
            )
        if done.returncode:
            raise RuntimeError(
                f"reconciliation could not run (exit {done.returncode}): "
                f"{done.stderr.strip().splitlines()[-1:]}"
            )
        return {"passed": True, "report": done.stdout.strip()}

    task = app.task(name=RECONCILE_TASK, ignore_result=True, shared=False)(reconcile_nightly)
    app.conf.beat_schedule = {
        **(app.conf.beat_schedule or {}),
        BEAT_ENTRY: {"task": RECONCILE_TASK, "schedule": crontab(hour=hour, minute=minute)},
    }
    return task


def from_env(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """``register_reconcile``'s arguments from ``OUTBOX_RECONCILE_REPORTS``,
    ``OUTBOX_RECONCILE_STATE_DIR``, ``OUTBOX_RECONCILE_ARGS`` (shell words) and
    ``OUTBOX_RECONCILE_KEEP``; None when the reports folder is not set."""
    reports = environ.get("OUTBOX_RECONCILE_REPORTS")
    if not reports:
        return None
    return {
        "reports": reports,
        "state_dir": environ.get("OUTBOX_RECONCILE_STATE_DIR", f"{reports}/.state"),
        "reconcile_args": shlex.split(environ.get("OUTBOX_RECONCILE_ARGS", "")),
        "keep": int(environ.get("OUTBOX_RECONCILE_KEEP", "14")),
    }
