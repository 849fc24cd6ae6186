"""``relay_committed`` over every transport (``conftest.DRIVERS``): the relayed messages are
delivered, a repeat stores nothing more (exactly once on the native transports; a RocketMQ 5
cluster cannot recognise what it holds, so there it is at least once), and bad input raises
the same typed error everywhere."""

from __future__ import annotations

import uuid

import pytest

from broker_embedded import Message, TransactionState
from broker_embedded.errors import InvalidMessageError

from .conftest import Driver
from .test_broker_api import GROUP, PRODUCERS, _drain, _nothing_visible


def test_a_relayed_transaction_is_delivered_and_a_repeat_adds_nothing(driver: Driver) -> None:
    topic, transaction_id = driver.topic(), uuid.uuid4().hex
    messages = [Message(topic, b"relayed 0", keys=("k0",)), Message(topic, b"relayed 1")]
    results = driver.api.relay_committed(messages, producer_group=PRODUCERS, transaction_id=transaction_id)
    assert [r.topic for r in results] == [topic, topic]
    assert sorted(m.message.body for m in _drain(driver, topic, 2)) == [b"relayed 0", b"relayed 1"]
    if driver.proxy:
        return  # at least once: a repeat sends them again
    assert [r.message_id for r in results] == [m.message_id for m in messages]
    assert driver.api.transaction_state(transaction_id) is TransactionState.COMMITTED
    assert driver.api.relay_committed(messages, producer_group=PRODUCERS, transaction_id=transaction_id) == results
    # a fresh group finds the two messages once each
    fresh = f"{GROUP}-fresh"
    assert sorted(m.message.body for m in _drain(driver, topic, 2, group=fresh)) == [b"relayed 0", b"relayed 1"]
    assert _nothing_visible(driver, topic, fresh)


def test_an_empty_relay_raises_the_same_typed_error(driver: Driver) -> None:
    with pytest.raises(InvalidMessageError) as raised:
        driver.api.relay_committed([], producer_group=PRODUCERS, transaction_id=uuid.uuid4().hex)
    assert type(raised.value) is InvalidMessageError
