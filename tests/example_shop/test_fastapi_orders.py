"""The FastAPI order and points services served by uvicorn, driven over HTTP with httpx:
the lifespan opens the producer, a paid order's message reaches the broker, a refused one
does not, and the points service's async consumer awards each paid order once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from broker_embedded import BrokerClient, TransactionState
from broker_embedded.broker.export import transaction_states
from example_shop import fastapi_points
from example_shop.fastapi_orders import TOPIC, create_app
from outbox import message_json
from tests.outbox.async_support import async_url, tcp_broker
from tests.ports import free_port
from tests.server.conftest import ThreadServer


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


@contextmanager
def served(app: object) -> Iterator[str]:
    """``app`` on a free port, in a thread; its base URL. Leaving runs the lifespan's shutdown."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not shut down"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shop's database (both services use it, each with its own tables), as an async URL."""
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}" if request.param == "sqlite" \
        else request.getfixturevalue("postgres_url")
    return async_url(url)


@pytest.fixture
def service(database: str, broker: ThreadServer) -> Iterator[str]:
    with served(create_app(database, broker.url)) as url:
        yield url


def test_a_paid_order_sends_its_committed_message(service: str, broker: ThreadServer) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        paid = client.post("/orders", json={"order_id": "o-1", "customer": "ann", "amount": 40})
        assert paid.status_code == 201, paid.text
        again = client.post("/orders", json={"order_id": "o-1", "customer": "ann", "amount": 40})
        assert again.status_code == 409
        assert client.post("/orders", json={"order_id": "o-2", "customer": "ann", "amount": 0}).status_code == 422
    transaction_id = paid.json()["transaction_id"]
    assert broker.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    with BrokerClient(broker.url) as consumer:
        received = consumer.receive("points", TOPIC, max_messages=10, wait_s=1)
    assert [message_json(r.message) for r in received] == [{"order_id": "o-1", "customer": "ann", "amount": 40}]
    assert received[0].transaction_id == transaction_id and received[0].message.keys == ("o-1",)
    others = {state for tx, (state, _) in transaction_states(broker.broker).items() if tx != transaction_id}
    assert others == {TransactionState.ROLLED_BACK}  # the refused second payment


def _points(points_url: str, customer: str) -> int:
    return int(httpx.get(f"{points_url}/points/{customer}", timeout=30).json()["points"])


def test_the_points_service_awards_each_paid_order_once(service: str, database: str,
                                                        broker: ThreadServer) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        for order_id, amount in (("o-1", 40), ("o-2", 2)):
            assert client.post("/orders", json={"order_id": order_id, "customer": "bo",
                                                "amount": amount}).status_code == 201
        assert client.post("/orders", json={"order_id": "o-1", "customer": "bo", "amount": 40}).status_code == 409
    with served(fastapi_points.create_app(database, broker.url)) as points:
        deadline = time.monotonic() + 30
        while _points(points, "bo") < 42 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _points(points, "bo") == 42  # the refused payment rolled back: never delivered
        assert _points(points, "nobody") == 0
    with httpx.Client(base_url=service, timeout=30) as client:  # paid while the points service is down
        assert client.post("/orders", json={"order_id": "o-3", "customer": "bo", "amount": 5}).status_code == 201
    with served(fastapi_points.create_app(database, broker.url)) as points:  # a restart awards only the new one
        deadline = time.monotonic() + 30
        while _points(points, "bo") < 47 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # room for a wrong second award to show up
        assert _points(points, "bo") == 47
