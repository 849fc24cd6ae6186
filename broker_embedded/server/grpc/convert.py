"""Messages between RocketMQ 5 protobuf and the broker's own values."""

from __future__ import annotations

import gzip
import hashlib
import zlib

from ...errors import InvalidMessageError, UnsupportedError
from ...message import CheckRequest, Message, ReceivedMessage
from ._proto import definition_pb2 as pb

#: The property a priority message's priority is stored in (native consumers and SQL92 filters
#: see it under this name; gRPC consumers read it as ``SystemProperties.priority``).
PRIORITY_PROPERTY = "HALFMOON_PRIORITY"
#: A ``delivery_timestamp.seconds`` past this (year 3000) is milliseconds: the Python client
#: 5.1.2 writes milliseconds into the seconds field.
MAX_SECONDS = 32_503_680_000


def body_digest(body: bytes) -> pb.Digest:
    """MD5 of ``body`` in upper-case hex, as RocketMQ's proxy sends it: the one digest every
    official client checks the same way (their CRC32 renderings differ: Node's is decimal)."""
    return pb.Digest(type=pb.MD5, checksum=hashlib.md5(body, usedforsecurity=False).hexdigest().upper())


def deliver_at_ms(properties: pb.SystemProperties) -> int | None:
    """The epoch milliseconds of a message's ``delivery_timestamp`` (None: not delayed),
    whether the client wrote seconds (the protocol) or milliseconds (Python client 5.1.2)."""
    if not properties.HasField("delivery_timestamp"):
        return None
    stamp = properties.delivery_timestamp
    if stamp.seconds > MAX_SECONDS:
        return int(stamp.seconds)
    return int(stamp.seconds * 1000 + stamp.nanos // 1_000_000)


def _body(message: pb.Message) -> bytes:
    encoding = message.system_properties.body_encoding
    if encoding == pb.GZIP:
        try:
            return gzip.decompress(message.body)
        except (OSError, EOFError, zlib.error) as exc:
            raise InvalidMessageError(f"the GZIP body cannot be decompressed: {exc}") from None
    if encoding not in (pb.IDENTITY, pb.ENCODING_UNSPECIFIED):
        raise InvalidMessageError(f"unknown body encoding {encoding}")
    return bytes(message.body)


def from_proto(message: pb.Message) -> Message:
    """A sent message as the broker stores it (its type is the caller's to check). Lite
    messages are refused (``UnsupportedError``), and a priority that is negative or set with
    a message group, a delivery time or a transaction (``InvalidMessageError``)."""
    properties = message.system_properties
    if not message.topic.name:
        raise InvalidMessageError("the message names no topic")
    if not properties.message_id:
        raise InvalidMessageError("the message has no message_id")
    if properties.message_type == pb.LITE or properties.HasField("lite_topic"):
        raise UnsupportedError("lite topics (LITE messages) are not implemented by halfmoon's broker")
    user_properties = dict(message.user_properties)
    user_properties.pop(PRIORITY_PROPERTY, None)  # only the priority field sets it
    if properties.HasField("priority"):
        user_properties[PRIORITY_PROPERTY] = str(_priority(properties))
    return Message(
        topic=message.topic.name,
        body=_body(message),
        keys=tuple(properties.keys),
        tag=properties.tag if properties.HasField("tag") else "",
        properties=user_properties,
        message_id=properties.message_id,
        deliver_at_ms=deliver_at_ms(properties),
        message_group=properties.message_group if properties.HasField("message_group") else None,
        transaction_timeout_s=_recovery_duration_s(properties),
    )


def _priority(properties: pb.SystemProperties) -> int:
    """A priority message's priority: >= 0, and not with a message group, a delivery time or
    a transaction (RocketMQ's rules for the PRIORITY type)."""
    if properties.priority < 0:
        raise InvalidMessageError(f"priority {properties.priority} is negative")
    for field in ("message_group", "delivery_timestamp"):
        if properties.HasField(field):
            raise InvalidMessageError(f"a priority message cannot have a {field}")
    if properties.message_type == pb.TRANSACTION:
        raise InvalidMessageError("a transactional message cannot have a priority")
    return properties.priority


def priority_of(message: Message) -> int | None:
    """The priority a message was sent with (None: not a priority message)."""
    stored = message.properties.get(PRIORITY_PROPERTY)
    return int(stored) if stored is not None and stored.isdigit() else None


def _recovery_duration_s(properties: pb.SystemProperties) -> float | None:
    """A half message's ``orphaned_transaction_recovery_duration`` (the Java client's
    transaction timeout): when its first check-back is due. None: the broker's default."""
    if not properties.HasField("orphaned_transaction_recovery_duration"):
        return None
    duration = properties.orphaned_transaction_recovery_duration
    return duration.seconds + duration.nanos / 1e9 or None


def message_type(message: Message, transactional: bool) -> pb.MessageType:
    if transactional:
        return pb.TRANSACTION
    if message.message_group is not None:
        return pb.FIFO
    if message.deliver_at_ms is not None or message.delay_level:
        return pb.DELAY
    if priority_of(message) is not None:
        return pb.PRIORITY
    return pb.NORMAL


def to_proto(message: Message, transactional: bool = False) -> pb.Message:
    """A stored message as the clients read it (check-backs carry it as well)."""
    body = bytes(message.body)
    properties = pb.SystemProperties(
        keys=list(message.keys),
        message_id=message.message_id,
        body_digest=body_digest(body),
        body_encoding=pb.IDENTITY,
        message_type=message_type(message, transactional),
    )
    if message.tag:
        properties.tag = message.tag
    if message.message_group is not None:
        properties.message_group = message.message_group
    if message.deliver_at_ms is not None:
        properties.delivery_timestamp.FromMilliseconds(message.deliver_at_ms)
    user_properties = dict(message.properties)
    priority = priority_of(message)
    if priority is not None:
        properties.priority = priority
        del user_properties[PRIORITY_PROPERTY]
    return pb.Message(topic=pb.Resource(name=message.topic), user_properties=user_properties,
                      system_properties=properties, body=body)


def received_to_proto(received: ReceivedMessage, invisible_duration_s: float) -> pb.Message:
    """A received message with its receipt handle, attempt and place in the queue."""
    message = to_proto(received.message, transactional=received.transaction_id is not None)
    properties = message.system_properties
    properties.receipt_handle = received.receipt_handle
    properties.delivery_attempt = received.delivery_attempt
    properties.queue_id = received.queue_id
    properties.queue_offset = received.queue_offset
    properties.born_timestamp.FromMilliseconds(received.born_timestamp_ms)
    properties.store_timestamp.FromMilliseconds(received.store_timestamp_ms)
    properties.invisible_duration.FromMilliseconds(int(invisible_duration_s * 1000))
    return message


def check_to_proto(request: CheckRequest) -> pb.Message:
    """The half message of a check-back (its message id is the transaction id)."""
    return to_proto(request.message, transactional=True)
