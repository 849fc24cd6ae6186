"""The broker side: a ``TransactionChecker`` that enqueues check-backs as Celery tasks.

Plug it into the broker server with
``python -m broker_embedded serve --checker outbox.integrations.celery.checker:make_checker``.
Any worker with access to the group's database can answer; no live producer is needed.

A half message that carries its producer's trace context
(``outbox.instrumentation.CONTEXT_PROPERTIES``) sends it along in the task's
``CONTEXT_HEADER``, so the check-back continues that trace.

Each task expires after two of the broker's check intervals (at least ``MIN_EXPIRY_S``): by
then the broker has sent a newer check of the same transaction, so a worker that starts late
(or falls behind) discards the stale ones instead of running the fence once per check it
missed, while a busy worker still has time to reach the current one.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from broker_embedded import CheckRequest

from ... import instrumentation
from .check_back import CHECK_TASK, CONTEXT_HEADER, check_queue

log = logging.getLogger("outbox.celery.checker")

#: The shortest life of a check task: queue latency on a loaded worker must not expire them all.
MIN_EXPIRY_S = 10.0


class CeleryChecker:
    """Sends each check-back to the queue ``outbox.check.<producer group>``, to expire
    after ``expires_s`` seconds (None: never)."""

    def __init__(self, app: Celery, expires_s: float | None = None) -> None:
        if expires_s is not None and expires_s <= 0:
            raise ValueError(f"expires_s must be positive, got {expires_s!r}")
        self.app = app
        self.expires_s = expires_s

    def request_check(self, request: CheckRequest) -> bool:
        context = instrumentation.carried_context(request.message.properties)
        try:
            self.app.send_task(
                CHECK_TASK, args=[request.producer_group, request.transaction_id, request.message.message_id],
                queue=check_queue(request.producer_group), expires=self.expires_s,
                headers={CONTEXT_HEADER: context} if context else None,
                # Must not block the broker's check service: one quick retry, then give
                # up; the broker offers the check again at its next interval.
                retry=True, retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
            )
        except Exception:
            log.exception("could not enqueue the check of %s", request.transaction_id)
            return False
        return True


def make_checker(broker: Any) -> CeleryChecker:
    """Factory for ``broker_embedded serve --checker``: the app configured from the
    environment; its tasks expire after two of ``broker``'s check intervals (at least
    ``MIN_EXPIRY_S``)."""
    from .app import app

    return CeleryChecker(app, expires_s=max(2 * broker.config.check_interval_s, MIN_EXPIRY_S))
