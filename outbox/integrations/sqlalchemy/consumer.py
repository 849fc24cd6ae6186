"""``@idempotent_consumer`` for SQLAlchemy: effectively-once handling on an at-least-once
broker (the rule: ``outbox.idempotency``).

``@idempotent_consumer(group, session_factory)`` wraps ``handler(session, received)`` so
that the ``(consumer_group, message_id)`` row in ``outbox_consumed_message`` is written
in the same database transaction as the handler's own writes. A redelivered message
finds the row and is skipped (the wrapper returns False; ack it): no second effect.

An ``async def handler(session, received)`` with an ``async_sessionmaker`` gets an async
wrapper (for ``outbox.arun_consumer``; see ``aio_consumer``) under the same rule.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy.orm import Session

from broker_embedded import ReceivedMessage

from ...consumer import Handler
from ...errors import ConfigurationError
from ...idempotency import GROUP_ATTRIBUTE, record_or_skip
from .recorder import record_consumed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from ...aio_consumer import AsyncHandler


@overload
def idempotent_consumer(
    group: str, session_factory: Callable[[], AsyncSession]
) -> Callable[[Callable[[AsyncSession, ReceivedMessage], Awaitable[Any]]], AsyncHandler]: ...


@overload
def idempotent_consumer(
    group: str, session_factory: Callable[[], Session]
) -> Callable[[Callable[[Session, ReceivedMessage], Any]], Handler]: ...


def idempotent_consumer(group: str, session_factory: Callable[[], Any]) -> Callable[[Any], Any]:
    """Wrap ``handler(session, received)``; the wrapper returns False for a duplicate. An
    ``async def`` handler takes an ``async_sessionmaker`` and gets an async wrapper;
    ``ConfigurationError`` for a sync handler with an async factory or the reverse."""

    def decorate(handler: Callable[..., Any]) -> Callable[[ReceivedMessage], Any]:
        asynchronous = inspect.iscoroutinefunction(handler)
        made = getattr(session_factory, "class_", None)  # what a (async_)sessionmaker makes
        if isinstance(made, type) and issubclass(made, Session) == asynchronous:
            raise ConfigurationError(
                f"idempotent_consumer({group!r}): an async def handler takes an async_sessionmaker, "
                f"a sync handler a sessionmaker; got {handler!r} with {session_factory!r}")
        wrapper: Callable[[ReceivedMessage], Any]
        if asynchronous:
            from .aio_consumer import async_wrapper

            wrapper = async_wrapper(group, session_factory, handler)
        else:
            wrapper = _sync_wrapper(group, session_factory, handler)
        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate


def _sync_wrapper(group: str, session_factory: Callable[[], Session],
                  handler: Callable[[Session, ReceivedMessage], Any]) -> Handler:
    @functools.wraps(handler)
    def wrapper(received: ReceivedMessage) -> bool:
        with session_factory() as session:
            return record_or_skip(group, received, session.begin, lambda row: record_consumed(session, row),
                                  lambda: handler(session, received))

    return wrapper
