"""The async wrapper of ``@idempotent_consumer`` (``consumer``), apart so that sync apps
need no greenlet (SQLAlchemy's asyncio extension, ``halfmoon[asyncio]``).

The consumed_message row goes through the ``AsyncSession`` (``run_sync`` runs the sync
insert of ``recorder.record_consumed`` on its connection, aiosqlite or asyncpg) as the
first statement of the transaction the handler's writes join: ``outbox.idempotency``'s
rule, shared with the sync wrapper.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from broker_embedded import ReceivedMessage

from ...aio_consumer import AsyncHandler
from ...errors import ConfigurationError
from ...idempotency import ConsumedRow, arecord_or_skip
from .recorder import record_consumed


def async_wrapper(group: str, session_factory: Callable[[], AsyncSession],
                  handler: Callable[[AsyncSession, ReceivedMessage], Awaitable[Any]]) -> AsyncHandler:
    """``handler(session, received)`` as an async ``AsyncHandler`` that records the row
    first, in the handler's transaction; it returns False for a duplicate."""

    @functools.wraps(handler)
    async def wrapper(received: ReceivedMessage) -> bool:
        session = session_factory()
        if not isinstance(session, AsyncSession):
            raise ConfigurationError(f"idempotent_consumer({group!r}) with an async def handler needs "
                                     f"AsyncSessions, its factory made {session!r}")
        async with session:
            async def record(row: ConsumedRow) -> None:
                await session.run_sync(record_consumed, row)

            return await arecord_or_skip(group, received, session.begin, record,
                                         lambda: handler(session, received))

    return wrapper
