"""The FastAPI order service served by uvicorn, driven over HTTP with httpx: the lifespan
opens the producer, a paid order's message reaches the broker, a refused one does not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from broker_embedded import BrokerClient, TransactionState
from broker_embedded.export import transaction_states
from example_shop.fastapi_orders import TOPIC, create_app
from outbox import message_json
from tests.outbox.async_support import async_url, tcp_broker
from tests.server.conftest import ThreadServer, free_port


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def service(request: pytest.FixtureRequest, tmp_path: Path, broker: ThreadServer) -> Iterator[str]:
    """The service on a free port, in a thread; its base URL. Stopping it runs the lifespan's shutdown."""
    database = (f"sqlite:///{tmp_path / 'orders.sqlite3'}" if request.param == "sqlite"
                else request.getfixturevalue("postgres_url"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(async_url(database), broker.url), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


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
