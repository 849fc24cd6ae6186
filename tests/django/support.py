"""Helpers shared by the Django tests: waiting, a checker that never answers, an admin client."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from django.test import Client

from broker_embedded import BrokerConfig, CheckRequest, EmbeddedBroker, Message

PENDING_URL = "/admin/halfmoon_outbox/pendingtransaction/"


def eventually(condition: Callable[[], object], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition did not hold in time")


class SilentChecker:
    """Takes every check-back and never answers, so transactions end up parked."""

    def request_check(self, request: CheckRequest) -> bool:
        return True


def park(data_dir: Path, transactions: dict[str, str]) -> None:
    """Park each ``transaction id -> producer group`` (one half message each) in the broker
    at ``data_dir``, then close it so the app can open the directory."""
    config = BrokerConfig(transaction_timeout_s=0.1, check_interval_s=0.1, check_max=2, service_tick_s=0.02)
    broker = EmbeddedBroker(data_dir, config=config, checker=SilentChecker())
    try:
        for transaction_id, group in transactions.items():
            broker.send_half(Message("order.paid", b"{}"), producer_group=group, transaction_id=transaction_id)
        eventually(lambda: len(broker.list_parked()) == len(transactions))
    finally:
        broker.close()


def admin_client() -> Client:
    """A test client logged in as a superuser."""
    from django.contrib.auth.models import User

    User.objects.filter(username="admin").delete()
    User.objects.create_superuser("admin", "a@example.com", "pw")
    client = Client()
    assert client.login(username="admin", password="pw")
    return client
