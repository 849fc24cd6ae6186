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

When no worker takes a group's check tasks (its queue only grows for ``stall_s``), the
checker logs a WARNING, at most once a minute per group, saying where the tasks wait (the
Celery transport, and the folder of the ``filesystem://`` one): a worker started with other
``OUTBOX_CELERY_*`` settings, or none at all, is then plain to see.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.utils.url import maybe_sanitize_url

from broker_embedded import CheckRequest

from ... import instrumentation
from .check_back import CHECK_TASK, CONTEXT_HEADER, check_queue

log = logging.getLogger(__name__)

#: The shortest life of a check task: queue latency on a loaded worker must not expire them all.
MIN_EXPIRY_S = 10.0
#: How often a group stuck without a worker is logged again.
REPORT_EVERY_S = 60.0


def transport_description(app: Celery) -> str:
    """Where ``app`` sends tasks: its broker URL (password hidden) and, for the
    ``filesystem://`` transport, the folder its queues are in."""
    where = str(maybe_sanitize_url(app.conf.broker_url))
    folder = (app.conf.broker_transport_options or {}).get("data_folder_in")
    return f"{where} (folder {folder})" if folder else where


@dataclass
class _QueueWatch:
    """What ``StalledQueues`` knows of one check queue."""

    sent: int = 0  # tasks sent to it
    #: (depth, tasks sent, time) when its depth was last seen to miss a sent task
    base: tuple[int, int, float] | None = None
    sampled: float = -math.inf
    reported: float = -math.inf


class StalledQueues:
    """Per check queue, since when no task has left it: a queue that kept every task sent
    to it for ``stall_s`` has no worker taking from it."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._lock = threading.Lock()
        self._queues: dict[str, _QueueWatch] = {}  # bounded by the producer groups, not by tasks

    def sent(self, queue: str) -> bool:
        """Count a task sent to ``queue``; whether its depth is worth sampling now (a few
        times per ``stall_s``)."""
        now = time.monotonic()
        with self._lock:
            watch = self._queues.setdefault(queue, _QueueWatch())
            watch.sent += 1
            if now - watch.sampled < self.stall_s / 4:
                return False
            watch.sampled = now
            return True

    def sampled(self, queue: str, depth: int) -> float | None:
        """Record ``queue``'s ``depth``; the seconds it has kept every task sent to it when
        that is at least ``stall_s`` and not reported within ``REPORT_EVERY_S``, else None."""
        now = time.monotonic()
        with self._lock:
            watch = self._queues.setdefault(queue, _QueueWatch())
            base = watch.base
            if base is None or depth < base[0] + watch.sent - base[1]:  # a task left: a worker took it
                watch.base = (depth, watch.sent, now)
                return None
            if now - base[2] < self.stall_s or now - watch.reported < REPORT_EVERY_S:
                return None
            watch.reported = now
            return now - base[2]


class CeleryChecker:
    """Sends each check-back to the queue ``outbox.check.<producer group>``, to expire
    after ``expires_s`` seconds (None: never); warns when a queue has had no worker for
    ``stall_s`` seconds (default: ``expires_s``, at least ``MIN_EXPIRY_S``)."""

    def __init__(self, app: Celery, expires_s: float | None = None, stall_s: float | None = None) -> None:
        if expires_s is not None and expires_s <= 0:
            raise ValueError(f"expires_s must be positive, got {expires_s!r}")
        self.app = app
        self.expires_s = expires_s
        self.stalled = StalledQueues(stall_s or max(expires_s or 0, MIN_EXPIRY_S))

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
        self._watch(request.producer_group)
        return True

    def _watch(self, producer_group: str) -> None:
        """Sample the group's queue now and then; warn when no worker takes from it."""
        queue = check_queue(producer_group)
        if not self.stalled.sent(queue):
            return
        try:
            with self.app.connection_for_read() as connection:
                depth = connection.default_channel.queue_declare(queue=queue, passive=True).message_count
        except Exception:  # a depth is a hint; the transport's failures show in sending
            return
        seconds = self.stalled.sampled(queue, depth)
        if seconds is not None:
            log.warning("no Celery worker took a check task of producer group %r for %.1f s: %d wait in queue "
                        "%s at %s; start one with the same OUTBOX_CELERY_BROKER_URL and OUTBOX_CELERY_DATA_DIR: "
                        "celery -A outbox.integrations.celery.worker worker -Q %s --pool threads",
                        producer_group, seconds, depth, queue, transport_description(self.app), queue)


def make_checker(broker: Any) -> CeleryChecker:
    """Factory for ``broker_embedded serve --checker``: the app configured from the
    environment; its tasks expire after two of ``broker``'s check intervals (at least
    ``MIN_EXPIRY_S``)."""
    from .app import app

    log.info("check-backs go to Celery at %s, queue outbox.check.<producer group>", transport_description(app))
    return CeleryChecker(app, expires_s=max(2 * broker.config.check_interval_s, MIN_EXPIRY_S))
