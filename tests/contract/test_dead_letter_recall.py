"""``dead_letter`` and ``recall`` over every transport (``conftest.DRIVERS``): the same outcome
and the same typed errors whether the broker is in-process, behind its TCP port (sync or
asyncio client) or behind its gRPC port (``rocketmq5://``, which forwards to the DLQ only
from a push consumer: ``UnsupportedError`` there)."""

from __future__ import annotations

import time
import uuid

import pytest

from broker_embedded import Message
from broker_embedded.errors import InvalidMessageError, UnknownReceiptError, UnsupportedError

from .conftest import Driver


def _group() -> str:
    return f"contract-dlq-{uuid.uuid4().hex[:8]}"


def test_dead_letter_now(driver: Driver) -> None:
    topic, group = driver.topic(), _group()
    sent = driver.api.send(Message(topic, b"poison"))
    [received] = driver.api.receive(group, topic, wait_s=5)
    if driver.proxy:
        with pytest.raises(UnsupportedError):
            driver.api.dead_letter(group, received.receipt_handle)
        return
    driver.api.dead_letter(group, received.receipt_handle)
    driver.api.dead_letter(group, received.receipt_handle)  # repeated: nothing more
    assert [d.message.message_id for d in driver.admin.list_dlq(group)] == [sent.message_id]
    assert driver.api.receive(group, topic, wait_s=0) == []
    with pytest.raises(UnknownReceiptError):
        driver.api.dead_letter(group, "no-such-receipt")


def test_recall_a_delayed_message(driver: Driver) -> None:
    topic, group = driver.topic(), _group()
    due_ms = int(time.time() * 1000) + 1500
    recalled = driver.api.send(Message(topic, b"recalled", deliver_at_ms=due_ms))
    kept = driver.api.send(Message(topic, b"kept", deliver_at_ms=due_ms))
    assert recalled.recall_handle and kept.recall_handle
    assert driver.api.recall(topic, recalled.recall_handle) == recalled.message_id
    with pytest.raises(InvalidMessageError):
        driver.api.recall(topic, "no-such-handle")
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while b"kept" not in got and time.monotonic() < deadline:
        for message in driver.api.receive(group, topic, wait_s=1):
            driver.api.ack(group, message.receipt_handle)
            got.append(bytes(message.message.body))
    time.sleep(0.3)  # the recalled one was due with it
    assert got + [bytes(m.message.body) for m in driver.api.receive(group, topic, wait_s=0)] == [b"kept"]
