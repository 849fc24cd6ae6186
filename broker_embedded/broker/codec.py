"""Messages to store records and back: RocketMQ's convention of carrying fields as properties.

User properties are stored with a ``u.`` prefix so they can never collide with the
broker's own (``UNIQ_KEY``, ``KEYS``, ``TAGS``, ``REAL_TOPIC``, ``TRAN_ID``, ...).

Reading is tolerant: a stored property the broker interprets may hold anything (a record
of an older version, or one damaged behind a valid CRC), so each is parsed by one of the
``*_property`` functions, which raise ``PropertyError`` for a value out of range; the
callers decide what such a record becomes, and no stored value can stop a start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from ..filters import TAG_PROPERTY
from ..message import DELAY_LEVELS_S, MAX_TRANSACTION_TIMEOUT_S, Message, SendResult, StoredMessage
from ..store.record import PROPERTY_KEYS, PROPERTY_MESSAGE_ID, PROPERTY_TAG, StoredRecord
from ..topics import SCHEDULE_TOPIC

USER_PREFIX = "u."
DELAY_LEVEL = "DELAY"
DELIVER_AT = "DELIVER_AT"
MESSAGE_GROUP = "MSG_GROUP"
TRANSACTION_TIMEOUT = "TRAN_TIMEOUT"
TRANSACTION_ID = "TRAN_ID"
PRODUCER_GROUP = "PGROUP"
REAL_TOPIC = "REAL_TOPIC"
REAL_QUEUE_ID = "REAL_QID"
ORIGIN_MESSAGE_ID = "ORIGIN_MSG_ID"
DELIVERY_ATTEMPTS = "DELIVERY_ATTEMPTS"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

#: The largest epoch millisecond a stored time may hold (the record format's u64 times).
MAX_EPOCH_MS = 2**63 - 1

log = logging.getLogger(__name__)
T = TypeVar("T")


class PropertyError(ValueError):
    """A stored property the broker interprets holds a value it cannot use."""


def int_property(props: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    """Property ``name`` as a whole number in ``[low, high]``; None when absent."""
    raw = props.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise PropertyError(f"{name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise PropertyError(f"{name}={raw!r} is not in {low}..{high}")
    return value


def delay_level_property(props: Mapping[str, str]) -> int:
    """The stored delay level (0: none)."""
    return int_property(props, DELAY_LEVEL, 0, len(DELAY_LEVELS_S)) or 0


def deliver_at_property(props: Mapping[str, str]) -> int | None:
    """The stored exact delivery time (epoch ms), if any."""
    return int_property(props, DELIVER_AT, 0, MAX_EPOCH_MS)


def timeout_property(props: Mapping[str, str]) -> float | None:
    """The stored per-message transaction timeout in seconds, if any."""
    raw = props.get(TRANSACTION_TIMEOUT)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TRANSACTION_TIMEOUT_S):
        raise PropertyError(f"{TRANSACTION_TIMEOUT}={raw!r} is not a number of seconds in "
                            f"(0, {MAX_TRANSACTION_TIMEOUT_S:g}]")
    return value


def tolerant(record: StoredRecord, read: Callable[[Mapping[str, str]], T], default: T) -> T:
    """``read(record.properties)``, or ``default`` (logged) when a value is unusable."""
    try:
        return read(record.properties)
    except PropertyError as exc:
        log.warning("record at commit log offset %d: %s; read as %r", record.commit_log_offset, exc, default)
        return default


def message_properties(message: Message) -> dict[str, str]:
    """The record properties that carry a message's fields."""
    props = {USER_PREFIX + k: v for k, v in message.properties.items()}
    props[PROPERTY_MESSAGE_ID] = message.message_id
    if message.keys:
        props[PROPERTY_KEYS] = " ".join(message.keys)
    if message.tag:
        props[PROPERTY_TAG] = message.tag
    if message.delay_level:
        props[DELAY_LEVEL] = str(message.delay_level)
    if message.deliver_at_ms is not None:
        props[DELIVER_AT] = str(message.deliver_at_ms)
    if message.message_group:
        props[MESSAGE_GROUP] = message.message_group
    if message.transaction_timeout_s is not None:
        props[TRANSACTION_TIMEOUT] = repr(message.transaction_timeout_s)
    return props


class FilterProperties(Mapping[str, str]):
    """A record's properties as a filter sees them: its user properties by their names,
    and its tag as ``TAGS`` (which no user property may shadow, as in RocketMQ)."""

    __slots__ = ("_stored",)

    def __init__(self, stored: Mapping[str, str]) -> None:
        self._stored = stored

    def __getitem__(self, name: str) -> str:
        return self._stored[PROPERTY_TAG if name == TAG_PROPERTY else USER_PREFIX + name]

    def __iter__(self) -> Iterator[str]:
        shadowed = USER_PREFIX + TAG_PROPERTY
        yield from (k[len(USER_PREFIX):] for k in self._stored if k.startswith(USER_PREFIX) and k != shadowed)
        if PROPERTY_TAG in self._stored:
            yield TAG_PROPERTY

    def __len__(self) -> int:
        return sum(1 for _ in self)


def message_of(record: StoredRecord, topic: str | None = None) -> Message:
    """Rebuild the message a record carries (``topic`` overrides, e.g. for half messages);
    an unusable delay or timeout property reads as none."""
    props: Mapping[str, str] = record.properties
    keys = props.get(PROPERTY_KEYS, "")
    return Message(
        topic=topic or props.get(REAL_TOPIC, record.topic),
        body=record.body,
        keys=tuple(keys.split()) if keys else (),
        tag=props.get(PROPERTY_TAG, ""),
        properties={k[len(USER_PREFIX):]: v for k, v in props.items() if k.startswith(USER_PREFIX)},
        message_id=props.get(PROPERTY_MESSAGE_ID, ""),
        delay_level=tolerant(record, delay_level_property, 0) if DELAY_LEVEL in props else 0,
        deliver_at_ms=tolerant(record, deliver_at_property, None) if DELIVER_AT in props else None,
        message_group=props.get(MESSAGE_GROUP) or None,
        transaction_timeout_s=tolerant(record, timeout_property, None) if TRANSACTION_TIMEOUT in props else None,
    )


def stored_message_of(record: StoredRecord) -> StoredMessage:
    """The API view of a record in a user topic."""
    return StoredMessage(
        message=message_of(record, record.topic),
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commit_log_offset=record.commit_log_offset,
        born_timestamp_ms=record.born_timestamp_ms,
        store_timestamp_ms=record.store_timestamp_ms,
        transaction_id=record.properties.get(TRANSACTION_ID),
    )


def send_result(stored: StoredRecord) -> SendResult:
    """Where a message was stored, as its producer is told: its topic, queue and offset, or,
    held in the delay topic, the queue it goes to and no offset there yet (-1); with the
    transaction it committed in, if any."""
    props = stored.properties
    message_id, transaction_id = props.get(PROPERTY_MESSAGE_ID, ""), props.get(TRANSACTION_ID)
    if stored.topic != SCHEDULE_TOPIC:
        return SendResult(message_id, stored.topic, stored.queue_id, stored.queue_offset, stored.commit_log_offset,
                          transaction_id)
    return SendResult(message_id, props.get(REAL_TOPIC, ""), int(props.get(REAL_QUEUE_ID, "0")), -1,
                      stored.commit_log_offset, transaction_id)


def without(props: Mapping[str, str], *names: str) -> dict[str, str]:
    """A copy of ``props`` without ``names``."""
    return {k: v for k, v in props.items() if k not in names}
