"""A durable, RocketMQ-style message broker in pure Python, in-process or over TCP.

The root holds the vocabulary every part shares (``api``, ``message``, ``errors``,
``topics``, ``checkers``, ``cli_tools``), which imports none of the parts; the parts are
grouped by role: ``store``, ``broker``, ``wire``, ``server``, ``http``, ``client``,
``cli`` (docs/broker.md, "Modules"; the layers are checked by ``.importlinter``). This
module and ``urls`` (``connect``) are the front door and may import any part.
``aio_client``, ``rocketmq5``, ``http_port``, ``readiness``, ``metrics`` and ``console``
re-export the modules' new homes for code that imports the old paths.
"""

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
