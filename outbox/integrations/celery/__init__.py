"""Check-backs and retention as Celery tasks, ORM-free: the tasks' names, queues and
bodies (``check_back``, ``purge``), the broker's side (``checker.make_checker``) and the
standalone app (``worker``). Each integration registers them with its own fence and error
family: ``register(app)``, ``register_purge(app)`` and ``register_relay(app)`` are the
SQLAlchemy flavour's
(``outbox.integrations.sqlalchemy.tasks``, loaded on first use, so that importing this
package imports no ORM); a Django project's Celery app autodiscovers
``outbox.integrations.django.tasks``."""

from __future__ import annotations

import importlib
from typing import Any

from .check_back import CHECK_TASK, check_queue
from .purge import PURGE_TASK

#: The SQLAlchemy flavour's registrations, loaded on first use.
_SQLALCHEMY_NAMES = frozenset({"register", "register_purge", "register_relay"})


def __getattr__(name: str) -> Any:
    if name not in _SQLALCHEMY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("outbox.integrations.sqlalchemy.tasks"), name)
    globals()[name] = value
    return value


__all__ = ["CHECK_TASK", "PURGE_TASK", "check_queue", "register", "register_purge", "register_relay"]
