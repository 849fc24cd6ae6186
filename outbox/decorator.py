"""``@transactional_message``: one call does half send -> DB transaction -> COMMIT/ROLLBACK.

    @transactional_message(producer, Session, topic="order.paid",
                           body=lambda order_id, amount: {"order_id": order_id, "amount": amount})
    def pay(session, order_id, amount):
        ...  # business writes in ``session``

    pay("o-1", 100)   # the wrapper opens the session and its transaction

The body is built before anything is sent (an unserialisable body raises
``BodyNotSerializableError`` and nothing happens). Then the half message is sent (broker
down: the function does not run), the transaction opens with the transaction_log insert
as its first statement, the function runs, and the commit is followed by COMMIT; an
exception rolls back, sends ROLLBACK and is re-raised. More messages can join the same
transaction with ``outbox.send(session, message)`` inside the function.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from sqlalchemy.orm import Session

from broker_embedded import Message

from .integrations.sqlalchemy.session import install, send
from .messages import to_json_bytes
from .producer import Producer

P = ParamSpec("P")
R = TypeVar("R")


def _default_body(function: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(function)
    parameters = list(signature.parameters)[1:]  # without the session

    def body(*args: Any, **kwargs: Any) -> Any:
        bound = dict(zip(parameters, args, strict=False))
        bound.update(kwargs)
        return bound

    return body


def transactional_message(
    producer: Producer,
    session_factory: Callable[[], Session],
    topic: str,
    body: Callable[..., Any] | None = None,
    keys: Sequence[str] | Callable[..., Sequence[str]] = (),
    tag: str = "",
    message_group: Callable[..., str] | None = None,
    delay_level: int = 0,
    transaction_timeout_s: float | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap ``function(session, *args, **kwargs)`` so each call is a transactional message.

    ``body``, ``keys`` (or a fixed list of keys) and ``message_group`` are called with the
    function's arguments (without the session); the default body is those arguments by
    name, as JSON. ``delay_level`` (RocketMQ's 1..18) delays delivery from the commit on;
    ``transaction_timeout_s`` overrides when the broker first checks back.
    """

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        make_body = body or _default_body(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            message = Message(
                topic,
                to_json_bytes(make_body(*args, **kwargs)),
                keys=tuple(keys(*args, **kwargs) if callable(keys) else keys),
                tag=tag,
                message_group=message_group(*args, **kwargs) if message_group else None,
                delay_level=delay_level,
                transaction_timeout_s=transaction_timeout_s,
            )
            with session_factory() as session:
                install(session, producer)
                with session.begin():
                    send(session, message)
                    return function(session, *args, **kwargs)

        return wrapper

    return decorate
