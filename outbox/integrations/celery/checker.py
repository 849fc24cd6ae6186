"""The broker side: a ``TransactionChecker`` that enqueues check-backs as Celery tasks.

Plug it into the broker server with
``python -m broker_embedded serve --checker outbox.integrations.celery.checker:make_checker``.
Any worker with access to the group's database can answer; no live producer is needed.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from broker_embedded import CheckRequest

from .app import CHECK_TASK, check_queue

log = logging.getLogger("outbox.celery.checker")


class CeleryChecker:
    """Sends each check-back to the queue ``outbox.check.<producer group>``."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def request_check(self, request: CheckRequest) -> bool:
        try:
            self.app.send_task(
                CHECK_TASK, args=[request.producer_group, request.transaction_id, request.message.message_id],
                queue=check_queue(request.producer_group),
                # Must not block the broker's check service: one quick retry, then give
                # up; the broker offers the check again at its next interval.
                retry=True, retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
            )
        except Exception:
            log.exception("could not enqueue the check of %s", request.transaction_id)
            return False
        return True


def make_checker(broker: Any) -> CeleryChecker:
    """Factory for ``broker_embedded serve --checker``: the app configured from the environment."""
    from .app import app

    return CeleryChecker(app)
