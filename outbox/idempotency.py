"""The idempotent consumer's rule, ORM-free: record, or skip a duplicate.

A handler's effects and the ``(consumer_group, message_id)`` row of
``outbox_consumed_message`` commit in one database transaction. The row goes first: a
redelivered message finds it (a unique-key violation), its transaction rolls back, and
the handler does not run again; the wrapper answers False (skipped, ack it). Each
integration supplies the transaction and the insert (``record_or_skip``, or
``arecord_or_skip`` for asyncio handlers); the statement is ``OutboxSQL.record_consumed``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any

from broker_embedded import ReceivedMessage

from . import instrumentation

log = logging.getLogger(__name__)

#: Set on handlers made by an ``idempotent_consumer``: the consumer group they record.
GROUP_ATTRIBUTE = "outbox_consumer_group"


class AlreadyConsumed(Exception):
    """Raised by the insert when the group already handled the message (a duplicate)."""


@dataclass(frozen=True)
class ConsumedRow:
    """The ``outbox_consumed_message`` row of one handled message."""

    consumer_group: str
    message_id: str
    topic: str
    transaction_id: str | None

    @classmethod
    def of(cls, group: str, received: ReceivedMessage) -> ConsumedRow:
        return cls(group, received.message.message_id, received.message.topic, received.transaction_id)

    def params(self) -> tuple[object, ...]:
        """The parameters of ``sql.record_consumed``, in their order (``consumed_at`` is the
        database's clock)."""
        return self.consumer_group, self.message_id, self.topic, self.transaction_id


def handling(group: str, received: ReceivedMessage) -> instrumentation.Operation:
    """The ``HANDLER`` operation: the handler's run inside the recording transaction."""
    return instrumentation.operation(instrumentation.HANDLER, consumer_group=group, received=received)


def skipped(group: str, received: ReceivedMessage) -> bool:
    """A duplicate was found (its transaction rolled back): say so; False, the wrapper's answer."""
    log.info("message %s already consumed by %s; skipped", received.message.message_id, group)
    instrumentation.announce(instrumentation.DUPLICATE_SKIPPED, consumer_group=group, received=received)
    return False


def record_or_skip(
    group: str,
    received: ReceivedMessage,
    transaction: Callable[[], AbstractContextManager[Any]],
    record: Callable[[ConsumedRow], None],
    handle: Callable[[], Any],
) -> bool:
    """In one ``transaction()``: ``record`` the row (it raises ``AlreadyConsumed`` for a
    duplicate), then ``handle``. True if handled, False if skipped as a duplicate."""
    try:
        with transaction():
            record(ConsumedRow.of(group, received))
            with handling(group, received):
                handle()
    except AlreadyConsumed:
        return skipped(group, received)
    return True


async def arecord_or_skip(
    group: str,
    received: ReceivedMessage,
    transaction: Callable[[], AbstractAsyncContextManager[Any]],
    record: Callable[[ConsumedRow], Awaitable[None]],
    handle: Callable[[], Awaitable[Any]],
) -> bool:
    """``record_or_skip`` for asyncio: the same rule with an async transaction, insert and
    handler."""
    try:
        async with transaction():
            await record(ConsumedRow.of(group, received))
            with handling(group, received):
                await handle()
    except AlreadyConsumed:
        return skipped(group, received)
    return True
