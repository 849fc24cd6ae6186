"""The points ledger the async consumer tests award, and, run as a module, a consumer
process that SIGKILLs itself right before one of its acks:

    python -m tests.outbox.async_points BROKER_URL DATABASE_URL DIE_BEFORE_ACK_NUMBER
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from broker_embedded import AsyncBrokerClient, ReceivedMessage
from broker_embedded.errors import BrokerError
from outbox import arun_consumer, idempotent_consumer, message_json
from outbox.aio_consumer import AsyncHandler

TOPIC = "order.paid"
GROUP = "points"

ledger = MetaData()
points = Table("async_points", ledger, Column("order_id", String(32)), Column("points", Integer))


def awarding(sessions: async_sessionmaker[AsyncSession], calls: list[str] | None = None,
             fail_first: frozenset[str] = frozenset()) -> AsyncHandler:
    """The idempotent handler that awards an order's points; it raises after its write on
    the first delivery of the orders in ``fail_first``."""

    @idempotent_consumer(GROUP, sessions)
    async def award(session: AsyncSession, received: ReceivedMessage) -> None:
        body = message_json(received.message)
        if calls is not None:
            calls.append(body["order"])
        await session.execute(points.insert().values(order_id=body["order"], points=body["amount"]))
        if body["order"] in fail_first and received.delivery_attempt == 1:
            raise RuntimeError("first try fails")

    return award


async def awarded(sessions: async_sessionmaker[AsyncSession]) -> list[tuple[str, int]]:
    """Every (order, points) row, sorted."""
    async with sessions() as session:
        return sorted(tuple(row) for row in (await session.execute(select(points.c.order_id, points.c.points))).all())


class DyingClient(AsyncBrokerClient):
    """A real client whose process is SIGKILLed right before its ``die_at``-th ack (before
    the ``ack_many`` that would carry it): the handler's transaction has committed, the
    broker never hears of it."""

    def __init__(self, url: str, die_at: int) -> None:
        super().__init__(url)
        self.die_at = die_at
        self.acks = 0

    async def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        self.acks += len(receipt_handles)
        if self.acks >= self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().ack_many(group, receipt_handles)


async def main(broker_url: str, database_url: str, die_at: int) -> None:
    engine = create_async_engine(database_url)
    client = DyingClient(broker_url, die_at)
    await arun_consumer(client, GROUP, TOPIC, awarding(async_sessionmaker(engine)),
                        batch_size=4, invisible_duration_s=1, wait_s=0.2)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
