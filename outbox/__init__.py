"""Transactional messages for Python web apps, RocketMQ style.

The SQLAlchemy flavour lives here; the Django app is ``outbox.integrations.django``.
"""

from broker_embedded import Message, Resolution

from .consumer import idempotent_consumer, run_consumer
from .decorator import transactional_message
from .errors import (
    BodyNotSerializableError,
    BrokerUnavailable,
    ConfigurationError,
    OutboxError,
    SavepointError,
    TransactionFencedError,
)
from .integrations.sqlalchemy.session import install, send
from .messages import json_message, message_json
from .producer import Producer, TransactionListener
from .transaction_log import check_transaction

__all__ = [
    "BodyNotSerializableError",
    "BrokerUnavailable",
    "ConfigurationError",
    "Message",
    "OutboxError",
    "Producer",
    "Resolution",
    "SavepointError",
    "TransactionFencedError",
    "TransactionListener",
    "check_transaction",
    "idempotent_consumer",
    "install",
    "json_message",
    "message_json",
    "run_consumer",
    "send",
    "transactional_message",
]
