"""``@transactional_message`` for Django, and ``send`` for more messages in one transaction.

    @transactional_message(topic="order.paid", body=lambda order: {"id": order.pk})
    def pay(order): ...

One call: the half message, then ``transaction.atomic(using)`` whose first statement
inserts the TransactionLog row (COMMITTED), then the function, then COMMIT through
``transaction.on_commit`` (so inside an outer ``atomic`` it waits for the outermost
commit). An exception rolls back, sends ROLLBACK and is re-raised. Django has no hook for
an outer rollback: such a transaction is resolved by check-back, where the fence finds
no row and answers ROLLBACK.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.utils import timezone

from broker_embedded import Message, Resolution

from ...errors import OutboxError, TransactionFencedError
from ...messages import to_json_bytes
from ...producer import Producer, new_transaction_id
from .conf import producer as default_producer
from .models import TransactionLog

R = TypeVar("R")


@dataclass(frozen=True)
class _Current:
    transaction_id: str
    producer: Producer


_current: contextvars.ContextVar[_Current | None] = contextvars.ContextVar("halfmoon_outbox", default=None)


def current_transaction_id() -> str | None:
    """The transaction id of the decorated call running now, if any."""
    current = _current.get()
    return current.transaction_id if current else None


def send(message: Message) -> str:
    """Add ``message`` to the running ``@transactional_message`` call's transaction."""
    current = _current.get()
    if current is None:
        raise OutboxError("outbox.integrations.django.send() is for use inside @transactional_message")
    current.producer.send_half(message, current.transaction_id)
    return current.transaction_id


def _arguments_by_name(function: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    names = list(inspect.signature(function).parameters)

    def body(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**dict(zip(names, args, strict=False)), **kwargs}

    return body


def transactional_message(
    topic: str,
    body: Callable[..., Any] | None = None,
    keys: Callable[..., Sequence[str]] | None = None,
    tag: str = "",
    using: str = "default",
    producer: Producer | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make each call of the function a local transaction with a transactional message."""

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        make_body = body or _arguments_by_name(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            message = Message(topic, to_json_bytes(make_body(*args, **kwargs)),
                              keys=tuple(keys(*args, **kwargs)) if keys else (), tag=tag)
            sender = producer or default_producer()
            transaction_id = new_transaction_id()
            sender.send_half(message, transaction_id)
            token = _current.set(_Current(transaction_id, sender))
            try:
                with transaction.atomic(using=using):
                    try:
                        TransactionLog.objects.using(using).create(
                            transaction_id=transaction_id, producer_group=sender.producer_group,
                            state=TransactionLog.COMMITTED, created_at=timezone.now(),
                        )
                    except IntegrityError as exc:
                        raise TransactionFencedError(
                            f"transaction {transaction_id} was fenced by a check-back"
                        ) from exc
                    result = function(*args, **kwargs)
                    transaction.on_commit(
                        lambda: sender.end_transaction(transaction_id, Resolution.COMMIT), using=using
                    )
            except BaseException:
                sender.end_transaction(transaction_id, Resolution.ROLLBACK)
                raise
            finally:
                _current.reset(token)
            return result

        return wrapper

    return decorate
