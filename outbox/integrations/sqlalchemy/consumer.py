"""``@idempotent_consumer`` for SQLAlchemy: effectively-once handling on an at-least-once
broker (the rule: ``outbox.idempotency``).

``@idempotent_consumer(group, session_factory)`` wraps ``handler(session, received)`` so
that the ``(consumer_group, message_id)`` row in ``outbox_consumed_message`` is written
in the same database transaction as the handler's own writes. A redelivered message
finds the row and is skipped (the wrapper returns False; ack it): no second effect.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker_embedded import ReceivedMessage

from ...consumer import Handler
from ...idempotency import GROUP_ATTRIBUTE, AlreadyConsumed, ConsumedRow, record_or_skip
from .fence import run, sql_for


def idempotent_consumer(
    group: str, session_factory: Callable[[], Session]
) -> Callable[[Callable[[Session, ReceivedMessage], Any]], Handler]:
    """Wrap ``handler(session, received)``; the wrapper returns False for a duplicate."""

    def decorate(handler: Callable[[Session, ReceivedMessage], Any]) -> Handler:
        @functools.wraps(handler)
        def wrapper(received: ReceivedMessage) -> bool:
            with session_factory() as session:
                def record(row: ConsumedRow) -> None:
                    connection = session.connection()
                    sql = sql_for(connection)
                    try:
                        run(connection, sql.record_consumed, row.params(sql))
                    except IntegrityError:
                        raise AlreadyConsumed from None

                return record_or_skip(group, received, session.begin, record,
                                      lambda: handler(session, received))

        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate
