"""Topic names: validation, and the system topics the broker keeps for itself."""

from __future__ import annotations

import re

from .errors import InvalidMessageError, InvalidTopicError, ReservedTopicError
from .message import Message

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CONSUMER_STATE_TOPIC = "RMQ_SYS_CONSUMER_STATE"
DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"

MAX_TOPIC_LENGTH = 127
#: Message and transaction ids fit the framework's VARCHAR(64) columns.
MAX_ID_LENGTH = 64
_VALID = re.compile(r"^[A-Za-z0-9_.\-]+$")
_RESERVED_PREFIXES = ("RMQ_SYS_", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_", DLQ_PREFIX, RETRY_PREFIX)


def validate_user_topic(topic: str) -> None:
    """Raise ``InvalidTopicError`` or ``ReservedTopicError`` unless ``topic`` is usable."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError("topic name is empty")
    if topic.startswith(_RESERVED_PREFIXES):
        raise ReservedTopicError(f"topic {topic!r} is reserved for the broker")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic name longer than {MAX_TOPIC_LENGTH} characters")
    if not _VALID.match(topic):
        raise InvalidTopicError(f"topic {topic!r} may contain only letters, digits, '_', '.' and '-'")


def validate_group(group: str) -> None:
    """Consumer and producer groups follow the topic rules (they name system topics)."""
    if not group or len(group) > MAX_TOPIC_LENGTH or not _VALID.match(group):
        raise InvalidTopicError(f"group {group!r} may contain only letters, digits, '_', '.' and '-'")


def validate_identifiers(message: Message) -> None:
    """``InvalidMessageError`` for a bad message id, a key with whitespace (keys are stored
    space-joined), or a tag with whitespace."""
    if not message.message_id or len(message.message_id) > MAX_ID_LENGTH or not message.message_id.isprintable() \
            or " " in message.message_id:
        raise InvalidMessageError(f"a message id has 1 to {MAX_ID_LENGTH} printable characters and no spaces")
    for key in message.keys:
        if not key or any(c.isspace() for c in key):
            raise InvalidMessageError(f"key {key!r} is empty or contains whitespace")
    if any(c.isspace() for c in message.tag):
        raise InvalidMessageError(f"tag {message.tag!r} contains whitespace")


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group
