"""Acks that arrive together share one batch (one executor hop, one ``ack_many`` per group),
on the native port and the gRPC port alike (``batching.ack_by_group``)."""

from __future__ import annotations

from pathlib import Path

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.errors import UnknownReceiptError
from broker_embedded.server.batching import ack_by_group


def test_a_batch_of_several_groups_acks_each_in_its_place(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    try:
        broker.create_topic("orders", 1)
        for n in range(2):
            broker.send(Message("orders", f"order {n}".encode()))
        first = broker.receive("g1", "orders", max_messages=2)
        second = broker.receive("g2", "orders", max_messages=2, invisible_duration_s=0.5)
        items = [{"group": "g1", "receipt_handle": first[0].receipt_handle},
                 {"group": "g2", "receipt_handle": second[0].receipt_handle},
                 {"group": "g1", "receipt_handle": "orders|orders|0|9|unknown"},
                 {"group": "g2", "receipt_handle": first[1].receipt_handle},  # another group's handle
                 {"group": "g1", "receipt_handle": first[1].receipt_handle}]
        outcomes = ack_by_group(broker, items)
        assert [outcome is None for outcome in outcomes] == [True, True, False, False, True]
        assert all(isinstance(outcomes[index], UnknownReceiptError) for index in (2, 3))
        # g1 acked both; g2 acked its first only: its second comes back once invisible no more
        assert broker.receive("g1", "orders", invisible_duration_s=0.001) == []
        assert [m.message.body for m in broker.receive("g2", "orders", wait_s=5, invisible_duration_s=0.001)] == [b"order 1"]
    finally:
        broker.close()
