"""The broker's Prometheus metrics, in a ``CollectorRegistry`` of its own.

``register_broker_metrics(registry, broker)`` hooks a ``BrokerMetrics`` into an
``EmbeddedBroker`` and registers it in the registry the HTTP port serves at ``/metrics``
(the broker's own, never prometheus_client's global one). docs/operations.md lists every
metric. Two kinds:

* what happens (messages in and out, redeliveries, send and fsync latency): counted on the
  broker's hot paths through its observer hook, a store dispatch listener and the store's
  ``on_fsync``, into plain counters and bucket arrays under one lock (a batch costs one
  increment per topic, never a Prometheus child lookup per message);
* what is (pending and parked transactions, lag, DLQ depth, store and disk size): read
  from the broker's state when Prometheus scrapes, at a cost of O(topics + groups), never
  O(messages).

The broker core never imports this module (nor ``prometheus_client``): without a
registry the hooks stay None.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..broker.facade import EmbeddedBroker
from ..message import ReceivedMessage, Resolution
from ..store.record import StoredRecord

PREFIX = "halfmoon_broker_"
#: Bucket upper bounds (seconds) of the send latency (store + fsync in sync mode).
SEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Bucket upper bounds (seconds) of one fsync of the commit log.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: The ``outcome`` label of each check answer.
ANSWER_OUTCOMES = {Resolution.COMMIT: "commit", Resolution.ROLLBACK: "rollback", Resolution.UNKNOWN: "unknown"}


class LatencyHistogram:
    """Counts per bucket and a sum, observed under a lock: one bisect per observation,
    whatever the number of events it stands for."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float, count: int = 1) -> None:
        """``count`` events that each took ``seconds``."""
        index = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[index] += count
            self._sum += seconds * count

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


