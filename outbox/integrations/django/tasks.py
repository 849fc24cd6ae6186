"""The check-back task for a Django project's own Celery app, found by autodiscovery.

With the usual ``proj/celery.py``::

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

``app.autodiscover_tasks()`` imports this module (``outbox.integrations.django`` is in
``INSTALLED_APPS``); run ``celery -A proj worker -Q celery,outbox.check.<group>``. The fence
runs on the project's ``DATABASES`` alias of the group (Django's ``DatabaseError`` there,
a locked or unreachable database, answers UNKNOWN: the broker asks again); the answer goes
to ``OUTBOX['BROKER_URL']`` on this process's producer connection. The tasks' names and
bodies are the ORM-free ``outbox.integrations.celery``'s: nothing here imports SQLAlchemy.

The purge task ``outbox.purge`` is here too, for a beat schedule entry
(``{"task": "outbox.purge", "schedule": 3600.0}``, docs/retention.md): ``purge_project``
on the project's aliases by ``OUTBOX["RETENTION"]``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ...retention import DEFAULT_BATCH_SIZE, DEFAULT_PAUSE_S, PurgeOptions
from ..celery.check_back import TASK_OPTIONS, check_task
from ..celery.purge import PURGE_TASK_OPTIONS, purge_summary
from .conf import producer
from .recorder import RECORDER, fence_on_group_database
from .retention import purge_project

check_transaction_task = shared_task(**TASK_OPTIONS)(
    check_task(fence_on_group_database, RECORDER.database_errors, lambda: producer().broker))


@shared_task(**PURGE_TASK_OPTIONS)
def purge_task(batch_size: int = DEFAULT_BATCH_SIZE, pause_s: float = DEFAULT_PAUSE_S,
               dry_run: bool = False) -> dict[str, Any]:
    """Purge the project's aliases (see ``purge_project``); the keyword arguments come
    from the beat entry's ``kwargs``."""
    return purge_summary(purge_project(PurgeOptions(batch_size=batch_size, pause_s=pause_s, dry_run=dry_run)))
