"""The Celery app whose task answers the broker's check-backs.

Run a worker for a producer group with Celery's own command::

    celery -A outbox.integrations.celery.worker worker -Q outbox.check.<group> --pool threads

(``outbox.integrations.celery.worker`` is this app under the name the docs use.)

Configured from the environment (``outbox.settings``): the transport defaults to kombu's
server-less ``filesystem://`` under ``OUTBOX_CELERY_DATA_DIR``; set
``OUTBOX_CELERY_BROKER_URL=redis://...`` in production.
"""

from __future__ import annotations

import functools
import logging

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from broker_embedded import BrokerAPI, BrokerError, Resolution, connect

from ...settings import OutboxSettings
from ...transaction_log import check_transaction
from ..sqlalchemy.engine import create_engine

log = logging.getLogger("outbox.celery")

CHECK_TASK = "outbox.check_transaction"


def check_queue(producer_group: str) -> str:
    """The Celery queue of a producer group's check-backs."""
    return f"outbox.check.{producer_group}"


def make_app(settings: OutboxSettings) -> Celery:
    """A Celery app for ``settings`` (the module-level ``app`` uses the environment)."""
    celery = Celery("outbox")
    conf: dict[str, object] = {
        "broker_url": settings.celery_broker_url,
        "task_ignore_result": True,
        "task_acks_late": True,
        "worker_prefetch_multiplier": 4,
        "broker_connection_retry_on_startup": True,
    }
    if settings.celery_broker_url.startswith("filesystem"):
        folder = settings.celery_data_dir.resolve()
        (folder / "queue").mkdir(parents=True, exist_ok=True)
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        conf["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    celery.conf.update(conf)
    return celery


settings = OutboxSettings.from_env()
app = make_app(settings)


@functools.cache
def _engine(url: str) -> Engine:
    return create_engine(url, pool_pre_ping=True)


@functools.cache
def _broker(url: str) -> BrokerAPI:
    return connect(url)


@app.task(name=CHECK_TASK)
def check_transaction_task(producer_group: str, transaction_id: str, message_id: str | None = None) -> str:
    """Answer one check-back: the fencing check, then END_TRANSACTION to the broker.

    ``message_id`` (the half message the broker checked) is only logged: the answer is
    per transaction. UNKNOWN (lock timeout, or the database is unreachable) sends
    nothing; the broker checks again at its next interval."""
    log.info("check-back of %s (group %s, message %s)", transaction_id, producer_group, message_id)
    try:
        resolution = check_transaction(
            _engine(settings.database_for(producer_group)), transaction_id, producer_group,
            settings.check_lock_timeout_ms,
        )
    except SQLAlchemyError as exc:
        log.warning("check of %s: database error (%s); answering nothing, the broker will check again",
                    transaction_id, exc)
        return Resolution.UNKNOWN.value
    if resolution is not Resolution.UNKNOWN:
        try:
            _broker(settings.broker_url).end_transaction(
                transaction_id, resolution, producer_group=producer_group, from_check=True
            )
        except BrokerError as exc:
            log.warning("answer %s for %s not delivered: %s; the broker will check again",
                        resolution.value, transaction_id, exc)
    return resolution.value
