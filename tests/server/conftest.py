"""Broker servers on free ports: a real subprocess, or an in-process one with a custom config."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_embedded import BrokerConfig, EmbeddedBroker
from broker_embedded.server.tcp import BrokerServer
from tests.broker_logs import watch
from tests.ports import free_port


def wait_for_port(port: int, timeout_s: float = 60.0, process: ServerProcess | None = None) -> None:
    """Wait until something listens on ``port``; with ``process``, fail at once (with its log)
    if it ends first. The bound is generous: a loaded machine starts Python and gRPC slowly."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if process is not None and process.proc is not None and process.proc.poll() is not None:
                raise RuntimeError(f"the broker exited ({process.proc.returncode}) before listening on port {port}:\n"
                                   f"{process.log.read_text(errors='replace')[-3000:]}") from None
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s:g}s")


class ServerProcess:
    """``python -m broker_embedded serve`` as a child process."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        watch(self.log)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker_embedded", "serve", "--data-dir", str(self.data_dir),
                 "--port", str(self.port), *self.extra],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_for_port(self.port, process=self)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            return self.proc.wait(20)
        return self.proc.returncode


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*extra: str, data_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / "broker", *extra).start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


class ThreadServer:
    """An ``EmbeddedBroker`` served by ``BrokerServer`` on an event loop in a thread."""

    def __init__(self, data_dir: Path, config: BrokerConfig, **server_options: object) -> None:
        self.broker = EmbeddedBroker(data_dir, config)
        self.server = BrokerServer(self.broker, port=0, **server_options)  # type: ignore[arg-type]
        self.loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def main() -> None:
                await self.server.start()
                started.set()
                await self._stop.wait()
                await self.server.stop()

            self.loop.run_until_complete(main())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(20)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)
        self.broker.close()


@pytest.fixture
def thread_server(tmp_path: Path) -> Iterator[Callable[..., ThreadServer]]:
    started: list[ThreadServer] = []

    def start(config: BrokerConfig | None = None, **server_options: object) -> ThreadServer:
        server = ThreadServer(tmp_path / f"broker-{len(started)}", config or BrokerConfig(), **server_options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
