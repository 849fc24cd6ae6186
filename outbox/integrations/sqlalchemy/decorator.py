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
not reachable: the function does not run), the transaction opens with the
transaction_log insert as its first statement, the function runs, and the commit is
followed by COMMIT; an exception rolls back, sends ROLLBACK and is re-raised. More
messages can join the same transaction with ``outbox.send(session, message)`` inside the
function, and ``outbox.current_transaction_id()`` tells its id.

``overlap=True`` (the default) does not wait for the half message's acknowledgment
before the transaction: the half leaves before BEGIN, the transaction runs meanwhile, and
the acknowledgment is awaited just before the commit (a broker failure then rolls the
transaction back and raises ``BrokerUnavailableError``: the function ran, but nothing it
wrote is committed). ``overlap=False`` waits for it before the function runs. The
producer's ``oneway_end`` decides whether the call also waits for the END after the
commit (``outbox.producer.Producer``). With a producer made with
``on_broker_down="store"`` a broker that cannot take the half fails nothing: the function
runs and the commit stores the transaction's messages for the relay (the session hook,
``outbox.stored``).

On an ``async def`` (with an ``AsyncProducer`` and an ``async_sessionmaker``) the wrapper
is a coroutine function with the same steps, awaiting each (the half message as a task
with ``overlap``); ``outbox.asend`` adds messages.

