"""A real ``halfmoon-broker serve --grpc-port`` subprocess (or an in-process broker serving gRPC,
for broker settings ``serve`` has no option for), the official RocketMQ 5 Python
client (``rocketmq-python-client``, a dev dependency) imported with its log files in a
temporary folder (it picks ``~/logs/rocketmq_python`` at import), and the official Node
client (``rocketmq-client-nodejs``, installed by ``npm ci`` from tests/compat/node)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from broker_embedded import BrokerClient, EmbeddedBroker
from broker_embedded.broker.config import BrokerConfig
from broker_embedded.server.grpc.front import GrpcFront
from tests.conftest import services_required, unavailable
from tests.ports import free_port
from tests.server.conftest import ServerProcess, wait_for_port

#: The broker's transaction settings for these tests: quick first check, quick re-checks,
#: parked after three unanswered checks.
TRANSACTION_OPTIONS = ("--transaction-timeout", "1", "--check-interval", "1", "--check-max", "3")


def _import_client() -> ModuleType:
    """The official client (a dev dependency): missing, these tests fail in CI and skip elsewhere."""
    home = os.environ.get("HOME")
    os.environ["HOME"] = tempfile.mkdtemp(prefix="rocketmq-client-home-")
    try:
        return importlib.import_module("rocketmq")
    except ImportError:
        reason = "rocketmq-python-client (a dev dependency) is not installed"
        if services_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home


rocketmq = _import_client()


@dataclass
class GrpcBroker:
    """A broker process with its native and gRPC ports."""

    process: ServerProcess
    grpc_port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def native(self) -> BrokerClient:
        return BrokerClient(self.process.url)

    def config(self, access_key: str = "", secret_key: str = "") -> Any:
        return rocketmq.ClientConfiguration(self.endpoint, rocketmq.Credentials(access_key, secret_key))


def start_grpc_broker(data_dir: Path, *extra: str, grpc_port: int | None = None) -> GrpcBroker:
    """A broker process on ``data_dir`` serving gRPC on ``grpc_port`` (default: a free port)."""
    grpc_port = grpc_port or free_port()
    process = ServerProcess(data_dir, "--grpc-port", str(grpc_port), *TRANSACTION_OPTIONS, *extra).start()
    wait_for_port(grpc_port, process=process)
    return GrpcBroker(process, grpc_port)


@pytest.fixture(scope="module")
def grpc_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcBroker]:
    """One broker for the module's tests (each test uses its own topics and groups); its
    routes advertise its address explicitly."""
    grpc_port = free_port()
    broker = start_grpc_broker(tmp_path_factory.mktemp("grpc") / "broker", "--grpc-advertise",
                               f"127.0.0.1:{grpc_port}", grpc_port=grpc_port)
    yield broker
    broker.process.stop()


@contextmanager
def in_process_grpc(data_dir: Path, config: BrokerConfig, push_invisible_s: float = 30.0,
                    fifo_groups: tuple[str, ...] = ()) -> Iterator[tuple[EmbeddedBroker, str]]:
    """An in-process broker with ``config`` serving gRPC on a free port, from its own event loop."""
    broker = EmbeddedBroker(data_dir, config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-front-loop", daemon=True)
    thread.start()
    front = GrpcFront(broker, port=0, push_invisible_s=push_invisible_s, fifo_groups=fifo_groups)
    try:
        asyncio.run_coroutine_threadsafe(front.start(), loop).result(30)
        yield broker, f"127.0.0.1:{front.port}"
    finally:
        asyncio.run_coroutine_threadsafe(front.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        broker.close()


@dataclass
class InProcess:
    """An in-process broker and its gRPC address."""

    broker: EmbeddedBroker
    endpoint: str

    @property
    def config(self) -> Any:
        return rocketmq.ClientConfiguration(self.endpoint, rocketmq.Credentials("", ""))


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[Callable[..., InProcess]]:
    """Start an in-process broker serving gRPC. Request this fixture before ``clients``: the
    clients are shut down first (a push consumer shut down with an ack in flight to a stopped
    broker retries it forever)."""
    with ExitStack() as stack:
        def start(config: BrokerConfig, push_invisible_s: float = 30.0, fifo_groups: tuple[str, ...] = ()) -> InProcess:
            return InProcess(*stack.enter_context(in_process_grpc(tmp_path / "broker", config, push_invisible_s,
                                                                  fifo_groups)))

        yield start


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[list[GrpcBroker]]:
    """Two brokers, each with its own store, behind one static route that names both (request
    it before ``clients``: the clients end first)."""
    ports = [free_port(), free_port()]
    route = ",".join(f"127.0.0.1:{port}" for port in ports)
    brokers = [start_grpc_broker(tmp_path / f"broker-{n}", "--grpc-advertise", route, grpc_port=port)
               for n, port in enumerate(ports)]
    yield brokers
    for broker in brokers:
        broker.process.stop()


@pytest.fixture
def clients() -> Iterator[Callable[[Any], Any]]:
    """Start official clients; each is shut down after the test."""
    started: list[Any] = []

    def start(client: Any) -> Any:
        client.startup()
        started.append(client)
        return client

    yield start
    for client in reversed(started):
        client.shutdown()


NODE_DIR = Path(__file__).parent / "node"
LOCK_FILES = ("package.json", "package-lock.json")


def _install_dir() -> Path:
    """Where ``npm ci`` puts the pinned client: outside the checkout, keyed by the lock file."""
    digest = hashlib.sha256(b"".join((NODE_DIR / name).read_bytes() for name in LOCK_FILES)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "halfmoon-node" / digest


def _npm_ci(target: Path) -> None:
    """Install into a fresh folder, then move it into place (a concurrent session may win)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
    try:
        for name in LOCK_FILES:
            shutil.copy(NODE_DIR / name, staging / name)
        result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=staging,
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            unavailable(f"npm ci of tests/compat/node failed: {result.stderr.strip()[-500:]}")
        try:
            staging.rename(target)
        except OSError:  # another session installed it first
            if not (target / "node_modules").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class NodeClient:
    """Runs the scenarios of a script of tests/compat/node (``client.js`` by default,
    ``examples.js``) with the installed modules and a throwaway HOME (the client logs to
    ``~/logs/rocketmq``)."""

    node_modules: Path
    home: Path
    script: str = "client.js"

    def start(self, scenario: str, **arguments: Any) -> subprocess.Popen[str]:
        env = {**os.environ, "NODE_PATH": str(self.node_modules), "HOME": str(self.home)}
        return subprocess.Popen(["node", str(NODE_DIR / self.script), scenario, json.dumps(arguments)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)

    def run(self, scenario: str, **arguments: Any) -> list[dict[str, Any]]:
        """Run a scenario to its end; its JSON records."""
        process = self.start(scenario, **arguments)
        out, err = process.communicate(timeout=90)
        assert process.returncode == 0, f"{self.script} {scenario} failed: {err}"
        return [uncorrupted(json.loads(line)) for line in out.splitlines()]

    def fails(self, scenario: str, **arguments: Any) -> str:
        """Run a scenario that must fail; its error output."""
        process = self.start(scenario, **arguments)
        _, err = process.communicate(timeout=90)
        assert process.returncode == 1, f"{self.script} {scenario} did not fail"
        return err


def uncorrupted(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a line a Node script reported), asserting that no message in it is
    ``corrupted``: the client found its body digest wrong (push consumers drop those)."""
    values = [item for value in record.values() for item in (value if isinstance(value, list) else [value])]
    assert not any(isinstance(view, dict) and view.get("corrupted") for view in values), record
    return record


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> NodeClient:
    if shutil.which("node") is None or shutil.which("npm") is None:
        unavailable("node and npm are needed for the official Node client's tests")
    target = _install_dir()
    if not (target / "node_modules").is_dir():
        _npm_ci(target)
    return NodeClient(target / "node_modules", tmp_path_factory.mktemp("node-home"))


def eventually(condition: Callable[[], Any], within_s: float = 20.0) -> Any:
    """Poll ``condition`` until it returns something truthy (a bound, not a measurement)."""
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)
