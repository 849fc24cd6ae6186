"""The purge task (``outbox.purge``) for Celery beat: its name, its one body, and its
registration in an app (the rules: ``outbox.retention``).

In your own Celery app, ``register_purge(app)`` adds the task, and one beat schedule entry
runs it, e.g. every hour::

    from outbox.integrations.celery import PURGE_TASK, register_purge

    register_purge(app)
    app.conf.beat_schedule = {"outbox-purge": {"task": PURGE_TASK, "schedule": 3600.0}}

A Django project's Celery app finds the task by autodiscovery of
``outbox.integrations.django.tasks``; the same entry schedules it. ``celery beat`` sends
it to the default queue, which any worker of the app runs (``-Q celery,...``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery import Celery

from ...retention import DEFAULT_BATCH_SIZE, DEFAULT_PAUSE_S, PurgeOptions, PurgeReport
from ...settings import OutboxSettings
from ..sqlalchemy.retention import purge_databases
from .check_back import broker_client

PURGE_TASK = "outbox.purge"

#: Options of the purge task in any app: its result is its log line, nothing to store.
PURGE_TASK_OPTIONS: dict[str, Any] = {"name": PURGE_TASK, "ignore_result": True}


def purge_summary(reports: Iterable[PurgeReport]) -> dict[str, Any]:
    """What the task returns (and the worker logs): rows per table per database, and the
    tables left alone with the reason."""
    reports = list(reports)
    return {"rows": {report.database: report.rows() for report in reports},
            "skipped": {report.database: report.skipped for report in reports if report.skipped}}


def register_purge(app: Celery, *, settings: OutboxSettings | None = None) -> Any:
    """Register the purge task in ``app``; returns the task. ``settings`` (default:
    ``OutboxSettings.from_env()``) give the databases (``database_url`` and the groups'),
    the retention policy and the broker asked which transactions are open."""
    settings = settings or OutboxSettings.from_env()
    broker_url = settings.broker_url

    def list_open(producer_group: str | None) -> list[str]:
        return broker_client(broker_url).open_transactions(producer_group)

    def purge_task(batch_size: int = DEFAULT_BATCH_SIZE, pause_s: float = DEFAULT_PAUSE_S,
                   dry_run: bool = False) -> dict[str, Any]:
        """Purge every database of the settings (see ``outbox.retention``); the keyword
        arguments come from the beat entry's ``kwargs``."""
        options = PurgeOptions(batch_size=batch_size, pause_s=pause_s, dry_run=dry_run)
        return purge_summary(purge_databases(settings.databases, settings.retention, list_open, options))

    return app.task(**PURGE_TASK_OPTIONS, shared=False)(purge_task)
