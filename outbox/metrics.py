"""Prometheus metrics of the outbox, in the application's own registry (the ``metrics``
extra: ``pip install "halfmoon[metrics]"``).

    from outbox import metrics
    metrics.install()                   # the default registry, served by the app's /metrics
    metrics.install(registry=my_registry)

``install`` is idempotent per registry; the metrics listen to ``outbox.instrumentation``.
Names, types and labels (all prefixed ``halfmoon_outbox_``) are listed in
docs/observability.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from broker_embedded import ReceivedMessage, Resolution

from . import instrumentation
from .errors import missing_extra

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ModuleNotFoundError as exc:
    raise missing_extra("outbox.metrics", "metrics", exc) from exc

PREFIX = "halfmoon_outbox_"

#: Broker round trips: sub-millisecond in process, tens of milliseconds over a network with fsync.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: ``halfmoon_outbox_transactions_total``'s outcome label for each resolution sent after a local transaction.
TRANSACTION_OUTCOMES = {
    Resolution.COMMIT: "committed",
    Resolution.ROLLBACK: "rolled_back",
    Resolution.UNKNOWN: "unknown",
}


class OutboxMetrics(instrumentation.Subscriber):
    """The outbox's metrics in one registry, fed by instrumentation listeners."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.half_send_seconds = Histogram(
            PREFIX + "half_send_duration_seconds", "Time to store a half message in the broker.",
            ["producer_group"], registry=registry, buckets=LATENCY_BUCKETS_S)
        self.end_transaction_seconds = Histogram(
            PREFIX + "end_transaction_duration_seconds",
            "Time to deliver END_TRANSACTION (COMMIT/ROLLBACK) to the broker.",
            ["producer_group"], registry=registry, buckets=LATENCY_BUCKETS_S)
        self.transactions = Counter(
            PREFIX + "transactions", "Local transactions by the outcome their producer sent the broker.",
            ["producer_group", "outcome"], registry=registry)
        self.fenced = Counter(
            PREFIX + "fenced_transactions",
            "Local transactions rolled back because a check-back's fence got there first.",
            ["producer_group"], registry=registry)
        self.check_backs = Counter(
            PREFIX + "check_backs", "Check-backs answered, by answer (unknown: the broker asks again).",
            ["producer_group", "answer"], registry=registry)
        self.deliveries = Counter(
            PREFIX + "deliveries", "Messages a consumer took from the broker, by outcome.",
            ["consumer_group", "topic", "outcome"], registry=registry)
        self.duplicates = Counter(
            PREFIX + "duplicates_skipped",
            "Messages the idempotent consumer skipped as already consumed.",
            ["consumer_group"], registry=registry)
        self.purged_rows = Counter(
            PREFIX + "purged_rows", "Rows purged from the outbox tables.", ["table"], registry=registry)
        self.stored = Counter(
            PREFIX + "stored_messages",
            "Messages written to the producer's database because the broker could not take them (store mode).",
            ["producer_group"], registry=registry)
        self.relayed = Counter(
            PREFIX + "relayed_messages", "Stored messages the relay handed to the broker.",
            ["producer_group"], registry=registry)
        self.unrelayed = Gauge(
            PREFIX + "stored_unrelayed_messages", "Stored messages waiting for the relay, as the relay last saw.",
            ["producer_group"], registry=registry)
        self.oldest_unrelayed = Gauge(
            PREFIX + "stored_oldest_age_seconds",
            "Age of the oldest stored message waiting for the relay (0: none), as the relay last saw.",
            ["producer_group"], registry=registry)

    def listeners(self) -> dict[str, Callable[..., Any]]:
        return {
            instrumentation.SEND_HALF: self._on_half_send,
            instrumentation.END_TRANSACTION: self._on_end_transaction,
            instrumentation.CHECK_BACK: self._on_check_back,
            instrumentation.DELIVERY: self._on_delivery,
            instrumentation.TRANSACTION_FENCED: self._on_fenced,
            instrumentation.DUPLICATE_SKIPPED: self._on_duplicate,
            instrumentation.ROWS_PURGED: self._on_purged,
            instrumentation.MESSAGES_STORED: self._on_stored,
            instrumentation.MESSAGES_RELAYED: self._on_relayed,
            instrumentation.STORED_BACKLOG: self._on_backlog,
        }

    def remove(self) -> None:
        """Stop updating, and unregister the metrics from their registry."""
        super().remove()
        for collector in (self.half_send_seconds, self.end_transaction_seconds, self.transactions, self.fenced,
                          self.check_backs, self.deliveries, self.duplicates, self.purged_rows, self.stored,
                          self.relayed, self.unrelayed, self.oldest_unrelayed):
            self.registry.unregister(collector)

    @contextlib.contextmanager
    def _on_half_send(self, operation: instrumentation.Operation) -> Iterator[None]:
        with self.half_send_seconds.labels(operation.attributes["producer_group"]).time():
            yield

    @contextlib.contextmanager
    def _on_end_transaction(self, operation: instrumentation.Operation) -> Iterator[None]:
        attributes = operation.attributes
        group = attributes["producer_group"]
        start = time.perf_counter()
        try:
            yield
        finally:
            self.end_transaction_seconds.labels(group).observe(time.perf_counter() - start)
            if not attributes["from_check"]:
                self.transactions.labels(group, TRANSACTION_OUTCOMES[attributes["resolution"]]).inc()

    @contextlib.contextmanager
    def _on_check_back(self, operation: instrumentation.Operation) -> Iterator[None]:
        try:
            yield
        finally:  # an answer that failed is none: the broker asks again, as after UNKNOWN
            answer = operation.outcome or Resolution.UNKNOWN.value
            self.check_backs.labels(operation.attributes["producer_group"], answer).inc()

    @contextlib.contextmanager
    def _on_delivery(self, operation: instrumentation.Operation) -> Iterator[None]:
        try:
            yield
        finally:
            received: ReceivedMessage = operation.attributes["received"]
            self.deliveries.labels(operation.attributes["consumer_group"], received.message.topic,
                                   operation.outcome or "failed").inc()

    def _on_fenced(self, producer_group: str, transaction_id: str) -> None:
        self.fenced.labels(producer_group).inc()

    def _on_duplicate(self, consumer_group: str, received: ReceivedMessage) -> None:
        self.duplicates.labels(consumer_group).inc()

    def _on_purged(self, table: str, rows: int) -> None:
        self.purged_rows.labels(table).inc(rows)

    def _on_stored(self, producer_group: str, transaction_id: str, count: int) -> None:
        self.stored.labels(producer_group).inc(count)

    def _on_relayed(self, producer_group: str, count: int) -> None:
        self.relayed.labels(producer_group).inc(count)

    def _on_backlog(self, producer_group: str, unrelayed: int, oldest_age_s: float) -> None:
        self.unrelayed.labels(producer_group).set(unrelayed)
        self.oldest_unrelayed.labels(producer_group).set(oldest_age_s)


_installed: dict[int, OutboxMetrics] = {}
_lock = threading.Lock()


def install(registry: CollectorRegistry | None = None) -> OutboxMetrics:
    """Register the outbox's metrics in ``registry`` (default: prometheus_client's
    default registry) and keep them up to date; once per registry."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _installed.get(id(registry))  # the entry keeps its registry alive: ids stay unique
        if metrics is None:
            metrics = _installed[id(registry)] = OutboxMetrics(registry)
            metrics.listen()
        return metrics


def uninstall(registry: CollectorRegistry | None = None) -> None:
    """Undo ``install(registry)``: its metrics stop and leave the registry."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _installed.pop(id(registry), None)
        if metrics is not None:
            metrics.remove()
