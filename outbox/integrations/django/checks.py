"""Resolving transactions from Django by the fencing rule (reusing the framework's check)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker_embedded import CheckRequest, EndTransactionResult, Resolution

from ...producer import Producer
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


def answer_check_backs(using: str = "default", sender: Producer | None = None) -> Callable[[], None]:
    """Answer this producer group's check-backs from this process (RocketMQ's way, an
    alternative to the Celery checker): each check is answered by ``fenced_answer`` on its
    own thread, so a lock wait never holds up the broker. Returns a function that stops it."""
    answering = sender or producer()

    def answer(request: CheckRequest) -> None:
        resolution = fenced_answer(request.transaction_id, using)
        if resolution is not Resolution.UNKNOWN:
            answering.end_transaction(request.transaction_id, resolution, from_check=True)

    def on_check(request: CheckRequest) -> None:
        threading.Thread(target=answer, args=(request,), name=f"outbox-check-{request.transaction_id}",
                         daemon=True).start()

    answering.broker.register_producer(answering.producer_group, on_check)
    return lambda: answering.broker.unregister_producer(answering.producer_group, on_check)
