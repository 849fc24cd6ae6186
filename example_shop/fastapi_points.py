"""The points service on FastAPI: it consumes ``order.paid`` with an async idempotent
handler and shows each customer's points.

    OUTBOX_BROKER_URL=tcp://127.0.0.1:9876 \\
    SHOP_POINTS_DATABASE_URL=sqlite+aiosqlite:///points.sqlite3 \\
        uvicorn --factory example_shop.fastapi_points:create_app --port 8001

The lifespan creates the engine and the ``AsyncBrokerClient``, starts ``arun_consumer`` as
a task beside the web app, and at shutdown stops it (the message in hand is finished and
acked, the rest of its batch released at once) before closing the client and the engine.
A redelivered message is skipped by the ``outbox_consumed_message`` row its first delivery
wrote in the same transaction as the points. ``GET /points/{customer}`` reads the ledger.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from sqlalchemy import BigInteger, Column, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from outbox import (
    AsyncBrokerClient,
    ReceivedMessage,
    arun_consumer,
    idempotent_consumer,
    message_json,
)
from outbox.aio_consumer import AsyncHandler
from outbox.settings import DEFAULT_BROKER_URL

from .fastapi_orders import TOPIC, open_database

GROUP = "points"

ledger = MetaData()
points = Table(
    "fastapi_points", ledger,
    Column("order_id", String(64), primary_key=True),
    Column("customer", String(64), nullable=False, index=True),
    Column("points", BigInteger, nullable=False),
)


def awarding(sessions: async_sessionmaker[AsyncSession]) -> AsyncHandler:
    """The idempotent handler: one point per currency unit of each paid order."""

    @idempotent_consumer(GROUP, sessions)
    async def award(session: AsyncSession, received: ReceivedMessage) -> None:
        paid = message_json(received.message)
        await session.execute(points.insert().values(order_id=paid["order_id"], customer=paid["customer"],
                                                     points=paid["amount"]))

    return award


def create_app(database_url: str | None = None, broker_url: str | None = None) -> FastAPI:
    """The service on ``database_url`` (an async SQLAlchemy URL; default
    ``SHOP_POINTS_DATABASE_URL``) consuming from ``broker_url`` (default ``OUTBOX_BROKER_URL``)."""
    database = database_url or os.environ.get("SHOP_POINTS_DATABASE_URL", "sqlite+aiosqlite:///points.sqlite3")
    broker_address = broker_url or os.environ.get("OUTBOX_BROKER_URL", DEFAULT_BROKER_URL)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await open_database(database, ledger)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.sessions = sessions
        broker = AsyncBrokerClient(broker_address)
        stop = asyncio.Event()
        consumer = asyncio.create_task(arun_consumer(broker, GROUP, TOPIC, awarding(sessions), stop=stop))
        try:
            yield
        finally:
            stop.set()
            await consumer
            await broker.close()
            await engine.dispose()

    app = FastAPI(title="halfmoon example shop: points", lifespan=lifespan)

    @app.get("/points/{customer}")
    async def customer_points(customer: str, request: Request) -> dict[str, str | int]:
        sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
        async with sessions() as session:
            total = await session.scalar(
                select(func.coalesce(func.sum(points.c.points), 0)).where(points.c.customer == customer))
        return {"customer": customer, "points": int(total or 0)}

    return app
