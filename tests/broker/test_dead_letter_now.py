"""``dead_letter``: a received message moved to its group's DLQ at once (RocketMQ 5's
ForwardMessageToDeadLetterQueue), as the broker's own max-attempts path moves it."""

from __future__ import annotations

import time

import pytest

from broker_embedded import Message
from broker_embedded.broker import codec
from broker_embedded.errors import UnknownReceiptError


def test_a_received_message_goes_to_the_dlq_now_and_is_done(broker_factory) -> None:
    broker = broker_factory(max_delivery_attempts=16)
    sent = broker.send(Message("orders", b"poison", tag="t", properties={"k": "v"}))
    broker.send(Message("orders", b"fine"))
    first = broker.receive("g", "orders", max_messages=1, wait_s=2)[0]
    assert first.message.message_id == sent.message_id
    broker.dead_letter("g", first.receipt_handle)
    [dead] = broker.list_dlq("g")
    assert (dead.message.message_id, dead.message.topic, dead.message.body) == (sent.message_id, "orders", b"poison")
    assert (dead.message.tag, dead.message.properties) == ("t", {"k": "v"})
    stored = broker.store.get(dead.commit_log_offset)
    assert stored.properties[codec.DELIVERY_ATTEMPTS] == "1"  # as the max-attempts path records it
    rest = broker.receive("g", "orders", invisible_duration_s=0.1, wait_s=1)
    assert [r.message.body for r in rest] == [b"fine"]  # never delivered to the group again
    broker.ack("g", rest[0].receipt_handle)
    assert broker.stats().consumer_lag == {"g": {"orders": 0}}
    assert broker.stats().dlq_depth == {"g": 1}


def test_repeating_it_is_harmless_and_a_restart_keeps_it(broker_factory) -> None:
    broker = broker_factory()
    sent = broker.send(Message("orders", b"poison"))
    received = broker.receive("g", "orders", wait_s=2)[0]
    broker.dead_letter("g", received.receipt_handle)
    broker.dead_letter("g", received.receipt_handle)  # idempotent: no second copy
    assert [d.message.message_id for d in broker.list_dlq("g")] == [sent.message_id]
    broker.close()
    again = broker_factory()
    assert [d.message.message_id for d in again.list_dlq("g")] == [sent.message_id]
    assert again.receive("g", "orders", wait_s=0.3) == []
    again.dead_letter("g", received.receipt_handle)  # still harmless after a restart
    assert len(again.list_dlq("g")) == 1


def test_unknown_stale_acked_and_foreign_receipts_are_refused(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"x"))
    broker.send(Message("orders", b"y"))
    first = broker.receive("g", "orders", max_messages=1, invisible_duration_s=0.05)[0]
    broker.receive("other", "orders", max_messages=2, wait_s=1)  # the other group holds both
    with pytest.raises(UnknownReceiptError):
        broker.dead_letter("g", "garbage")
    with pytest.raises(UnknownReceiptError):
        broker.dead_letter("g", "orders|orders|0|999|abcdef")
    with pytest.raises(UnknownReceiptError):
        broker.dead_letter("other", first.receipt_handle)  # a receipt of another group
    time.sleep(0.2)  # past its invisibility: delivered again, the first receipt is stale
    second = broker.receive("g", "orders", max_messages=1, wait_s=1)[0]
    assert second.message.message_id == first.message.message_id
    with pytest.raises(UnknownReceiptError):
        broker.dead_letter("g", first.receipt_handle)
    broker.ack("g", second.receipt_handle)
    with pytest.raises(UnknownReceiptError):
        broker.dead_letter("g", second.receipt_handle)  # acked: not in flight, not dead-lettered
    assert broker.list_dlq("g") == [] and broker.list_dlq("other") == []
