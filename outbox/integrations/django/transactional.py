"""``@transactional_message`` for Django, and ``send`` for more messages in one transaction.

    @transactional_message(topic="order.paid", body=lambda order: {"id": order.pk})
    def pay(order): ...

One call: the message is built from the arguments (an ``outbox.template.MessageTemplate``,
checked before anything is sent), the half message is sent, then
``transaction.atomic(using)`` whose first statement inserts the transaction_log row
(COMMITTED), then the function, then COMMIT through ``transaction.on_commit`` (so inside
an outer ``atomic`` it waits for the outermost commit). An exception rolls back, sends
ROLLBACK and is re-raised. Django has no hook for an outer rollback: such a transaction
is resolved by check-back, where the fence finds no row and answers ROLLBACK.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, transaction

from broker_embedded import Message, Resolution

from ... import instrumentation
from ...context import LocalTransaction, running, running_transaction
from ...context import current_transaction_id as current_transaction_id  # of the running call
from ...errors import OutboxError
from ...fence import fenced_error, row_params
from ...producer import Producer, new_transaction_id
from ...schema import COMMITTED
from ...template import FromArguments, MessageTemplate
from .conf import producer as default_producer
from .fence import alias_sql, run

R = TypeVar("R")


def send(message: Message) -> str:
    """Add ``message`` to the running ``@transactional_message`` call's transaction."""
    current = running_transaction()
    if current is None:
        raise OutboxError("outbox.integrations.django.send() is for use inside @transactional_message")
    current.producer.send_half(message, current.transaction_id)
    current.message_ids.append(message.message_id)
    return current.transaction_id


def record_committed(using: str, transaction_id: str, producer_group: str) -> None:
    """The producer's insert, first statement of its transaction on ``using``;
    ``TransactionFencedError`` if a checker's fence got there first."""
    connection = connections[using]
    sql = alias_sql(connection)
    try:
        run(connection, sql.record_transaction, row_params(sql, transaction_id, producer_group, COMMITTED))
    except IntegrityError as exc:
        raise fenced_error(transaction_id, producer_group) from exc


def transactional_message(
    topic: str,
    body: Callable[..., Any] | None = None,
    keys: FromArguments[Sequence[str]] = (),
    tag: str = "",
    message_group: FromArguments[str | None] = None,
    delay_level: int = 0,
    transaction_timeout_s: float | None = None,
    properties: FromArguments[Mapping[str, str]] | None = None,
    encoder: type[json.JSONEncoder] = DjangoJSONEncoder,
    using: str = "default",
    producer: Producer | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make each call of the function a local transaction on ``using`` with a
    transactional message.

    ``body``, and ``keys``, ``message_group`` and ``properties`` when they are functions,
    are called with the function's arguments; the default body is those arguments by
    name, as JSON written by ``encoder``. ``delay_level`` (RocketMQ's 1..18) delays
    delivery from the commit on; ``transaction_timeout_s`` overrides when the broker
    first checks back. ``producer`` defaults to the app's (``OUTBOX`` settings).
    """
    template = MessageTemplate(topic, body, keys, tag, message_group, delay_level, transaction_timeout_s,
                               properties or {}, encoder)

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        bound = template.for_function(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            message = bound.message(*args, **kwargs)
            sender = producer or default_producer()
            local = LocalTransaction(new_transaction_id(), sender, [message.message_id])
            sender.send_half(message, local.transaction_id)
            operation = instrumentation.operation(instrumentation.LOCAL_TRANSACTION,
                                                  producer_group=sender.producer_group,
                                                  transaction_id=local.transaction_id)
            try:
                with running(local), transaction.atomic(using=using):
                    record_committed(using, local.transaction_id, sender.producer_group)
                    result = function(*args, **kwargs)
                    transaction.on_commit(
                        lambda: sender.end_transaction(local.transaction_id, Resolution.COMMIT), using=using
                    )
            except BaseException as exc:
                operation.end(exc, Resolution.ROLLBACK.value)
                sender.end_transaction(local.transaction_id, Resolution.ROLLBACK)
                raise
            operation.end(outcome=Resolution.COMMIT.value)
            return result

        return wrapper

    return decorate
