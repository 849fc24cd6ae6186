"""Resolving transactions from Django by the fencing rule (reusing the framework's check)."""

from __future__ import annotations

from broker_embedded import EndTransactionResult, Resolution

from ...transaction_log import check_transaction
from .conf import outbox_settings, producer, sqlalchemy_engine


def fenced_answer(transaction_id: str, using: str = "default", lock_timeout_ms: int | None = None) -> Resolution:
    """What the transaction_log says of ``transaction_id`` (fencing it if absent);
    UNKNOWN if its transaction still holds the row after the lock timeout
    (``OUTBOX['CHECK_LOCK_TIMEOUT_MS']`` unless given)."""
    conf = outbox_settings()
    engine = sqlalchemy_engine(using)
    try:
        return check_transaction(engine, transaction_id, conf.producer_group,
                                 lock_timeout_ms or conf.check_lock_timeout_ms)
    finally:
        engine.dispose()


def resolve_parked(transaction_id: str, using: str = "default") -> EndTransactionResult | None:
    """Resolve a parked transaction as the transaction_log decides; None if UNKNOWN."""
    resolution = fenced_answer(transaction_id, using)
    if resolution is Resolution.UNKNOWN:
        return None
    return producer().broker.resolve_parked(transaction_id, resolution)
