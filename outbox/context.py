"""The local transaction a ``@transactional_message`` call is running, per context.

Both decorators set it for the duration of the decorated function, so code inside can
ask ``current_transaction_id()`` and add messages to the same transaction. A SQLAlchemy
session also keeps its own transaction's in ``session.info`` (sessions used without the
decorator): ``current_transaction_id(session)``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from broker_embedded import Message

from .aio_producer import AsyncProducer
from .producer import Producer
from .sql import Execute, OutboxSQL
from .stored import group_waiting

#: Where a SQLAlchemy session keeps its ``LocalTransaction`` (``session.info[...]``).
SESSION_INFO_KEY = "halfmoon.outbox"


@dataclass
class LocalTransaction:
    """A local transaction that sends messages: its id, its producer, what it sent."""

    transaction_id: str
    producer: Producer | AsyncProducer
    #: The messages it sent, in order (store mode writes them all if one half failed).
    messages: list[Message] = field(default_factory=list)
    #: Store mode: a half message was not taken (or was held), so the commit stores all its messages.
    stores: bool = False

    def start(self, message: Message, statements: Callable[[], tuple[Execute, OutboxSQL]]) -> None:
        """Put ``message``'s half message on its way (awaited before the commit), or in store
        mode hold it for the database when the transaction already stores its messages or
        the message's group has stored messages waiting for the relay (it must reach the
        broker after them); ``statements()`` gives the ORM's way to ask the database."""
        producer = self.producer
        if producer.broker_down.stores and (
                self.stores or group_waiting(*statements(), producer.producer_group, message)):
            self.stores = True
            producer.hold(message, self.transaction_id)
        else:
            producer.start_half(message, self.transaction_id)

    def answered(self, taken: bool) -> None:
        """Note what awaiting the half messages sent so far said: in store mode one that was
        not ``taken`` makes the commit store all the transaction's messages."""
        if not taken:
            self.stores = True

    @property
    def message_ids(self) -> list[str]:
        """The ids of ``messages``."""
        return [message.message_id for message in self.messages]


_running: contextvars.ContextVar[LocalTransaction | None] = contextvars.ContextVar(
    "halfmoon_outbox_transaction", default=None)


@contextlib.contextmanager
def running(transaction: LocalTransaction) -> Iterator[LocalTransaction]:
    """Make ``transaction`` the running one inside the block."""
    token = _running.set(transaction)
    try:
        yield transaction
    finally:
        _running.reset(token)


def running_transaction() -> LocalTransaction | None:
    """The transaction of the ``@transactional_message`` call running now, if any."""
    return _running.get()


def current_transaction_id(session: Any = None) -> str | None:
    """The transaction id of the running ``@transactional_message`` call (either
    integration), or with ``session``, of that SQLAlchemy session's current transaction
    once it sent a message; None otherwise."""
    transaction = running_transaction() if session is None else session.info.get(SESSION_INFO_KEY)
    return transaction.transaction_id if transaction else None
