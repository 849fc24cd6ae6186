"""A real broker with something on every console page, and the console served over HTTP.

``serve`` mounts a WSGI app at ``/`` of the broker's own HTTP port (``HttpPort``, as
``halfmoon-broker serve --http-port`` does) on an ephemeral port; ``sign_in`` signs an
``httpx`` client in with the broker's keys.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from broker_embedded import BrokerConfig, CheckRequest, EmbeddedBroker, Message
from broker_embedded.http.console import make_console_app
from broker_embedded.http.port import HttpPort
from broker_embedded.store.config import StoreConfig

ACCESS_KEY = "console-access"
SECRET_KEY = "console-secret-key"

CONFIG = BrokerConfig(
    store=StoreConfig(segment_size=256 * 1024, index_slots=4096, index_entries=16384),
    check_interval_s=0.2,
    check_max=1,
    max_delivery_attempts=1,
    retry_backoff_s=(0.0,),
    service_tick_s=0.02,
)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page has a form with a CSRF token"
    return found.group(1)


def sign_in(client: httpx.Client, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> str:
    """Sign ``client`` in with the broker's keys; the session's CSRF token."""
    form = client.get("/sign-in")
    answer = client.post("/sign-in", data={"csrf": csrf_of(form.text), "access_key": access_key,
                                           "secret_key": secret_key})
    assert answer.status_code == 303, answer.text
    return csrf_of(client.get("/").text)  # the sign-out form carries it


class SilentChecker:
    """Takes every check-back and answers none, so transactions under check get parked."""

    def request_check(self, request: CheckRequest) -> bool:
        return True


def eventually(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition did not hold in time")
        time.sleep(0.05)


def park(broker: EmbeddedBroker, transaction_id: str, group: str = "shop") -> None:
    """Store a half message whose checks nobody answers, and wait until it is parked."""
    broker.set_checker(SilentChecker())
    broker.send_half(Message("orders", b'{"order": 9}', keys=(f"key-{transaction_id}",), transaction_timeout_s=0.05),
                     producer_group=group, transaction_id=transaction_id)
    eventually(lambda: any(p.transaction_id == transaction_id for p in broker.list_parked()))
    broker.set_checker(broker.producers)  # from now on checks go to connected producers (none)


def dead_letter(broker: EmbeddedBroker, group: str, body: bytes) -> str:
    """Send a message to topic ``payments`` and leave it unacknowledged until it is
    dead-lettered for ``group``; its id."""
    message = Message("payments", body, keys=("refund",))
    broker.send(message)

    def gone_to_dlq() -> bool:
        broker.receive(group, "payments", max_messages=32, invisible_duration_s=0.05)
        return any(m.message.message_id == message.message_id for m in broker.list_dlq(group))

    eventually(gone_to_dlq)
    return message.message_id


class Shop:
    """What the console's broker holds, by id."""

    order_ids: list[str]
    pending_tx = "tx-pending-1"
    parked_tx = "tx-parked-1"
    dead_letter_id: str
    script_id: str
    binary_id: str


def fill_broker(broker: EmbeddedBroker) -> Shop:
    """Topics with messages, a consumer group with lag and a message in flight, a pending and
    a parked transaction, a dead letter; and messages that test escaping and binary bodies."""
    shop = Shop()
    shop.order_ids = [broker.send(Message("orders", f'{{"order": {i}}}'.encode(), keys=(f"order-{i}",))).message_id
                      for i in range(6)]
    broker.create_topic("audit", queues=2)
    script = Message("orders", b"<script>alert('body')</script>", keys=("xss",), tag="<i>",
                     properties={"note": "<b>bold</b> & \"quoted\""})
    shop.script_id = broker.send(script).message_id
    shop.binary_id = broker.send(Message("orders", bytes(range(256)) * 4, keys=("binary",))).message_id
    received = broker.receive("billing", "orders", max_messages=3, invisible_duration_s=600)
    broker.ack("billing", received[0].receipt_handle)
    broker.send_half(Message("orders", b'{"order": "pending"}', transaction_timeout_s=3600),
                     producer_group="shop", transaction_id=shop.pending_tx)
    park(broker, shop.parked_tx)
    shop.dead_letter_id = dead_letter(broker, "mailer", b'{"refund": 1}')
    return shop


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` at ``/`` of the broker's own HTTP port (``serve --http-port`` mounts
    the console the same way) on 127.0.0.1, an ephemeral port; the base URL."""
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None, {"/": app})
    port.start()
    try:
        yield port.url
    finally:
        port.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(Path(tmp_path_factory.mktemp("console")) / "broker", CONFIG) as opened:
        yield opened


@pytest.fixture(scope="module")
def shop(broker: EmbeddedBroker) -> Shop:
    return fill_broker(broker)


@pytest.fixture(scope="module")
def console_url(broker: EmbeddedBroker, shop: Shop) -> Iterator[str]:
    """The console with actions (the broker's keys are ACCESS_KEY and SECRET_KEY)."""
    with serve(make_console_app(broker, access_key=ACCESS_KEY, secret_key=SECRET_KEY, resolve_wait_s=2.0)) as url:
        yield url


@pytest.fixture(scope="module")
def read_only_url(broker: EmbeddedBroker, shop: Shop) -> Iterator[str]:
    """The console of a broker without keys: read-only."""
    with serve(make_console_app(broker, access_key=None, secret_key=None)) as url:
        yield url
