"""The check-back task for a Django project's own Celery app, found by autodiscovery.

With the usual ``proj/celery.py``::

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

``app.autodiscover_tasks()`` imports this module (``outbox.integrations.django`` is in
``INSTALLED_APPS``); run ``celery -A proj worker -Q celery,outbox.check.<group>``. The fence
runs on the project's ``DATABASES`` alias of the group; the answer goes to
``OUTBOX['BROKER_URL']`` on this process's producer connection.

The purge task ``outbox.purge`` is here too, for a beat schedule entry
(``{"task": "outbox.purge", "schedule": 3600.0}``, docs/retention.md): ``purge_project``
on the project's aliases by ``OUTBOX["RETENTION"]``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ...retention import DEFAULT_BATCH_SIZE, DEFAULT_PAUSE_S, PurgeOptions
from ..celery.check_back import TASK_OPTIONS, answer_check_back
from ..celery.purge import PURGE_TASK_OPTIONS, purge_summary
from .conf import producer
from .recorder import fence_on_group_database
from .retention import purge_project


@shared_task(**TASK_OPTIONS)
def check_transaction_task(producer_group: str, transaction_id: str, message_id: str | None = None) -> str:
    """Answer one check-back of the broker (see ``answer_check_back``)."""
    return answer_check_back(fence_on_group_database, lambda: producer().broker, producer_group,
                             transaction_id, message_id)


@shared_task(**PURGE_TASK_OPTIONS)
def purge_task(batch_size: int = DEFAULT_BATCH_SIZE, pause_s: float = DEFAULT_PAUSE_S,
               dry_run: bool = False) -> dict[str, Any]:
    """Purge the project's aliases (see ``purge_project``); the keyword arguments come
    from the beat entry's ``kwargs``."""
    return purge_summary(purge_project(PurgeOptions(batch_size=batch_size, pause_s=pause_s, dry_run=dry_run)))
