"""A durable, RocketMQ-style message broker in pure Python, in-process or over TCP."""

from .aio_client import AsyncBrokerClient
from .api import BrokerAPI, BrokerStats, ParkedTransaction, TopicInfo, TransactionChecker
from .broker import EmbeddedBroker
from .client import BrokerClient
from .config import BrokerConfig, ServerLimits
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
