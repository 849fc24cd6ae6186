"""``run_consumer``: receive, handle and ack until stopped.

A handler that raises leaves its message un-acked, so the broker retries it with a
growing back-off and dead-letters it after ``max_delivery_attempts``. Make handlers
idempotent with ``idempotent_consumer`` (``outbox.integrations.sqlalchemy.consumer`` or
``outbox.integrations.django.consumer``; the rule is in ``outbox.idempotency``).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from broker_embedded import BrokerAPI, ReceivedMessage
from broker_embedded.errors import BrokerUnavailableError, UnknownReceiptError

from . import instrumentation
from .outage import BrokerOutage

log = logging.getLogger("outbox.consumer")

#: A handler; False means the message was skipped (a duplicate), anything else handled.
Handler = Callable[[ReceivedMessage], bool]

#: ``DELIVERY`` outcomes: handled, skipped by the handler (False: a duplicate), or failed
#: (the handler raised; the broker redelivers it).
HANDLED = "handled"
SKIPPED = "skipped"
FAILED = "failed"


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
    """Receive, handle and ack until ``stop`` is set; returns how many were handled.

    While the broker is unreachable it backs off (0.5 s doubling to 30 s, jittered) and logs
    once when the broker goes down and once when it is back (see ``outbox.outage``)."""
    handled = 0
    outage = BrokerOutage(log, f"consumer {group} on {topic}")
    log.info("consumer %s on %s started", group, topic)
    while not stop.is_set():
        try:
            batch = broker.receive(group, topic, max_messages=batch_size,
                                   invisible_duration_s=invisible_duration_s, wait_s=wait_s)
        except BrokerUnavailableError as exc:
            stop.wait(outage.failed(exc))
            continue
        outage.recovered()
        for received in batch:
            with instrumentation.operation(instrumentation.DELIVERY, consumer_group=group,
                                           received=received) as delivery:
                try:
                    result = handler(received)
                except Exception:
                    log.exception("handler failed for message %s (attempt %d); it will be retried",
                                  received.message.message_id, received.delivery_attempt)
                    delivery.outcome = FAILED
                    continue
                delivery.outcome = SKIPPED if result is False else HANDLED
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
