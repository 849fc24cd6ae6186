"""The Celery tasks of the SQLAlchemy flavour: ``register(app)`` (check-backs answered by
the fence on each group's database), ``register_purge(app)`` (retention on every
database of the settings) and ``register_relay(app)`` (the relay of stored messages in a
thread of each worker). The tasks' names, queues and bodies are ORM-free
(``outbox.integrations.celery``); this module passes SQLAlchemy's fence and error family.
Both are also importable from ``outbox.integrations.celery``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from ...check_back import Answer
from ...relay import relay_thread
from ...retention import DEFAULT_BATCH_SIZE, DEFAULT_PAUSE_S, PurgeOptions
from ...settings import OutboxSettings
from ..celery.check_back import broker_client, register_check_task
from ..celery.purge import PURGE_TASK_OPTIONS, purge_summary
from .check_back import fence_answer
from .recorder import RECORDER
from .relay import relays
from .retention import purge_databases


def register(app: Celery, *, answer: Answer | None = None, settings: OutboxSettings | None = None) -> Any:
    """Register the check-back task in ``app``; returns the task.

    ``settings`` (default: ``OutboxSettings.from_env()``) give the broker that receives the
    answers and, unless ``answer`` is given, the databases the fence runs on. Run a worker
    on the group's queue: ``celery -A yourapp worker -Q celery,outbox.check.<group>``."""
    settings = settings or OutboxSettings.from_env()
    return register_check_task(app, answer or fence_answer(settings), RECORDER.database_errors, settings.broker_url)


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


def register_relay(app: Celery, *, settings: OutboxSettings | None = None) -> None:
    """Run the relay (``outbox.relay``) in a thread of each worker of ``app``, from the
    worker's start (``worker_ready``) to its shutdown, on every database of ``settings``
    (default: ``OutboxSettings.from_env()``) to its broker. The standalone worker
    (``outbox.integrations.celery.worker``) does when ``settings.relay``."""
    settings = settings or OutboxSettings.from_env()
    running: list[Callable[[], None]] = []

    def start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and not running:
            broker = broker_client(settings.broker_url)
            running.append(relay_thread(relays(settings.databases, broker,
                                               connect_timeout_s=settings.check_connect_timeout_s)))

    def stop(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            while running:
                running.pop()()

    worker_ready.connect(start, weak=False)
    worker_shutdown.connect(stop, weak=False)
