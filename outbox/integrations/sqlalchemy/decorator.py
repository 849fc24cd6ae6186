"""``@transactional_message`` for SQLAlchemy: one call does half send -> DB transaction ->
COMMIT/ROLLBACK.

    @transactional_message(producer, Session, topic="order.paid",
                           body=lambda order_id, amount: {"order_id": order_id, "amount": amount})
    def pay(session, order_id, amount):
        ...  # business writes in ``session``

    pay("o-1", 100)   # the wrapper opens the session and its transaction

The message is described by an ``outbox.template.MessageTemplate`` and built before
anything is sent: a body the encoder cannot write raises ``BodyNotSerializableError``,
options the broker would refuse (``transaction_timeout_s=math.inf``, a delay level of
19, ...) raise ``InvalidMessageError`` at decoration, and a message built from unusable
arguments raises it before the transaction opens. Then the half message is sent (broker
down: the function does not run), the transaction opens with the transaction_log insert
as its first statement, the function runs, and the commit is followed by COMMIT; an
exception rolls back, sends ROLLBACK and is re-raised. More messages can join the same
transaction with ``outbox.send(session, message)`` inside the function, and
``outbox.current_transaction_id()`` tells its id.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from ...context import running
from ...messages import OutboxJSONEncoder
from ...producer import Producer
from ...template import FromArguments, MessageTemplate
from .session import install, local_transaction, send

R = TypeVar("R")


def transactional_message(
    producer: Producer,
    session_factory: Callable[[], Session],
    topic: str,
    body: Callable[..., Any] | None = None,
    keys: FromArguments[Sequence[str]] = (),
    tag: str = "",
    message_group: FromArguments[str | None] = None,
    delay_level: int = 0,
    transaction_timeout_s: float | None = None,
    properties: FromArguments[Mapping[str, str]] | None = None,
    encoder: type[json.JSONEncoder] = OutboxJSONEncoder,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap ``function(session, *args, **kwargs)`` so each call is a transactional message.

    ``body``, and ``keys``, ``message_group`` and ``properties`` when they are functions,
    are called with the function's arguments (without the session); the default body is
    those arguments by name, as JSON written by ``encoder``. ``delay_level`` (RocketMQ's
    1..18) delays delivery from the commit on; ``transaction_timeout_s`` overrides when
    the broker first checks back.
    """
    template = MessageTemplate(topic, body, keys, tag, message_group, delay_level, transaction_timeout_s,
                               properties or {}, encoder)

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        bound = template.for_function(function, skip_first=True)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            message = bound.message(*args, **kwargs)
            with session_factory() as session:
                install(session, producer)
                with session.begin():
                    send(session, message)
                    with running(local_transaction(session)):
                        return function(session, *args, **kwargs)

        return wrapper

    return decorate
