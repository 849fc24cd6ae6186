"""The idempotent consumer: effectively-once handling on an at-least-once broker.

``@idempotent_consumer(group, session_factory)`` wraps ``handler(session, received)`` so
that the ``(consumer_group, message_id)`` row in ``outbox_consumed_message`` is written
in the same database transaction as the handler's own writes. A redelivered message
finds the row and is skipped (and acked): no second effect. ``run_consumer`` receives,
handles and acks; a handler that raises leaves its message un-acked, so the broker
retries it with a growing back-off and dead-letters it after ``max_delivery_attempts``.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker_embedded import BrokerAPI, ReceivedMessage
from broker_embedded.errors import BrokerUnavailableError, UnknownReceiptError

from .integrations.sqlalchemy.tables import consumed_message

log = logging.getLogger("outbox.consumer")

Handler = Callable[[ReceivedMessage], bool]

#: Set on handlers made by ``idempotent_consumer``: the consumer group they record.
GROUP_ATTRIBUTE = "outbox_consumer_group"


class AlreadyConsumed(Exception):
    """Raised inside the handler's transaction to roll it back when the message is a duplicate."""


def idempotent_consumer(
    group: str, session_factory: Callable[[], Session]
) -> Callable[[Callable[[Session, ReceivedMessage], Any]], Handler]:
    """Wrap ``handler(session, received)``; the wrapper returns False for a duplicate."""

    def decorate(handler: Callable[[Session, ReceivedMessage], Any]) -> Handler:
        @functools.wraps(handler)
        def wrapper(received: ReceivedMessage) -> bool:
            with session_factory() as session:
                try:
                    with session.begin():
                        try:
                            session.execute(consumed_message.insert().values(
                                consumer_group=group,
                                message_id=received.message.message_id,
                                topic=received.message.topic,
                                transaction_id=received.transaction_id,
                                consumed_at=datetime.now(UTC),
                            ))
                        except IntegrityError:
                            raise AlreadyConsumed from None
                        handler(session, received)
                except AlreadyConsumed:
                    log.info("message %s already consumed by %s; skipped",
                             received.message.message_id, group)
                    return False
            return True

        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate


def run_consumer(
    broker: BrokerAPI,
    group: str,
    topic: str,
    handler: Handler,
    stop: threading.Event,
    batch_size: int = 16,
    invisible_duration_s: float = 30.0,
    wait_s: float = 1.0,
) -> int:
    """Receive, handle and ack until ``stop`` is set; returns how many were handled."""
    handled = 0
    log.info("consumer %s on %s started", group, topic)
    while not stop.is_set():
        try:
            batch = broker.receive(group, topic, max_messages=batch_size,
                                   invisible_duration_s=invisible_duration_s, wait_s=wait_s)
        except BrokerUnavailableError as exc:
            log.warning("broker unavailable (%s); retrying", exc)
            stop.wait(0.5)
            continue
        for received in batch:
            try:
                handler(received)
            except Exception:
                log.exception("handler failed for message %s (attempt %d); it will be retried",
                              received.message.message_id, received.delivery_attempt)
                continue
            try:
                broker.ack(group, received.receipt_handle)
            except (BrokerUnavailableError, UnknownReceiptError) as exc:
                # Handled but not acked: it comes back and the duplicate check skips it.
                log.warning("ack of %s failed (%s)", received.message.message_id, exc)
            handled += 1
    log.info("consumer %s on %s stopped after %d messages", group, topic, handled)
    return handled


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` on SIGTERM and SIGINT (a clean shutdown after the current message)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
