"""The check-back task for a Django project's own Celery app, found by autodiscovery.

With the usual ``proj/celery.py``::

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

``app.autodiscover_tasks()`` imports this module (``outbox.integrations.django`` is in
``INSTALLED_APPS``); run ``celery -A proj worker -Q celery,outbox.check.<group>``. The fence
runs on the project's ``DATABASES`` alias of the group; the answer goes to
``OUTBOX['BROKER_URL']`` on this process's producer connection.
"""

from __future__ import annotations

from celery import shared_task

from broker_embedded import Resolution

from ..celery.check_back import TASK_OPTIONS, answer_check_back
from .conf import outbox_settings, producer
from .fence import fenced_answer


def fence_on_group_database(transaction_id: str, producer_group: str) -> Resolution:
    """The fence on the ``DATABASES`` alias holding ``producer_group``'s transaction_log."""
    using = outbox_settings().database_for(producer_group)
    return fenced_answer(transaction_id, producer_group=producer_group, using=using)


@shared_task(**TASK_OPTIONS)
def check_transaction_task(producer_group: str, transaction_id: str, message_id: str | None = None) -> str:
    """Answer one check-back of the broker (see ``answer_check_back``)."""
    return answer_check_back(fence_on_group_database, lambda: producer().broker, producer_group,
                             transaction_id, message_id)