class BrokerMetrics(Collector):
    """Counts what the broker does and reads what it holds; a Prometheus ``Collector``.
    ``connections`` says how many TCP connections the server has open (None: no server)."""

    def __init__(self, broker: EmbeddedBroker, connections: Callable[[], int] | None = None) -> None:
        self.broker = broker
        self.connections = connections
        self._lock = threading.Lock()
        self._in: dict[str, list[int]] = {}  # topic -> [messages, body bytes]
        self._out: dict[tuple[str, str], list[int]] = {}  # (topic, group) -> [messages, bytes, redeliveries]
        self.send_seconds = LatencyHistogram(SEND_BUCKETS)
        self.fsync_seconds = LatencyHistogram(FSYNC_BUCKETS)

    def attach(self) -> None:
        """Hook into the broker: its observer, the store's fsyncs and dispatched records."""
        self.broker.observer = self
        self.broker.store.on_fsync = self.fsync_seconds.observe
        self.broker.store.add_dispatch_listener(self._stored)

    # -- the hooks (hot paths) ------------------------------------------------------------
    def _stored(self, records: list[StoredRecord]) -> None:
        """Records became durable: each message into a user topic (a send, a committed
        transactional message, a delayed message come due) counts as in."""
        topics = self.broker.topics
        with self._lock:
            for record in records:
                if record.topic not in topics:
                    continue
                counts = self._in.get(record.topic)
                if counts is None:
                    counts = self._in[record.topic] = [0, 0]
                counts[0] += 1
                counts[1] += len(record.body)

    def written(self, calls: int, seconds: float) -> None:
        self.send_seconds.observe(seconds, calls)

    def received(self, group: str, topic: str, messages: list[ReceivedMessage]) -> None:
        size = sum(len(m.message.body) for m in messages)
        again = sum(1 for m in messages if m.delivery_attempt > 1)
        with self._lock:
            counts = self._out.get((topic, group))
            if counts is None:
                counts = self._out[topic, group] = [0, 0, 0]
            counts[0] += len(messages)
            counts[1] += size
            counts[2] += again

    def delivered_per_topic(self) -> dict[str, int]:
        """Messages delivered so far per topic, all consumer groups together (the console's
        trends read it once per interval)."""
        totals: dict[str, int] = {}
        with self._lock:
            for (topic, _), counts in self._out.items():
                totals[topic] = totals.get(topic, 0) + counts[0]
        return totals

    # -- the scrape -----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        yield from self._counted()
        if not self.broker.closed:
            yield from self._transactions()
            yield from self._consumers()
            yield from self._storage()
        if self.connections is not None:
            yield _gauge("connections", "TCP connections open now", self.connections())

    def _counted(self) -> Iterator[Metric]:
        with self._lock:
            into = {topic: list(counts) for topic, counts in self._in.items()}
            out = {key: list(counts) for key, counts in self._out.items()}
        messages_in = CounterMetricFamily(PREFIX + "messages_in", "Messages stored into a topic (sends, "
                                          "committed transactional messages, delayed ones come due)",
                                          labels=["topic"])
        bytes_in = CounterMetricFamily(PREFIX + "message_in_bytes", "Body bytes of the messages stored into "
                                       "a topic", labels=["topic"])
        for topic, (messages, size) in sorted(into.items()):
            messages_in.add_metric([topic], messages)
            bytes_in.add_metric([topic], size)
        messages_out = CounterMetricFamily(PREFIX + "messages_out", "Messages delivered to a consumer group "
                                           "(redeliveries included)", labels=["topic", "group"])
        bytes_out = CounterMetricFamily(PREFIX + "message_out_bytes", "Body bytes of the messages delivered "
                                        "to a consumer group", labels=["topic", "group"])
        redeliveries = CounterMetricFamily(PREFIX + "redeliveries", "Deliveries of a message after its "
                                           "first (not acked in time)", labels=["topic", "group"])
        for (topic, group), (messages, size, again) in sorted(out.items()):
            messages_out.add_metric([topic, group], messages)
            bytes_out.add_metric([topic, group], size)
            redeliveries.add_metric([topic, group], again)
        yield from (messages_in, bytes_in, messages_out, bytes_out, redeliveries)
        yield self.send_seconds.family(PREFIX + "send_duration_seconds", "Time a write (send, half message, "
                                       "END_TRANSACTION) spent in the broker, durable per the flush mode")
        yield self.fsync_seconds.family(PREFIX + "fsync_duration_seconds", "Time of one fsync of the "
                                        "commit log (one covers every write of a group commit)")

    def _transactions(self) -> Iterator[Metric]:
        broker = self.broker
        book, checks, config = broker.book, broker.checks, broker.config
        parked = book.parked
        yield _gauge("transactions_pending", "Open transactions waiting for COMMIT or ROLLBACK",
                     len(book.by_id) - parked)
        yield _gauge("transactions_parked", "Transactions parked after check_max unanswered checks; "
                     "an operator must resolve them", parked)
        oldest = book.oldest_pending_store_ms()
        age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
        yield _gauge("transaction_oldest_pending_age_seconds", "Age of the oldest pending transaction's "
                     "first half message (0 when none is pending)", age)
        yield _gauge("transaction_check_horizon_seconds", "How long a transaction may stay pending before "
                     "it is parked: transaction timeout + check_max x check interval",
                     config.transaction_timeout_s + config.check_max * config.check_interval_s)
        ended = CounterMetricFamily(PREFIX + "transactions_ended", "Transactions committed or rolled back "
                                    "(kept across restarts)", labels=["outcome"])
        ended.add_metric(["commit"], book.committed)
        ended.add_metric(["rollback"], book.rolled_back)
        yield ended
        yield CounterMetricFamily(PREFIX + "checks_sent", "Check-backs handed to a checker",
                                  value=checks.checks_sent)
        outcomes = CounterMetricFamily(PREFIX + "check_outcomes", "Check-backs by outcome: the checker's "
                                       "answer, or no_route when no checker took it", labels=["outcome"])
        answers = checks.answer_counts()
        for resolution, outcome in ANSWER_OUTCOMES.items():
            outcomes.add_metric([outcome], answers.get(resolution, 0))
        outcomes.add_metric(["no_route"], checks.checks_unrouted)
        yield outcomes
        unanswered = GaugeMetricFamily(PREFIX + "check_unanswered_seconds", "Seconds a producer group's "
                                       "check-backs have gone without an answer (listed past two check "
                                       "intervals)", labels=["group"])
        for group, seconds in sorted(checks.unanswered.seconds().items()):
            unanswered.add_metric([group], seconds)
        yield unanswered

    def _consumers(self) -> Iterator[Metric]:
        broker = self.broker
        lag = GaugeMetricFamily(PREFIX + "consumer_lag_messages", "Messages of a topic a consumer group has "
                                "not acked yet", labels=["group", "topic"])
        in_flight = GaugeMetricFamily(PREFIX + "consumer_in_flight_messages", "Messages received by a "
                                      "consumer group, not acked, within their invisible duration",
                                      labels=["group", "topic"])
        for (group, topic), (behind, held) in sorted(broker.consumers.summary().items()):
            lag.add_metric([group, topic], behind)
            in_flight.add_metric([group, topic], held)
        yield lag
        yield in_flight
        dlq = GaugeMetricFamily(PREFIX + "dlq_messages", "Messages in a consumer group's dead-letter queue",
                                labels=["group"])
        for group, depth in sorted(broker.dlq_depth().items()):
            dlq.add_metric([group], depth)
        yield dlq
        stored = GaugeMetricFamily(PREFIX + "topic_messages", "Messages stored in a topic, all queues",
                                   labels=["topic"])
        for info in broker.list_topics():
            stored.add_metric([info.name], sum(info.depth))
        yield stored
        yield _gauge("delayed_messages", "Delayed messages waiting for their delivery time", len(broker.delays))

    def _storage(self) -> Iterator[Metric]:
        store = self.broker.store
        commitlog = store.commitlog
        yield _gauge("commitlog_bytes", "Bytes of records the commit log holds (retention deletes old "
                     "segments)", commitlog.write_offset - commitlog.min_offset)
        disk = os.statvfs(self.broker.data_dir)
        yield _gauge("disk_free_bytes", "Free bytes, for unprivileged users, on the data directory's "
                     "file system", disk.f_bavail * disk.f_frsize)
        yield _gauge("disk_size_bytes", "Size of the data directory's file system", disk.f_blocks * disk.f_frsize)
        yield _gauge("recovery_seconds", "How long the store's recovery took when the broker opened",
                     store.recovery_seconds)
        yield from self._damage()

    def _damage(self) -> Iterator[Metric]:
        """Messages the store lost (the ledger's open losses, whoever found them) and what
        the scrub has checked: O(losses), never O(messages)."""
        store = self.broker.store
        losses = store.losses.open_losses()
        yield _gauge("store_lost_messages", "Acknowledged messages lost to damaged or missing commit log bytes "
                     "and not acknowledged by an operator yet", sum(loss.records for loss in losses))
        yield _gauge("store_losses_open", "Damaged or missing commit log ranges in the loss ledger not "
                     "acknowledged yet", len(losses))
        stats = store.scrub.stats
        yield CounterMetricFamily(PREFIX + "store_scrub_passes", "Full passes of the scrub over the commit "
                                  "log since the broker opened", value=stats.passes)
        yield CounterMetricFamily(PREFIX + "store_scrub_checked_bytes", "Commit log bytes the scrub read "
                                  "and verified since the broker opened", value=stats.checked_bytes)
        yield CounterMetricFamily(PREFIX + "store_scrub_damaged_ranges", "Damaged commit log ranges the scrub "
                                  "(or a reader) found and wrote to the loss ledger since the broker opened",
                                  value=stats.damaged_ranges)
        yield _gauge("store_scrub_last_pass_timestamp_seconds", "When the scrub's last full pass ended "
                     "(Unix time; 0 before the first)", stats.last_pass_end)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value)


def register_broker_metrics(registry: CollectorRegistry, broker: EmbeddedBroker,
                            connections: Callable[[], int] | None = None) -> BrokerMetrics:
    """Hook ``BrokerMetrics`` into ``broker`` from now on and register them in ``registry``."""
    metrics = BrokerMetrics(broker, connections)
    metrics.attach()
    registry.register(metrics)
    return metrics
