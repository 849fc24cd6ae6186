"""PySpark reconciliation: classify every transaction across producer databases, the
broker's export and consumer databases, and write summary.json, anomaly Parquet and an
offline HTML report. Entry points: ``reconcile()`` and ``python -m outbox.reconcile``."""

from .job import ReconcileInputs, ReconcileOptions, ReconcileResult, reconcile

__all__ = ["ReconcileInputs", "ReconcileOptions", "ReconcileResult", "reconcile"]
