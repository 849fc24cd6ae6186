"""What the metrics and tracing tests share (their fixtures ``shop_sessions`` and
``checking_broker`` are in conftest.py): a shop table, and a consumer run until it
handled what it should."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table

from broker_embedded import EmbeddedBroker
from outbox import run_consumer
from outbox.consumer import Handler

shop = MetaData()
orders = Table("obs_orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def consume(broker: EmbeddedBroker, group: str, topic: str, handler: Handler, until: Callable[[], object]) -> None:
    """``run_consumer`` on a thread until ``until()`` holds."""
    stop = threading.Event()
    thread = threading.Thread(target=run_consumer, args=(broker, group, topic, handler, stop),
                              kwargs={"invisible_duration_s": 0.2, "wait_s": 0.1})
    thread.start()
    try:
        wait_for(until, f"{group} to consume {topic}")
    finally:
        stop.set()
        thread.join()
