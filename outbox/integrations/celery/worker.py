"""The standalone checker app under its documented name::

    celery -A outbox.integrations.celery.worker worker -Q outbox.check.<group> --pool threads
"""

from typing import Any

from . import app as _standalone

_NAMES = frozenset({"app", "check_transaction_task"})


def __getattr__(name: str) -> Any:
    """``app`` and ``check_transaction_task``, built on first use (``outbox.integrations.celery.app``)."""
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_standalone, name)

