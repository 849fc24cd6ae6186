"""PySpark reconciliation: classify every transaction across producer databases, the
broker's export and consumer databases, and write summary.json, anomaly Parquet and an
offline HTML report. Entry points: ``reconcile()`` and ``python -m outbox.reconcile``.

The job's names are imported on first use, so the command line answers ``--help`` and
bad input without PySpark (the ``spark`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import ReconcileInputs, ReconcileOptions, ReconcileResult, reconcile

__all__ = ["ReconcileInputs", "ReconcileOptions", "ReconcileResult", "reconcile"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
