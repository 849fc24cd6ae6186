"""RocketMQ's listener style: execute_local_transaction, and check-backs answered by a
connected producer (``register_check_listener``) instead of Celery."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from broker_embedded import BrokerConfig, EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.broker.export import transaction_states
from broker_embedded.store.config import StoreConfig
from outbox import Producer, check_transaction
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.producer import TRANSACTION_ID_PROPERTY


class LogListener:
    """Runs the local transaction with the fenced transaction_log; answers checks from it."""

    def __init__(self, engine: Engine, fail: bool = False) -> None:
        self.engine = engine
        self.fail = fail

    def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
        with self.engine.begin() as conn:
            record_committed(conn, arg, "shop")
            if self.fail:
                raise RuntimeError("business rule failed")
        return Resolution.COMMIT

    def check_local_transaction(self, message: Message) -> Resolution:
        raise AssertionError("not used here")


def _state(broker: EmbeddedBroker) -> TransactionState:
    ((state, _),) = transaction_states(broker).values()
    return state


def test_send_message_in_transaction_commits(engine: Engine, broker: EmbeddedBroker, monkeypatch) -> None:
    monkeypatch.setattr("outbox.producer.new_transaction_id", lambda: "tx-listener")
    producer = Producer(broker, "shop")
    assert producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-listener",
                                                LogListener(engine)) is Resolution.COMMIT
    assert _state(broker) is TransactionState.COMMITTED
    assert len(broker.receive("points", "order.paid", wait_s=1)) == 1


def test_listener_exception_rolls_back_and_is_raised(engine: Engine, broker: EmbeddedBroker, monkeypatch) -> None:
    monkeypatch.setattr("outbox.producer.new_transaction_id", lambda: "tx-fail")
    with pytest.raises(RuntimeError, match="business rule"):
        Producer(broker, "shop").send_message_in_transaction(Message("order.paid", b"{}"), "tx-fail",
                                                              LogListener(engine, fail=True))
    assert _state(broker) is TransactionState.ROLLED_BACK
    assert check_transaction(engine, "tx-fail", "shop") is Resolution.ROLLBACK


def test_connected_producer_answers_check_backs(engine: Engine, tmp_path: Path) -> None:
    config = BrokerConfig(store=StoreConfig(segment_size=1 << 20), transaction_timeout_s=0.2,
                          check_interval_s=0.2)
    broker = EmbeddedBroker(tmp_path / "checked", config)
    try:
        producer = Producer(broker, "shop")
        asked: list[str] = []

        class Checker:
            def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
                raise AssertionError("not used here")

            def check_local_transaction(self, message: Message) -> Resolution:
                asked.append(message.message_id)
                return check_transaction(engine, message.properties[TRANSACTION_ID_PROPERTY], "shop")

        producer.register_check_listener(Checker())
        with engine.begin() as conn:  # committed locally; END_TRANSACTION "lost"
            record_committed(conn, "tx-lost-end", "shop")
        message = Message("order.paid", b"{}")
        producer.send_half(message, "tx-lost-end")
        deadline = time.monotonic() + 30
        while _state(broker) is TransactionState.PENDING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(broker) is TransactionState.COMMITTED
        assert asked and asked[0] == message.message_id
    finally:
        broker.close()


def test_the_transaction_id_has_one_property_name_on_every_broker() -> None:
    """A check listener reads the transaction id under one property, the one the
    ``rocketmq5://`` client stores on its broker transactions: a check-back through a
    RocketMQ 5 cluster carries it once, not under two names."""
    from broker_embedded import CheckRequest
    from broker_embedded.client.rocketmq5 import TRANSACTION_PROPERTY
    from outbox.producer_protocol import check_message

    half = Message("order.paid", b"{}", properties={TRANSACTION_PROPERTY: "tx-1", "source": "shop"})
    message = check_message(CheckRequest("shop", "tx-1", half, check_times=1))
    assert [name for name, value in message.properties.items() if value == "tx-1"] == [TRANSACTION_ID_PROPERTY]
    assert message.properties["source"] == "shop"
