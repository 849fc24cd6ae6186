"""The console's trends: a sampler that reads the broker's own counters once per interval
into bounded ring buffers, for the Trends page (``charts`` draws them).

What it reads, at sample time only (nothing is hooked on the write or delivery paths):

* messages stored into each topic: the sum of the topic's queue max offsets (the broker's
  own counters, kept across restarts);
* messages delivered from each topic: the delivery counts of the broker's metrics when the
  broker's observer has them (``BrokerMetrics``, as ``serve --http-port`` registers it);
  without metrics there are no delivery rates and the page says so;
* each consumer group's lag per topic: what the Consumer groups page shows.

Memory is bounded: ``samples`` values per line, at most ``max_topics`` topics and
``max_groups`` (group, topic) pairs. While there is room every topic and pair is tracked;
when full, one that stayed quiet (no sends, deliveries or lag) for a whole window gives its
place to an untracked one that is active.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from ...broker.facade import EmbeddedBroker

log = logging.getLogger(__name__)

#: One sample every 30 s, 120 of them: the last hour.
DEFAULT_INTERVAL_S = 30.0
DEFAULT_SAMPLES = 120
#: How many topics, and (group, topic) pairs, the sampler tracks at most.
DEFAULT_MAX_TOPICS = 20
DEFAULT_MAX_GROUPS = 20

K = TypeVar("K", str, tuple[str, str])
#: One value per line of a series at one sample; None where it is unknown.
Values = tuple[float | None, ...]


@runtime_checkable
class DeliveryCounts(Protocol):
    """What the sampler reads deliveries from (``BrokerMetrics`` has it)."""

    def delivered_per_topic(self) -> dict[str, int]:
        """Messages delivered so far per topic, all consumer groups together."""
        ...


class SeriesSet(Generic[K]):
    """At most ``limit`` series of ``lines`` lines, each a ring of ``samples`` values."""

    def __init__(self, limit: int, samples: int, lines: int) -> None:
        self.limit, self.samples, self.lines = limit, samples, lines
        self.series: dict[K, tuple[deque[float | None], ...]] = {}
        self._tracked_at: dict[K, int] = {}
        self._tick = 0
        #: How many keys the last sample saw, tracked or not.
        self.seen = 0

    def record(self, values: Mapping[K, Values], active: set[K]) -> None:
        """One sample: ``values`` of every key there is now; an untracked key takes a free
        place, or the place of a quiet series when it is in ``active``."""
        self._tick += 1
        self.seen = len(values)
        for key in sorted(k for k in values if k not in self.series):
            if len(self.series) >= self.limit:
                if key not in active:
                    continue
                quiet = self._quiet()
                if quiet is None:
                    continue
                del self.series[quiet], self._tracked_at[quiet]
            self.series[key] = tuple(deque([None] * (self.samples - 1), maxlen=self.samples)
                                     for _ in range(self.lines))
            self._tracked_at[key] = self._tick
        unknown: Values = (None,) * self.lines
        for key, rings in self.series.items():
            for ring, value in zip(rings, values.get(key, unknown), strict=True):
                ring.append(value)

    def _quiet(self) -> K | None:
        """A series tracked for a whole window whose values were all zero or unknown."""
        return next((key for key, rings in self.series.items()
                     if self._tick - self._tracked_at[key] >= self.samples
                     and not any(value for ring in rings for value in ring)), None)


@dataclass(frozen=True)
class TrendView:
    """A copy of what the sampler holds, oldest sample first."""

    interval_s: float
    samples: int
    #: When each sample was taken (the sampler's clock, seconds).
    times: tuple[float, ...]
    #: Per topic: sends per second and deliveries per second, aligned with ``times``.
    topics: dict[str, tuple[tuple[float | None, ...], tuple[float | None, ...]]]
    #: Per (group, topic): lag in messages, aligned with ``times``.
    groups: dict[tuple[str, str], tuple[float | None, ...]]
    topics_seen: int
    groups_seen: int
    max_topics: int
    max_groups: int
    #: Whether the broker's metrics count deliveries (else the delivery rates are unknown).
    deliveries_counted: bool


class TrendSampler:
    """Samples ``broker``'s counters every ``interval_s`` seconds of ``clock`` (a thread of
    its own after ``start``, or whoever calls ``sample``); see the module docstring."""

    def __init__(self, broker: EmbeddedBroker, *, interval_s: float = DEFAULT_INTERVAL_S,
                 samples: int = DEFAULT_SAMPLES, max_topics: int = DEFAULT_MAX_TOPICS,
                 max_groups: int = DEFAULT_MAX_GROUPS, clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        for name, value, least in (("samples", samples, 2), ("max_topics", max_topics, 1),
                                   ("max_groups", max_groups, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
        self.broker = broker
        self.interval_s = interval_s
        self.clock = clock
        self.times: deque[float] = deque(maxlen=samples)
        self.topics: SeriesSet[str] = SeriesSet(max_topics, samples, 2)
        self.groups: SeriesSet[tuple[str, str]] = SeriesSet(max_groups, samples, 1)
        self._previous: tuple[float, dict[str, int], dict[str, int]] | None = None
        self._deliveries_counted = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Read the counters now and append one value to every tracked line."""
        now = self.clock()
        stored = {info.name: sum(info.depth) for info in self.broker.list_topics()}
        observer = self.broker.observer
        counts = observer if isinstance(observer, DeliveryCounts) else None
        delivered: dict[str, int] = counts.delivered_per_topic() if counts is not None else {}
        lags = {key: lag for key, (lag, _) in self.broker.consumers.summary().items()}
        with self._lock:
            previous, self._previous = self._previous, (now, stored, delivered)
            elapsed = now - previous[0] if previous is not None and now > previous[0] else None
            stored_before, delivered_before = (previous[1], previous[2]) if previous is not None else ({}, {})
            rates: dict[str, Values] = {}
            for topic, count in stored.items():
                rates[topic] = (_rate(count, stored_before.get(topic, 0), elapsed),
                                _rate(delivered.get(topic, 0), delivered_before.get(topic, 0), elapsed)
                                if counts is not None else None)
            self._deliveries_counted = counts is not None
            self.times.append(now)
            self.topics.record(rates, {topic for topic, pair in rates.items() if any(pair)})
            self.groups.record({key: (float(lag),) for key, lag in lags.items()},
                               {key for key, lag in lags.items() if lag})

    def view(self) -> TrendView:
        """A consistent copy of the buffers, for a page."""
        with self._lock:
            return TrendView(
                self.interval_s, self.topics.samples, tuple(self.times),
                {topic: (tuple(sends), tuple(deliveries)) for topic, (sends, deliveries) in self.topics.series.items()},
                {key: tuple(lag) for key, (lag,) in self.groups.series.items()},
                self.topics.seen, self.groups.seen, self.topics.limit, self.groups.limit, self._deliveries_counted,
            )

    # -- the thread -----------------------------------------------------------------------
    def start(self) -> None:
        """Sample now and then every interval on a daemon thread, until ``stop`` or the
        broker closes."""
        self._thread = threading.Thread(target=self._run, name="console-trends", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self.broker.closed:
            try:
                self.sample()
            except Exception:  # a broker closing under the read, or a bug: the next sample may do
                if not self.broker.closed:
                    log.exception("console trends: sampling the broker's counters failed")
            if self._stop.wait(self.interval_s):
                return


def _rate(count: int, before: int, elapsed: float | None) -> float | None:
    """Per second over ``elapsed`` seconds (a topic the previous sample did not see had 0);
    None for the first sample, or a counter that went down (the metrics restarted)."""
    if elapsed is None or count < before:
        return None
    return (count - before) / elapsed
