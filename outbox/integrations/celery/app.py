"""The standalone Celery app that answers the broker's check-backs, for services without
a Celery app of their own (yours can run the task instead: ``register(app)``).

Run a worker for a producer group with Celery's own command::

    celery -A outbox.integrations.celery.worker worker -Q outbox.check.<group> --pool threads

(``outbox.integrations.celery.worker`` is this app under the name the docs use.)

Configured from the environment (``outbox.settings``): the transport defaults to kombu's
server-less ``filesystem://`` under ``OUTBOX_CELERY_DATA_DIR`` (through
``.transport``, whose messages appear whole); set
``OUTBOX_CELERY_BROKER_URL=redis://...`` in production. The module-level ``app`` (and
``settings``, ``check_transaction_task``) is built on first use: importing this module reads
no environment and makes no folder.

The worker also relays the messages store mode kept in the databases
(``register_relay``) when ``OUTBOX_RELAY`` is 1, its default once ``OUTBOX_DATABASE_URL``
is set; ``OUTBOX_RELAY=0`` switches that off (run ``outbox relay`` instead, or nothing).
With ``OUTBOX_RECONCILE_REPORTS`` set it also has the nightly reconciliation's beat entry
(``.reconcile``; run ``celery -A outbox.integrations.celery.worker beat`` beside a worker).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from celery import Celery

from ...settings import OutboxSettings
from ..sqlalchemy.tasks import register, register_relay
from .reconcile import from_env, register_reconcile
from .transport import TRANSPORT


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
        conf["broker_transport"] = TRANSPORT  # messages appear whole (see .transport)
    celery.conf.update(conf)
    return celery


@functools.cache
def _standalone() -> dict[str, Any]:
    settings = OutboxSettings.from_env()
    app = make_app(settings)
    if settings.relay:
        register_relay(app, settings=settings)
    nightly = from_env(os.environ)
    if nightly is not None:
        register_reconcile(app, **nightly)
    return {"settings": settings, "app": app, "check_transaction_task": register(app, settings=settings)}


def __getattr__(name: str) -> Any:
    """``settings``, ``app`` and ``check_transaction_task`` of the standalone app, built (and
    the ``filesystem://`` folders made) on first use, not at import."""
    try:
        return _standalone()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
