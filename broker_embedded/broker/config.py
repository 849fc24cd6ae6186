"""Settings of the embedded broker."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ..api import MAX_FRAME_BYTES
from ..message import MAX_PROPERTIES_BYTES
from ..store.config import StoreConfig

#: Back-off before an un-acked message is visible again, by delivery attempt (seconds);
#: the last value repeats. RocketMQ's retry levels start at 10 s; ours start sooner.
DEFAULT_RETRY_BACKOFF_S: tuple[float, ...] = (1, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class ServerLimits:
    """What clients may hold of a ``BrokerServer``; see "Limits" in docs/server.md.

    Per connection, the server stops reading (back-pressure, never an error) while the
    connection has ``max_requests_in_flight`` unanswered requests or more than
    ``max_reply_bytes`` of answers its client has not read yet.
    """

    #: Open connections; the next one gets ``ServerBusyError`` and is closed.
    max_connections: int = 1024
    #: With keys: a connection must authenticate within this long of opening or it is
    #: closed (asking for challenges does not extend it).
    auth_timeout_s: float = 10.0
    #: With keys: connections not authenticated yet (at most half of ``max_connections``);
    #: one more closes the oldest of them, so they never keep the right keys out.
    max_unauthenticated: int = 64
    #: A connection with nothing in flight (or whose client reads none of its answers)
    #: and no request for this long is closed. One registered for check-backs is not idle.
    idle_timeout_s: float = 300.0
    #: A request must arrive whole within this long of its first byte (or of the moment
    #: the server had room for it); a slower connection is closed.
    frame_timeout_s: float = 30.0
    #: Requests of one connection read and not yet answered.
    max_requests_in_flight: int = 64
    #: Answers of one connection waiting to be written to its socket.
    max_reply_bytes: int = 16 * 1024 * 1024
    #: Broker calls of one connection running at once (reads, queries, admin, receives
    #: that do not wait); writes and acks go into the server's shared batches instead.
    max_calls_per_connection: int = 8
    #: Receives of one connection waiting for messages at once; one more gets ``ServerBusyError``.
    max_long_polls_per_connection: int = 32
    #: Receives waiting for messages at once in the whole server, one thread each; more
    #: take turns. Receives that do not wait never queue behind them.
    max_long_polls: int = 256
    #: Memory for requests still arriving, shared by all connections: a connection holds
    #: up to 256 KiB of one on its own; a longer request takes its declared length from
    #: this budget before the server reads it, and waits while the budget is spent.
    max_incomplete_frame_bytes: int = 64 * 1024 * 1024
    #: Message bodies of writes waiting for (or in) a write batch, for all connections
    #: together; over it the server reads no request over 256 KiB from any connection
    #: until the batches have caught up (smaller ones never wait behind big writes).
    max_write_backlog_bytes: int = 8 * 1024 * 1024

    @property
    def unauthenticated_cap(self) -> int:
        """The connections that may wait to authenticate at once."""
        return max(1, min(self.max_unauthenticated, self.max_connections // 2))

    def __post_init__(self) -> None:
        for setting in fields(self):
            if getattr(self, setting.name) <= 0:
                raise ValueError(f"{setting.name} must be positive, got {getattr(self, setting.name)}")
        if self.max_long_polls_per_connection >= self.max_requests_in_flight:
            raise ValueError("max_long_polls_per_connection must be below max_requests_in_flight, so that "
                             "waiting receives never stop the server reading a connection (and seeing it close)")
        if self.max_incomplete_frame_bytes < MAX_FRAME_BYTES:
            raise ValueError(f"max_incomplete_frame_bytes must hold one whole frame ({MAX_FRAME_BYTES} bytes)")


@dataclass(frozen=True)
class BrokerConfig:
    """Transaction, consumption and limit settings; ``store`` holds the storage ones."""

    store: StoreConfig = field(default_factory=StoreConfig)
    transaction_timeout_s: float = 6.0
    check_interval_s: float = 5.0
    check_max: int = 15
    max_outstanding_checks: int = 1000
    max_body_size: int = 4 * 1024 * 1024
    #: Keys, tag, properties and ids of a message together (UTF-8 bytes), like RocketMQ's
    #: 32 KiB of properties; with the body it bounds a stored message.
    max_properties_size: int = MAX_PROPERTIES_BYTES
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
    #: Bounds on connections when the broker is served over TCP.
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: The only directory EXPORT_MESSAGES may write under (absolute); None: ``<data_dir>/exports``.
    export_root: Path | None = None

    def __post_init__(self) -> None:
        if self.export_root is not None and not Path(self.export_root).is_absolute():
            raise ValueError(f"export_root must be an absolute path, got {self.export_root!r}")
