"""What the async producer tests share: a TCP broker served from a thread (the async
client talks TCP), async database URLs for the test databases, and the broker's view."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from broker_embedded import BrokerClient, BrokerConfig, TransactionState
from broker_embedded.store.config import StoreConfig
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.tables import transaction_log
from tests.server.conftest import ThreadServer

T = TypeVar("T")

#: The async drivers the tests run on, per sync driver of the ``db_url`` fixture.
ASYNC_DRIVERS = {"sqlite://": "sqlite+aiosqlite://", "postgresql+psycopg://": "postgresql+asyncpg://"}


def async_url(url: str) -> str:
    """The ``db_url`` fixture's database with its async driver (aiosqlite, asyncpg)."""
    for sync, driver in ASYNC_DRIVERS.items():
        if url.startswith(sync):
            return driver + url[len(sync):]
    raise ValueError(url)


def tcp_broker(data_dir: Path, check_after_s: float | None = None) -> ThreadServer:
    """A broker server on a free port; ``check_after_s``: checks back that soon."""
    timeouts = {"transaction_timeout_s": check_after_s, "check_interval_s": 0.2} if check_after_s else {
        "transaction_timeout_s": 3600}
    return ThreadServer(data_dir, BrokerConfig(store=StoreConfig(segment_size=1 << 20), **timeouts))


def run_with_sessions(url: str, main: Callable[[async_sessionmaker[Any]], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main(sessions))`` with an async engine on ``url`` disposed after."""

    async def run() -> T:
        engine: AsyncEngine = create_async_engine(async_url(url))
        try:
            return await main(async_sessionmaker(engine, expire_on_commit=False))
        finally:
            await engine.dispose()

    return asyncio.run(run())


def bodies(server: ThreadServer, topic: str, wait_s: float = 0.3) -> list[bytes]:
    """The bodies a fresh consumer group receives from ``topic``."""
    with BrokerClient(server.url) as client:
        return [r.message.body for r in client.receive("tests", topic, max_messages=32, wait_s=wait_s)]


def states(engine: Engine) -> dict[str, str]:
    """transaction_log: state per transaction id."""
    with engine.connect() as conn:
        return {row.transaction_id: row.state for row in conn.execute(select(transaction_log))}


def wait_for_state(server: ThreadServer, transaction_id: str, timeout_s: float = 30) -> TransactionState:
    """The broker's state of ``transaction_id`` once it is no longer PENDING (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    state = server.broker.transaction_state(transaction_id)
    while state is TransactionState.PENDING and time.monotonic() < deadline:
        time.sleep(0.05)
        state = server.broker.transaction_state(transaction_id)
    return state
