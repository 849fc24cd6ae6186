"""Topic names: validation, and the system topics the broker keeps for itself."""

from __future__ import annotations

import re

from .errors import InvalidTopicError, ReservedTopicError

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CONSUMER_STATE_TOPIC = "RMQ_SYS_CONSUMER_STATE"
#: A record per recalled delayed message (its message id; the schedule record it takes back).
RECALL_TOPIC = "RMQ_SYS_RECALL"
DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"

MAX_TOPIC_LENGTH = 127
#: Queues a topic may have (a stored real queue id is below it).
MAX_QUEUES = 256
#: Message and transaction ids fit the framework's VARCHAR(64) columns.
MAX_ID_LENGTH = 64
_VALID = re.compile(r"[A-Za-z0-9_.\-]+")
_RESERVED_PREFIXES = ("RMQ_SYS_", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_", DLQ_PREFIX, RETRY_PREFIX)


def validate_user_topic(topic: str) -> None:
    """Raise ``InvalidTopicError`` or ``ReservedTopicError`` unless ``topic`` is usable."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError("topic name is empty")
    if topic.startswith(_RESERVED_PREFIXES):
        raise ReservedTopicError(f"topic {topic!r} is reserved for the broker")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic name longer than {MAX_TOPIC_LENGTH} characters")
    if not _VALID.fullmatch(topic):
        raise InvalidTopicError(f"topic {topic!r} may contain only letters, digits, '_', '.' and '-'")


def validate_group(group: str) -> None:
    """Consumer and producer groups follow the topic rules (they name system topics)."""
    if not isinstance(group, str) or len(group) > MAX_TOPIC_LENGTH or not _VALID.fullmatch(group):
        raise InvalidTopicError(f"group {group!r} may contain only letters, digits, '_', '.' and '-'")


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group
