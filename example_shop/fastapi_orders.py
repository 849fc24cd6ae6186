"""The order service on FastAPI: paying an order sends ``order.paid`` transactionally.

    OUTBOX_BROKER_URL=tcp://127.0.0.1:9876 \\
    SHOP_ORDERS_DATABASE_URL=sqlite+aiosqlite:///orders.sqlite3 \\
        uvicorn --factory example_shop.fastapi_orders:create_app

``POST /orders`` with ``{"order_id": ..., "customer": ..., "amount": ...}`` inserts the
order and sends ``order.paid`` with ``@transactional_message`` on an ``async def``: the
half message overlaps the transaction and is acknowledged before the commit, COMMIT
follows the commit. A second payment of the same order is refused (409, and its
transaction ends with ROLLBACK). The lifespan creates the engine and the
``AsyncProducer`` at startup (and the tables, as a demo may) and closes both at shutdown.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, Column, MetaData, String, Table
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from outbox import (
    AsyncProducer,
    BrokerUnavailableError,
    current_transaction_id,
    transactional_message,
)
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata
from outbox.settings import DEFAULT_BROKER_URL

TOPIC = "order.paid"

shop = MetaData()
orders = Table(
    "fastapi_order", shop,
    Column("order_id", String(64), primary_key=True),
    Column("customer", String(64), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("transaction_id", String(64), nullable=False),
)


class OrderPayment(BaseModel):
    """A payment request: the order, who pays, how much (whole currency units)."""

    order_id: str = Field(min_length=1, max_length=64)
    customer: str = Field(min_length=1, max_length=64)
    amount: int = Field(gt=0)


#: Pays an order in its own transaction with its ``order.paid`` message; its transaction id.
Payment = Callable[[OrderPayment], Awaitable[str]]


def order_payment(producer: AsyncProducer, sessions: async_sessionmaker[AsyncSession]) -> Payment:
    """The decorated payment function for ``producer`` and ``sessions``."""

    @transactional_message(producer, sessions, topic=TOPIC, keys=lambda payment: [payment.order_id],
                           body=lambda payment: payment.model_dump(), overlap=True)
    async def pay(session: AsyncSession, payment: OrderPayment) -> str:
        transaction_id = cast(str, current_transaction_id())  # set inside @transactional_message
        await session.execute(orders.insert().values(**payment.model_dump(), transaction_id=transaction_id))
        return transaction_id

    return pay


async def open_database(url: str, tables: MetaData) -> AsyncEngine:
    """An async engine on ``url`` with the outbox tables and ``tables`` created (as a demo may)."""
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(outbox_metadata.create_all)
        await conn.run_sync(tables.create_all)
    return engine


def create_app(database_url: str | None = None, broker_url: str | None = None,
               producer_group: str = "shop") -> FastAPI:
    """The service on ``database_url`` (an async SQLAlchemy URL; default
    ``SHOP_ORDERS_DATABASE_URL``) sending to ``broker_url`` (default ``OUTBOX_BROKER_URL``)."""
    database = database_url or os.environ.get("SHOP_ORDERS_DATABASE_URL", "sqlite+aiosqlite:///orders.sqlite3")
    broker = broker_url or os.environ.get("OUTBOX_BROKER_URL", DEFAULT_BROKER_URL)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await open_database(database, shop)
        producer = AsyncProducer(broker, producer_group)
        app.state.pay = order_payment(producer, async_sessionmaker(engine, expire_on_commit=False))
        try:
            yield
        finally:
            await producer.aclose()
            await engine.dispose()

    app = FastAPI(title="halfmoon example shop: orders", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def pay_order(payment: OrderPayment, request: Request) -> dict[str, str]:
        try:
            transaction_id = await request.app.state.pay(payment)
        except IntegrityError:
            raise HTTPException(409, f"order {payment.order_id} is already paid") from None
        except BrokerUnavailableError:
            raise HTTPException(503, "the broker is unavailable; nothing was paid") from None
        return {"order_id": payment.order_id, "transaction_id": transaction_id}

    return app
