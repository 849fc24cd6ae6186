"""A durable, RocketMQ-style message broker in pure Python, in-process or over TCP."""

from .api import BrokerAPI, BrokerStats, ParkedTransaction, TopicInfo, TransactionChecker
from .broker.config import BrokerConfig, ServerLimits
from .broker.facade import EmbeddedBroker
from .client.aio import AsyncBrokerClient
from .client.tcp import BrokerClient
from .errors import BrokerError
from .message import (
    DELAY_LEVELS_S,
    CheckRequest,
    EndTransactionResult,
    Message,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
)
from .urls import connect

__all__ = [
    "AsyncBrokerClient",
    "DELAY_LEVELS_S",
    "BrokerAPI",
    "BrokerClient",
    "BrokerConfig",
    "EmbeddedBroker",
    "BrokerError",
    "BrokerStats",
    "CheckRequest",
    "EndTransactionResult",
    "Message",
    "ParkedTransaction",
    "ReceivedMessage",
    "Resolution",
    "SendResult",
    "ServerLimits",
    "StoredMessage",
    "TopicInfo",
    "TransactionChecker",
    "TransactionState",
    "connect",
]
