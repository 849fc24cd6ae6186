"""Messages to store records and back: RocketMQ's convention of carrying fields as properties.

User properties are stored with a ``u.`` prefix so they can never collide with the
broker's own (``UNIQ_KEY``, ``KEYS``, ``TAGS``, ``REAL_TOPIC``, ``TRAN_ID``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

from .message import Message, StoredMessage
from .store.record import PROPERTY_KEYS, PROPERTY_MESSAGE_ID, PROPERTY_TAG, StoredRecord

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


def message_of(record: StoredRecord, topic: str | None = None) -> Message:
    """Rebuild the message a record carries (``topic`` overrides, e.g. for half messages)."""
    props: Mapping[str, str] = record.properties
    keys = props.get(PROPERTY_KEYS, "")
    timeout = props.get(TRANSACTION_TIMEOUT)
    deliver_at = props.get(DELIVER_AT)
    return Message(
        topic=topic or props.get(REAL_TOPIC, record.topic),
        body=record.body,
        keys=tuple(keys.split()) if keys else (),
        tag=props.get(PROPERTY_TAG, ""),
        properties={k[len(USER_PREFIX):]: v for k, v in props.items() if k.startswith(USER_PREFIX)},
        message_id=props.get(PROPERTY_MESSAGE_ID, ""),
        delay_level=int(props.get(DELAY_LEVEL, "0")),
        deliver_at_ms=int(deliver_at) if deliver_at else None,
        message_group=props.get(MESSAGE_GROUP) or None,
        transaction_timeout_s=float(timeout) if timeout else None,
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


def without(props: Mapping[str, str], *names: str) -> dict[str, str]:
    """A copy of ``props`` without ``names``."""
    return {k: v for k, v in props.items() if k not in names}
