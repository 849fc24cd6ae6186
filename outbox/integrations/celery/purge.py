"""The purge task (``outbox.purge``) for Celery beat, ORM-free: its name, its options and
what it returns (the rules: ``outbox.retention``).

In your own Celery app, the SQLAlchemy flavour's ``register_purge(app)`` adds the task, and
one beat schedule entry runs it, e.g. every hour::

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

from ...retention import PurgeReport

PURGE_TASK = "outbox.purge"

#: Options of the purge task in any app: its result is its log line, nothing to store.
PURGE_TASK_OPTIONS: dict[str, Any] = {"name": PURGE_TASK, "ignore_result": True}


def purge_summary(reports: Iterable[PurgeReport]) -> dict[str, Any]:
    """What the task returns (and the worker logs): rows per table per database, and the
    tables left alone with the reason."""
    reports = list(reports)
    return {"rows": {report.database: report.rows() for report in reports},
            "skipped": {report.database: report.skipped for report in reports if report.skipped}}
