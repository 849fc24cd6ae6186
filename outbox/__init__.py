"""Transactional messages for Python web apps, RocketMQ style.

The core (messages, the producer and its asyncio twin ``AsyncProducer``, the fencing
rule, the message template, the idempotent consumer's rule) imports no ORM. The
SQLAlchemy flavour's names (``transactional_message``, ``install``, ``send``, ``asend``,
``check_transaction``, ``idempotent_consumer``) are loaded from
``outbox.integrations.sqlalchemy`` on first use, so ``import outbox`` works without
SQLAlchemy; the Django app is ``outbox.integrations.django``.

What an application needs of the broker is here too, so it imports only ``outbox``: the
messages (``Message``, ``ReceivedMessage``), ``Resolution`` and ``TransactionState``, the
broker's base error ``BrokerError``, ``connect(url)`` (a broker for a ``tcp://``,
``rocketmq5://`` or ``embedded://`` URL) and ``AsyncBrokerClient`` (the asyncio client
``arun_consumer`` reads from).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from broker_embedded import (
    AsyncBrokerClient,
    BrokerError,
    Message,
    ReceivedMessage,
    Resolution,
    TransactionState,
    connect,
)

from .aio_consumer import arun_consumer
from .aio_producer import AsyncProducer, AsyncTransactionListener
from .consumer import run_consumer
from .context import current_transaction_id
from .errors import (
    BodyNotSerializableError,
    BrokerUnavailable,
    BrokerUnavailableError,
    ConfigurationError,
    NestedTransactionError,
    OutboxError,
    SavepointError,
    SchemaMissingError,
    TransactionFencedError,
)
from .messages import OutboxJSONEncoder, json_message, message_json
from .producer import TRANSACTION_ID_PROPERTY, Producer, TransactionListener
from .template import MessageTemplate

if TYPE_CHECKING:
    from .integrations.sqlalchemy.consumer import idempotent_consumer as idempotent_consumer
    from .integrations.sqlalchemy.decorator import transactional_message as transactional_message
    from .integrations.sqlalchemy.recorder import check_transaction as check_transaction
    from .integrations.sqlalchemy.session import asend as asend
    from .integrations.sqlalchemy.session import install as install
    from .integrations.sqlalchemy.session import send as send

#: The SQLAlchemy flavour's names, and the module each comes from.
_SQLALCHEMY_NAMES = {
    "asend": "outbox.integrations.sqlalchemy.session",
    "check_transaction": "outbox.integrations.sqlalchemy.recorder",
    "idempotent_consumer": "outbox.integrations.sqlalchemy.consumer",
    "install": "outbox.integrations.sqlalchemy.session",
    "send": "outbox.integrations.sqlalchemy.session",
    "transactional_message": "outbox.integrations.sqlalchemy.decorator",
}


def __getattr__(name: str) -> Any:
    module = _SQLALCHEMY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name != "sqlalchemy":
            raise
        raise ImportError(f"outbox.{name} is the SQLAlchemy flavour: pip install 'halfmoon[sqlalchemy]' "
                          "(Django apps use outbox.integrations.django)", name=name) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SQLALCHEMY_NAMES})


__all__ = [
    "TRANSACTION_ID_PROPERTY",
    "AsyncBrokerClient",
    "AsyncProducer",
    "AsyncTransactionListener",
    "BodyNotSerializableError",
    "BrokerError",
    "BrokerUnavailable",
    "BrokerUnavailableError",
    "ConfigurationError",
    "Message",
    "MessageTemplate",
    "NestedTransactionError",
    "OutboxError",
    "OutboxJSONEncoder",
    "Producer",
    "ReceivedMessage",
    "Resolution",
    "SavepointError",
    "SchemaMissingError",
    "TransactionFencedError",
    "TransactionListener",
    "TransactionState",
    "arun_consumer",
    "connect",
    "current_transaction_id",
    "json_message",
    "message_json",
    "run_consumer",
]
