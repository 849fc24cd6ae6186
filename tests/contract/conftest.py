"""The ``BrokerAPI`` drivers the contract suite runs over, each a module-wide backing: the
in-process ``EmbeddedBroker``; the sync ``BrokerClient`` and the asyncio
``AsyncBrokerClient`` (through ``SyncAdapter``) against a ``BrokerServer``; and the
``rocketmq5://`` client against our own ``serve --grpc-port`` process. Each test uses topics
and groups of its own."""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_embedded import AsyncBrokerClient, BrokerAPI, BrokerClient, BrokerConfig, EmbeddedBroker

DRIVERS = ("embedded", "tcp", "asyncio", "rocketmq5")


class SyncAdapter:
    """An ``AsyncBrokerClient`` called like the sync ``BrokerAPI``: each coroutine runs on an
    event loop of the adapter's own thread, the caller waiting for its result."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client: AsyncBrokerClient = self._run(self._make(url))

    @staticmethod
    async def _make(url: str) -> AsyncBrokerClient:
        return AsyncBrokerClient(url)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(60)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not inspect.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass
class Driver:
    """One transport under test: ``api`` is what the tests call; ``admin`` creates topics
    (a native connection where ``api`` is a RocketMQ 5 proxy, which has no admin API)."""

    name: str
    api: BrokerAPI
    admin: BrokerAPI

    @property
    def proxy(self) -> bool:
        """True for ``rocketmq5://``: admin calls raise ``UnsupportedError``."""
        return self.name == "rocketmq5"

    def topic(self, queues: int = 1) -> str:
        """A new topic for one test."""
        name = f"contract-{uuid.uuid4().hex[:10]}"
        self.admin.create_topic(name, queues)
        return name


def _served(data_dir: Path, client: Callable[[str], Any]) -> Iterator[Driver]:
    from tests.server.conftest import ThreadServer

    server = ThreadServer(data_dir, BrokerConfig())
    api = client(server.url)
    try:
        yield Driver("", api, api)
    finally:
        api.close()
        server.stop()


def _rocketmq5(data_dir: Path) -> Iterator[Driver]:
    from broker_embedded.client.rocketmq5 import RocketMQ5Broker
    from tests.compat.conftest import start_grpc_broker
    from tests.ports import free_port

    grpc_port = free_port()
    served = start_grpc_broker(data_dir, "--grpc-advertise", f"127.0.0.1:{grpc_port}", grpc_port=grpc_port)
    api, admin = RocketMQ5Broker(f"rocketmq5://{served.endpoint}"), served.native()
    try:
        yield Driver("", api, admin)
    finally:
        api.close()
        admin.close()
        served.process.stop()


@pytest.fixture(scope="module", params=DRIVERS)
def driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    """Each transport in turn, one backing broker per module."""
    data_dir = tmp_path_factory.mktemp(request.param) / "broker"
    backings: dict[str, Callable[[], Iterator[Driver]]] = {
        "embedded": lambda: _embedded(data_dir),
        "tcp": lambda: _served(data_dir, BrokerClient),
        "asyncio": lambda: _served(data_dir, SyncAdapter),
        "rocketmq5": lambda: _rocketmq5(data_dir),
    }
    for found in backings[request.param]():
        found.name = request.param
        yield found


def _embedded(data_dir: Path) -> Iterator[Driver]:
    broker = EmbeddedBroker(data_dir, BrokerConfig())
    try:
        yield Driver("", broker, broker)
    finally:
        broker.close()
