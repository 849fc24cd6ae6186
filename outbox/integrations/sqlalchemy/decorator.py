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

On an ``async def`` (with an ``AsyncProducer`` and an ``async_sessionmaker``) the wrapper
is a coroutine function with the same steps, awaiting each; ``outbox.asend`` adds
messages. ``overlap=True`` does not wait for the half message before the transaction:
it is sent as a task, the transaction runs meanwhile, and its acknowledgment is awaited
before the commit (a broker failure then rolls the transaction back and raises
``BrokerUnavailableError``: the function ran, but nothing it wrote is committed).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy.orm import Session

from ...aio_producer import AsyncProducer
from ...context import running
from ...errors import ConfigurationError
from ...messages import OutboxJSONEncoder
from ...producer import Producer
from ...template import BoundTemplate, FromArguments, MessageTemplate
from .check_back import answer_own_check_backs
from .session import install, local_transaction, pending_transaction, record_message, send

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

R = TypeVar("R")


def transactional_message(
    producer: Producer | AsyncProducer,
    session_factory: Callable[[], Session] | Callable[[], AsyncSession],
    topic: str,
    body: Callable[..., Any] | None = None,
    keys: FromArguments[Sequence[str]] = (),
    tag: str = "",
    message_group: FromArguments[str | None] = None,
    delay_level: int = 0,
    transaction_timeout_s: float | None = None,
    properties: FromArguments[Mapping[str, str]] | None = None,
    encoder: type[json.JSONEncoder] = OutboxJSONEncoder,
    overlap: bool = False,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap ``function(session, *args, **kwargs)`` so each call is a transactional message.

    ``body``, and ``keys``, ``message_group`` and ``properties`` when they are functions,
    are called with the function's arguments (without the session); the default body is
    those arguments by name, as JSON written by ``encoder``. ``delay_level`` (RocketMQ's
    1..18) delays delivery from the commit on; ``transaction_timeout_s`` overrides when
    the broker first checks back. ``overlap`` (async only): run the transaction while
    the half message is on its way (see the module's docstring).

    ``producer`` answers its group's check-backs with the fence on ``session_factory``'s
    engine from now on (``check_back.answer_own_check_backs``).
    """
    answer_own_check_backs(producer, session_factory)
    template = MessageTemplate(topic, body, keys, tag, message_group, delay_level, transaction_timeout_s,
                               properties or {}, encoder)

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        bound = template.for_function(function, skip_first=True)
        if inspect.iscoroutinefunction(function):
            if not isinstance(producer, AsyncProducer):
                raise ConfigurationError("an async def needs an AsyncProducer")
            return _asynchronous(function, bound, producer, cast("Callable[[], AsyncSession]", session_factory),
                                 overlap)
        if not isinstance(producer, Producer):
            raise ConfigurationError("an AsyncProducer needs an async def")
        if overlap:
            raise ConfigurationError("overlap=True is for async def functions")
        sessions = cast(Callable[[], Session], session_factory)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            message = bound.message(*args, **kwargs)
            with sessions() as session:
                install(session, producer)
                with session.begin():
                    send(session, message)
                    with running(local_transaction(session)):
                        return function(session, *args, **kwargs)

        return wrapper

    return decorate


def _asynchronous(function: Callable[..., Any], bound: BoundTemplate, producer: AsyncProducer,
                  session_factory: Callable[[], AsyncSession], overlap: bool) -> Callable[..., Any]:
    """The coroutine-function wrapper of ``transactional_message``."""

    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        message = bound.message(*args, **kwargs)
        async with session_factory() as session:
            install(session, producer)
            pending = pending_transaction(session.sync_session)
            try:
                async with session.begin():
                    if overlap:
                        half = producer.start_half(message, pending.transaction_id)
                    else:
                        await producer.send_half(message, pending.transaction_id)
                    await session.run_sync(record_message, pending, message)
                    with running(pending):
                        result = await function(session, *args, **kwargs)
                    if overlap:
                        await half  # before the commit: a crash before it leaves nothing committed
            finally:
                if not producer.oneway_end:
                    await producer.ended(pending.transaction_id)
            return result

    return wrapper
