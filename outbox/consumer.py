"""``run_consumer``: receive, handle and ack until stopped.

A handler that raises leaves its message un-acked, so the broker retries it with a
growing back-off and dead-letters it after ``max_delivery_attempts``. Make handlers
idempotent with ``idempotent_consumer`` (``outbox.integrations.sqlalchemy.consumer`` or
``outbox.integrations.django.consumer``; the rule is in ``outbox.idempotency``). The
asyncio loop, ``arun_consumer``, is in ``outbox.aio_consumer`` and shares ``ConsumerRun``.

Every ``log_interval_s`` (10 s) in which messages came, the loop logs one INFO line with
what it did in that interval: ``consumer points on order.paid: 120 handled, 2 skipped as
duplicates, 1 failed in the last 10 s``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from broker_embedded import BrokerAPI, ReceivedMessage
from broker_embedded.errors import BrokerError, BrokerUnavailableError, UnknownReceiptError

from . import instrumentation
from .outage import BrokerOutage

log = logging.getLogger(__name__)

#: A handler; False means the message was skipped (a duplicate), anything else handled.
Handler = Callable[[ReceivedMessage], bool]

#: ``DELIVERY`` outcomes: handled, skipped by the handler (False: a duplicate), or failed
#: (the handler raised; the broker redelivers it).
HANDLED = "handled"
SKIPPED = "skipped"
FAILED = "failed"


#: How often (seconds) a consumer loop logs what it did, when it did anything.
LOG_INTERVAL_S = 10.0

#: Ack failures after the handler committed: the message comes back and its duplicate
#: check skips it, so they are logged, not raised.
ACK_ERRORS = (BrokerUnavailableError, UnknownReceiptError)

#: How long a released message stays invisible: next to nothing, the broker wants a duration.
RELEASED_INVISIBLE_S = 0.001


class ConsumerRun:
    """The bookkeeping of one consumer loop, without I/O: shared by ``run_consumer`` and
    ``outbox.aio_consumer.arun_consumer`` so both log, back off and announce alike."""

    def __init__(self, group: str, topic: str, log_interval_s: float = LOG_INTERVAL_S) -> None:
        self.group = group
        self.topic = topic
        self.handled = 0
        self.outage = BrokerOutage(log, f"consumer {group} on {topic}")
        self.log_interval_s = log_interval_s
        self._interval: Counter[str] = Counter()
        self._interval_started = time.monotonic()
        log.info("consumer %s on %s started", group, topic)

    def delivering(self, received: ReceivedMessage) -> instrumentation.Operation:
        """The ``DELIVERY`` operation of handing ``received`` to the handler."""
        return instrumentation.operation(instrumentation.DELIVERY, consumer_group=self.group, received=received)

    def failed(self, received: ReceivedMessage, delivery: instrumentation.Operation) -> None:
        """The handler raised (call it in the ``except``): the broker redelivers the message."""
        log.exception("handler failed for message %s (attempt %d); it will be retried",
                      received.message.message_id, received.delivery_attempt)
        delivery.outcome = FAILED
        self._interval[FAILED] += 1

    def succeeded(self, delivery: instrumentation.Operation, result: object) -> None:
        """The handler returned ``result`` (False: skipped as a duplicate); ack it next."""
        outcome = SKIPPED if result is False else HANDLED
        delivery.outcome = outcome
        self.handled += 1
        self._interval[outcome] += 1

    def ack_failed(self, received: ReceivedMessage, error: Exception) -> None:
        """Handled but not acked: it comes back and the duplicate check skips it."""
        log.warning("ack of %s failed (%s)", received.message.message_id, error)

    def acked(self, handled: Sequence[ReceivedMessage], outcomes: Sequence[BrokerError | None]) -> None:
        """The per-message outcomes of acking ``handled`` with ``ack_many``: an ``ACK_ERRORS``
        one is logged (``ack_failed``), any other error raised."""
        for received, outcome in zip(handled, outcomes, strict=True):
            if isinstance(outcome, ACK_ERRORS):
                self.ack_failed(received, outcome)
            elif outcome is not None:
                raise outcome

    @staticmethod
    def not_released(received: ReceivedMessage, error: BrokerError) -> None:
        """A message received but not handled (the loop stopped) could not be released."""
        log.info("message %s not released (%s); it comes back after its invisible duration",
                 received.message.message_id, error)

    def log_interval(self, force: bool = False) -> None:
        """Once ``log_interval_s`` has passed (or when ``force``), log the interval's counts
        at INFO if it had any messages, and start the next interval."""
        elapsed = time.monotonic() - self._interval_started
        if not force and elapsed < self.log_interval_s:
            return
        if self._interval:
            log.info("consumer %s on %s: %d handled, %d skipped as duplicates, %d failed in the last %.0f s",
                     self.group, self.topic, self._interval[HANDLED], self._interval[SKIPPED],
                     self._interval[FAILED], elapsed)
        self._interval.clear()
        self._interval_started = time.monotonic()

    def stopped(self) -> int:
        """Log the last interval and the end of the loop; how many messages it handled."""
        self.log_interval(force=True)
        log.info("consumer %s on %s stopped after %d messages", self.group, self.topic, self.handled)
        return self.handled


def run_consumer(
    broker: BrokerAPI,
    group: str,
    topic: str,
    handler: Handler,
    stop: threading.Event,
    batch_size: int = 16,
    invisible_duration_s: float = 30.0,
    wait_s: float = 1.0,
    log_interval_s: float = LOG_INTERVAL_S,
    batch_acks: bool = True,
    filter_expression: str = "*",
    filter_type: str = "TAG",
) -> int:
    """Receive, handle and ack until ``stop`` is set; returns how many were handled.

    ``filter_expression`` is the group's subscription, a RocketMQ TAG expression (``"*"``,
    ``"TagA"``, ``"TagA || TagB"``), or with ``filter_type="SQL92"`` a condition over the
    message's properties (``"amount > 5"``): the broker consumes the other messages for the
    group without handing them to ``handler``.

    The messages of a received batch that were handled are acked together, in one
    ``ack_many`` after the batch (``batch_acks=False``: each right after its handler; for
    handlers slow enough that a batch outlasts ``invisible_duration_s``).

    While the broker is unreachable it backs off (0.5 s doubling to 30 s, jittered) and logs
    once when the broker goes down and once when it is back (see ``outbox.outage``). Every
    ``log_interval_s`` with messages, one INFO line counts what was handled, skipped, failed.

    ``stop.set()`` (``stop_on_signals`` does it on SIGTERM) is a graceful stop, as for
    ``arun_consumer``: no new receive; the handler in progress finishes and its message is
    acked with those of its batch handled before it; the rest of its batch is released
    (visible again at once, for the next consumer). A long poll under way is let finish:
    stopping takes up to ``wait_s`` more."""
    run = ConsumerRun(group, topic, log_interval_s)
    while not stop.is_set():
        run.log_interval()
        try:
            batch = broker.receive(group, topic, max_messages=batch_size, invisible_duration_s=invisible_duration_s,
                                   wait_s=wait_s, filter_expression=filter_expression, filter_type=filter_type)
        except BrokerUnavailableError as exc:
            stop.wait(run.outage.failed(exc))
            continue
        run.outage.recovered()
        handled: list[ReceivedMessage] = []
        for index, received in enumerate(batch):
            if stop.is_set():
                _release(broker, run, batch[index:])
                break
            with run.delivering(received) as delivery:
                try:
                    result = handler(received)
                except Exception:
                    run.failed(received, delivery)
                    continue
                run.succeeded(delivery, result)
            handled.append(received)
            if not batch_acks:
                _ack(broker, run, handled)
                handled = []
        _ack(broker, run, handled)
    return run.stopped()


def _ack(broker: BrokerAPI, run: ConsumerRun, handled: list[ReceivedMessage]) -> None:
    """Ack the handled messages in one call (none: no call)."""
    if not handled:
        return
    try:
        outcomes: Sequence[BrokerError | None] = broker.ack_many(run.group, [r.receipt_handle for r in handled])
    except ACK_ERRORS as exc:
        outcomes = [exc] * len(handled)
    run.acked(handled, outcomes)


def _release(broker: BrokerAPI, run: ConsumerRun, unhandled: Sequence[ReceivedMessage]) -> None:
    """Make messages received but not handled visible again now (best effort: one that
    cannot be released comes back after its invisible duration anyway)."""
    for received in unhandled:
        try:
            broker.change_invisible_duration(run.group, received.receipt_handle, RELEASED_INVISIBLE_S)
        except BrokerError as exc:
            run.not_released(received, exc)


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` on SIGTERM and SIGINT (a clean shutdown after the current message)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