Given the caller's session (``pay(session, "o-1", 100)``, or by the name of the function's
session parameter, ``pay("o-1", 100, session=session)``), a call uses it: a session in a
transaction is joined (the half message, then the transaction_log row if this is the
transaction's first message, then the function; no commit: the session hook ends it with
the caller's COMMIT or ROLLBACK, and every message of the transaction shares its id), a
session without one gets the call's own transaction. A joined call that raises marks
the transaction so its commit raises ``NestedTransactionError`` (its message is out and
cannot be withdrawn alone). Refused at once with ``NestedTransactionError``, nothing
sent: a call not given the session while this thread (asyncio task) has a transaction on
the same database in another session, which a second session would wait for (SQLite)
or commit apart from (PostgreSQL); a session of another database than the factory's, or
of another producer.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, cast

from sqlalchemy.orm import Session

from ...aio_producer import AsyncProducer
from ...context import SESSION_INFO_KEY, running
from ...errors import ConfigurationError, NestedTransactionError
from ...producer import Producer
from ...template import BoundTemplate, MessageOptions, MessageTemplate
from .check_back import answer_own_check_backs
from .session import (
    Database,
    PendingTransaction,
    acknowledged,
    awaited,
    database,
    install,
    installed_producer,
    listen,
    local_transaction,
    pending_transaction,
    poisons,
    record_message,
    send,
    start_half,
    transaction_elsewhere,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

R = TypeVar("R")


def transactional_message(
    producer: Producer | AsyncProducer,
    session_factory: Callable[[], Session] | Callable[[], AsyncSession],
    topic: str,
    *,
    overlap: bool = True,
    **options: Unpack[MessageOptions],
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap ``function(session, *args, **kwargs)`` so each call is a transactional message.

    ``options`` (``outbox.template.MessageOptions``, the Django decorator's too): ``body``,
    and ``keys``, ``message_group`` and ``properties`` when they are functions, are called
    with the function's arguments (without the session); the default body is those
    arguments by name, as JSON written by ``encoder`` (``OutboxJSONEncoder`` by default).
    ``delay_level`` (RocketMQ's 1..18) delays delivery from the commit on;
    ``transaction_timeout_s`` overrides when the broker first checks back. ``overlap``
    (default True): run the transaction while the half message is on its way, its
    acknowledgment awaited before the commit (see the module's docstring). A call given a session (first argument, or by the name of the
    function's session parameter) uses it, and joins its transaction if it has one (see
    the module's docstring).

    ``producer`` answers its group's check-backs with the fence on ``session_factory``'s
    engine from now on (``check_back.answer_own_check_backs``).
    """
    answer_own_check_backs(producer, session_factory)
    template = MessageTemplate.from_options(topic, options)
    listen()  # note the sessions in a transaction from now on, so a second one is refused
    bind = getattr(session_factory, "kw", {}).get("bind")
    expected = database(bind.url) if bind is not None else None

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        bound = template.for_function(function, skip_first=True)
        calls = _Calls(function, producer, expected)
        if inspect.iscoroutinefunction(function):
            if not isinstance(producer, AsyncProducer):
                raise ConfigurationError("an async def needs an AsyncProducer")
            return _asynchronous(function, bound, calls, producer,
                                 cast("Callable[[], AsyncSession]", session_factory), overlap)
        if not isinstance(producer, Producer):
            raise ConfigurationError("an AsyncProducer needs an async def")
        sessions = cast(Callable[[], Session], session_factory)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            given, args, kwargs = calls.session_argument(args, kwargs, asynchronous=False)
            message = bound.message(*args, **kwargs)
            if given is not None and given.in_transaction():
                pending = calls.join(given)
                start_half(given, pending, message)
                with poisons(pending, calls.name):
                    record_message(given, pending, message)
                    if not overlap:  # with it, the session hook awaits the half before the commit
                        acknowledged(pending)
                    with running(pending):
                        return function(given, *args, **kwargs)
            with nullcontext(given) if given is not None else sessions() as session:
                calls.own(session)
                with session.begin():
                    send(session, message)
                    pending = local_transaction(session)
                    if not overlap:
                        acknowledged(pending)
                    with running(pending):
                        return function(session, *args, **kwargs)

        return wrapper

    return decorate


class _Calls:
    """What a decorated function's calls check about the session they use: whether it
    was given, and whether its transaction can be joined or a new one opened."""

    def __init__(self, function: Callable[..., Any], producer: Producer | AsyncProducer,
                 expected: Database | None) -> None:
        self.name = f"{function.__name__}()"
        first = next(iter(inspect.signature(function).parameters.values()), None)
        keyword = first is not None and first.kind in (first.POSITIONAL_OR_KEYWORD, first.KEYWORD_ONLY)
        #: The keyword a caller passes its session with (the function's first parameter).
        self.keyword = first.name if first is not None and keyword else None
        self.producer = producer
        self.expected = expected

    def session_argument(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                         asynchronous: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The caller's session (the first positional argument if it is a session, or the
        session parameter's keyword; None passed there means none) and the other arguments."""
        kind = "an AsyncSession" if asynchronous else "a Session"
        if args and _sync_session(args[0]) is not None:
            given, args = args[0], args[1:]
        elif self.keyword is not None and self.keyword in kwargs:
            kwargs = dict(kwargs)
            given = kwargs.pop(self.keyword)
            if given is not None and _sync_session(given) is None:
                raise TypeError(f"{self.name}: {self.keyword}= takes {kind}, not {type(given).__name__}")
        else:
            return None, args, kwargs
        if given is not None and (given is _sync_session(given)) == asynchronous:
            raise TypeError(f"{self.name} takes {kind}, not {type(given).__name__}")
        return given, args, kwargs

    def join(self, session: Session | AsyncSession) -> PendingTransaction:
        """The transaction of ``session`` (which has one) that this call joins;
        ``NestedTransactionError`` if it cannot."""
        sync = _checked(self, session)
        transaction = sync.get_transaction()
        if transaction is not None and not transaction.is_active:
            raise self.refuse("was given a session whose transaction can only roll back (an earlier "
                              "statement or flush failed): roll it back first")
        return pending_transaction(sync)

    def own(self, session: Session | AsyncSession) -> None:
        """Before opening a transaction on ``session``: refuse if this thread (task) is in
        another transaction on the same database, which the call cannot see."""
        sync = _checked(self, session)
        if sync.bind is not None:
            other = transaction_elsewhere(sync, database(sync.bind.engine.url))
            if other is not None:
                raise self.refuse(
                    f"was called while a session of the same database is in a transaction in this "
                    f"{'task' if _in_task() else 'thread'}; a second session would wait for its lock (SQLite) or "
                    f"commit apart from it (PostgreSQL). Give the call that session to join its transaction: "
                    f"{self.name[:-1]}{f'{self.keyword}=' if self.keyword else ''}session, ...), or call it after that "
                    "transaction ends")

    def refuse(self, why: str) -> NestedTransactionError:
        """The error of a call that cannot use the session (nothing was sent)."""
        return NestedTransactionError(f"{self.name} {why}")


def _checked(calls: _Calls, session: Session | AsyncSession) -> Session:
    """``session``'s sync ``Session`` once it is on the database the calls record their
    messages in, with no other producer installed; installs theirs."""
    sync = cast(Session, _sync_session(session))
    if calls.expected is not None and sync.bind is not None and database(sync.bind.engine.url) != calls.expected:
        raise calls.refuse(f"was given a session on {sync.bind.engine.url.database!r}, but it records its "
                           "transactions in its session factory's database, where the check-back looks: "
                           "give it a session of that database")
    pending: PendingTransaction | None = sync.info.get(SESSION_INFO_KEY)
    for other in (installed_producer(sync), pending.producer if pending is not None else None):
        if other is not None and other is not calls.producer:
            raise calls.refuse(f"was given a session that sends with another producer (group "
                               f"{other.producer_group!r}), and one transaction has one producer: decorate "
                               "with that producer, or give it another session")
    install(session, calls.producer)
    return sync


def _sync_session(value: Any) -> Session | None:
    """The ``Session`` of a ``Session`` or an ``AsyncSession``; None for anything else."""
    sync = value if isinstance(value, Session) else getattr(value, "sync_session", None)
    return sync if isinstance(sync, Session) else None


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:
        return False


def _asynchronous(function: Callable[..., Any], bound: BoundTemplate, calls: _Calls, producer: AsyncProducer,
                  session_factory: Callable[[], AsyncSession], overlap: bool) -> Callable[..., Any]:
    """The coroutine-function wrapper of ``transactional_message``."""

    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        given, args, kwargs = calls.session_argument(args, kwargs, asynchronous=True)
        message = bound.message(*args, **kwargs)
        if given is not None and given.in_transaction():
            pending = calls.join(given)
            await given.run_sync(start_half, pending, message)
            await awaited(pending)
            with poisons(pending, calls.name):
                await given.run_sync(record_message, pending, message)
                with running(pending):
                    return await function(given, *args, **kwargs)
        async with nullcontext(given) if given is not None else session_factory() as session:
            calls.own(session)
            pending = pending_transaction(session.sync_session)
            try:
                async with session.begin():
                    await session.run_sync(start_half, pending, message)
                    if not overlap:
                        await awaited(pending)
                    await session.run_sync(record_message, pending, message)
                    with running(pending):
                        result = await function(session, *args, **kwargs)
                    if overlap:  # before the commit: a crash before it leaves nothing committed
                        await awaited(pending)
            finally:
                if not producer.oneway_end:
                    await producer.ended(pending.transaction_id)
            return result

    return wrapper
