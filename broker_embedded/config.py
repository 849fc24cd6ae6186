"""Settings of the embedded broker."""

from __future__ import annotations

from dataclasses import dataclass, field

from .store.config import StoreConfig

#: Back-off before an un-acked message is visible again, by delivery attempt (seconds);
#: the last value repeats. RocketMQ's retry levels start at 10 s; ours start sooner.
DEFAULT_RETRY_BACKOFF_S: tuple[float, ...] = (1, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class BrokerConfig:
    """Transaction, consumption and limit settings; ``store`` holds the storage ones."""

    store: StoreConfig = field(default_factory=StoreConfig)
    transaction_timeout_s: float = 6.0
    check_interval_s: float = 5.0
    check_max: int = 15
    max_outstanding_checks: int = 1000
    max_body_size: int = 4 * 1024 * 1024
    auto_create_topics: bool = True
    default_queues: int = 4
    max_delivery_attempts: int = 16
    retry_backoff_s: tuple[float, ...] = DEFAULT_RETRY_BACKOFF_S
    max_inflight_per_queue: int = 2048
    service_tick_s: float = 0.1
    #: True: every receive/ack event is fsync'd before the call returns. False (default,
    #: RocketMQ's periodic offset persistence): durable within the store's flush interval,
    #: so a crash may deliver the last acked messages once more.
    sync_consumer_progress: bool = False
    #: How often the transaction book and consumer progress are snapshotted, bounding the
    #: records replayed on start.
    snapshot_interval_s: float = 5.0
