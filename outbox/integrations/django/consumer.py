"""The idempotent consumer for Django: the consumed_message row and the handler's writes
commit together, so a redelivered message has no second effect (the rule:
``outbox.idempotency``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, connections, transaction

from broker_embedded import ReceivedMessage

from ...idempotency import GROUP_ATTRIBUTE, AlreadyConsumed, ConsumedRow, record_or_skip
from .fence import alias_sql, run


def idempotent_consumer(group: str, using: str = "default") -> Callable[[Callable[[ReceivedMessage], Any]], Callable[[ReceivedMessage], bool]]:
    """Wrap ``handler(received)``; the wrapper returns False for a duplicate (skipped)."""

    def record(row: ConsumedRow) -> None:
        connection = connections[using]
        sql = alias_sql(connection)
        try:
            run(connection, sql.record_consumed, row.params())
        except IntegrityError:
            raise AlreadyConsumed from None

    def decorate(handler: Callable[[ReceivedMessage], Any]) -> Callable[[ReceivedMessage], bool]:
        @functools.wraps(handler)
        def wrapper(received: ReceivedMessage) -> bool:
            return record_or_skip(group, received, lambda: transaction.atomic(using=using), record,
                                  lambda: handler(received))

        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate
