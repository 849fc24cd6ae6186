"""The values that cross the broker's API: messages, results, and check requests."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

#: RocketMQ's 18 delay levels, in seconds; level ``n`` is ``DELAY_LEVELS_S[n - 1]``.
DELAY_LEVELS_S: tuple[int, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)


def new_message_id() -> str:
    """A unique client-side message id (32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Message:
    """A message as a producer sends it.

    ``delay_level`` (1..18) or ``deliver_at_ms`` (epoch milliseconds) delays delivery; on a
    transactional message the delay starts at commit. ``message_group`` makes delivery FIFO
    within the group. ``transaction_timeout_s`` overrides the broker's first-check delay
    for a half message.
    """

    topic: str
    body: bytes
    keys: tuple[str, ...] = ()
    tag: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    message_id: str = field(default_factory=new_message_id)
    delay_level: int = 0
    deliver_at_ms: int | None = None
    message_group: str | None = None
    transaction_timeout_s: float | None = None


class Resolution(enum.Enum):
    """How a transaction ends, or what a checker answers."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


class TransactionState(enum.Enum):
    """The broker's record of a transaction."""

    PENDING = "pending"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where the broker stored a message. ``transaction_id`` is set for half messages."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    transaction_id: str | None = None


@dataclass(frozen=True, slots=True)
class EndTransactionResult:
    """The outcome of END_TRANSACTION. ``applied`` is False for a repeated, identical call."""

    transaction_id: str
    state: TransactionState
    applied: bool
    message_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored in a (real) topic, read by offset or by query."""

    message: Message
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    transaction_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message handed to a consumer group; ack it with ``receipt_handle``."""

    message: Message
    receipt_handle: str
    delivery_attempt: int
    queue_id: int
    queue_offset: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    transaction_id: str | None = None


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """A check-back the broker asks a checker to answer, for one transaction.

    The checker answers later, asynchronously, with
    ``end_transaction(transaction_id, resolution, producer_group=..., from_check=True)``.
    """

    producer_group: str
    transaction_id: str
    message: Message
    check_times: int
