"""``@transactional_message`` for Django, and ``send`` (``asend``) for more messages in one transaction.

    @transactional_message(topic="order.paid", body=lambda order: {"id": order.pk})
    def pay(order): ...

One call: the message is built from the arguments (an ``outbox.template.MessageTemplate``,
checked before anything is sent), the half message is sent, then
``transaction.atomic(using)`` whose first statement inserts the transaction_log row
(COMMITTED), then the function, then COMMIT through ``transaction.on_commit`` (so inside
an outer ``atomic`` it waits for the outermost commit). An exception rolls back, sends
ROLLBACK and is re-raised. With ``overlap`` (the default) the half message's
acknowledgment is awaited at the end of the ``atomic`` block rather than before it (a
broker failure then rolls back and raises ``BrokerUnavailableError``: the function ran,
nothing it wrote is committed), and so are those of ``send``; the END after the commit
waits for the broker only with ``OUTBOX["ONEWAY_END"] = False`` (``Producer``'s
``oneway_end``). Django has no hook for an outer rollback: such a transaction
is resolved by check-back, where the fence finds no row and answers ROLLBACK.

In store mode (``OUTBOX["ON_BROKER_DOWN"] = "store"``, ``outbox.stored``) a half message
the broker did not take does not fail the call: at the end of the ``atomic`` block all the
call's messages are written to ``outbox_stored_message`` and the transaction commits; no
END follows, the relay (``manage.py outbox_relay``) hands them over. A message whose
message group has stored messages waiting is held for the database the same way, so the
group keeps its commit order.

On an ``async def`` function (an async view or service) the wrapper is async too. Django's
ORM and transactions are sync, so the transactional part (building and sending the half
message, ``atomic``, the transaction_log insert, COMMIT or ROLLBACK) runs in a thread
through ``sync_to_async(thread_sensitive=True)``; the function itself runs on the event
loop (``async_to_sync`` from that thread), and its ORM calls (``await ...acreate()``,
``sync_to_async``) go back to that same thread, so they are inside the transaction. Use
``await asend(message)`` there for more messages. Cancelling the call cancels the
function and rolls the transaction back (ROLLBACK).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, Unpack, cast

from asgiref.sync import async_to_sync, sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

from broker_embedded import Message, Resolution

from ... import instrumentation
from ...context import LocalTransaction, running, running_transaction
from ...context import current_transaction_id as current_transaction_id  # of the running call
from ...errors import OutboxError
from ...producer import Producer, new_transaction_id
from ...stored import store_messages
from ...template import MessageOptions, MessageTemplate
from .conf import producer as default_producer
from .recorder import RECORDER

R = TypeVar("R")


@dataclass
class _Call(LocalTransaction):
    """A running ``@transactional_message`` call and the alias its transaction is on."""

    using: str = "default"

    @property
    def sender(self) -> Producer:
        """Its producer (the decorator's: a sync ``Producer``)."""
        return cast(Producer, self.producer)

    def add(self, message: Message) -> None:
        """Send ``message``'s half, or hold it for the database (``LocalTransaction.start``),
        and count it among the call's messages."""
        self.start(message, lambda: RECORDER.statements(self.using))
        self.messages.append(message)

    def acknowledged(self) -> None:
        """Wait for the half messages sent so far (store mode: one not taken makes the
        commit store them all)."""
        self.answered(self.sender.await_halves(self.transaction_id))

    def await_or_store(self) -> None:
        """Just before the commit, in the transaction: wait for the half messages; in store
        mode, if one was not taken (or was held), write all the call's messages into
        ``outbox_stored_message`` (no END follows the commit)."""
        self.acknowledged()
        if self.stores:
            execute, sql = RECORDER.statements(self.using)
            store_messages(execute, sql, self.transaction_id, self.sender.producer_group, self.messages)


def send(message: Message) -> str:
    """Add ``message`` to the running ``@transactional_message`` call's transaction."""
    current = running_transaction()
    if not isinstance(current, _Call):
        raise OutboxError("outbox.integrations.django.send() is for use inside @transactional_message")
    current.add(message)
    return current.transaction_id


async def asend(message: Message) -> str:
    """``send`` for an ``async def`` ``@transactional_message`` function: the half message
    goes out from the thread that runs its transaction (``sync_to_async``,
    ``thread_sensitive=True``), so the event loop never blocks on the broker."""
    return await sync_to_async(send, thread_sensitive=True)(message)


def transactional_message(
    topic: str,
    *,
    using: str = "default",
    producer: Producer | None = None,
    overlap: bool = True,
    **options: Unpack[MessageOptions],
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make each call of the function a local transaction on ``using`` with a
    transactional message.

    ``options`` are the SQLAlchemy decorator's (``outbox.template.MessageOptions``):
    ``body``, and ``keys``, ``message_group`` and ``properties`` when they are functions,
    are called with the function's arguments; the default body is those arguments by
    name, as JSON written by ``encoder`` (here ``DjangoJSONEncoder`` by default).
    ``delay_level`` (RocketMQ's 1..18) delays delivery from the commit on;
    ``transaction_timeout_s`` overrides when the broker first checks back. ``producer``
    defaults to the app's (``OUTBOX`` settings). ``overlap`` (default True): run the
    transaction while the half message is on its way, its acknowledgment awaited before
    the commit; False waits for it before the transaction opens.
    """
    template = MessageTemplate.from_options(topic, options, DjangoJSONEncoder)

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        bound = template.for_function(function)

        def transactional_call(args: tuple[Any, ...], kwargs: dict[str, Any], body: Callable[[], Any]) -> Any:
            message = bound.message(*args, **kwargs)
            sender = producer or default_producer()
            local = _Call(new_transaction_id(), sender, using=using)
            local.add(message)
            operation = instrumentation.operation(instrumentation.LOCAL_TRANSACTION,
                                                  producer_group=sender.producer_group,
                                                  transaction_id=local.transaction_id)
            try:
                if not overlap:
                    local.acknowledged()
                with running(local), transaction.atomic(using=using):
                    RECORDER.record_committed(using, local.transaction_id, sender.producer_group)
                    result = body()
                    local.await_or_store()  # inside atomic: a failure rolls back
                    transaction.on_commit(lambda: sender.finish(local.transaction_id, Resolution.COMMIT), using=using)
            except BaseException as exc:
                operation.end(exc, Resolution.ROLLBACK.value)
                sender.finish(local.transaction_id, Resolution.ROLLBACK)
                raise
            operation.end(outcome=Resolution.COMMIT.value)
            return result

        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                # The transactional part in a thread (Django's ORM is sync); the body back on
                # the event loop, its ORM calls routed to that thread, inside the transaction.
                body = functools.partial(async_to_sync(function), *args, **kwargs)
                return await sync_to_async(transactional_call, thread_sensitive=True)(args, kwargs, body)

            return cast(Callable[..., R], async_wrapper)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            return cast(R, transactional_call(args, kwargs, lambda: function(*args, **kwargs)))

        return wrapper

    return decorate
