"""The outbox's Prometheus metrics after real transactions, check-backs and deliveries,
read from the application's own CollectorRegistry."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, insert
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import EmbeddedBroker, Message, Resolution
from outbox import (
    Producer,
    TransactionFencedError,
    check_transaction,
    idempotent_consumer,
    instrumentation,
    metrics,
    transactional_message,
)
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import consumed_message, transaction_log
from outbox.producer import TRANSACTION_ID_PROPERTY
from outbox.retention import PurgeOptions, RetentionPolicy
from outbox.schema import COMMITTED, CONSUMED_MESSAGE, TRANSACTION_LOG
from tests.outbox.observability import consume, orders, wait_for


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    metrics.install(registry=registry)
    yield registry
    metrics.uninstall(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"halfmoon_outbox_{name}", labels) or 0.0


def test_commit_and_rollback_count_and_time_the_half_send_and_end(
        registry: CollectorRegistry, shop_sessions: sessionmaker[Session], broker: EmbeddedBroker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, shop_sessions, topic="order.paid")
    def pay(session: Session, order_id: str, fail: bool = False) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))
        if fail:
            raise ValueError("declined")

    pay("o1")
    with pytest.raises(ValueError):
        pay("o2", fail=True)
    assert value(registry, "transactions_total", producer_group="shop", outcome="committed") == 1
    assert value(registry, "transactions_total", producer_group="shop", outcome="rolled_back") == 1
    assert value(registry, "half_send_duration_seconds_count", producer_group="shop") == 2
    assert value(registry, "end_transaction_duration_seconds_count", producer_group="shop") == 2
    assert value(registry, "half_send_duration_seconds_sum", producer_group="shop") > 0
    exposition = generate_latest(registry).decode()
    assert "# TYPE halfmoon_outbox_half_send_duration_seconds histogram" in exposition
    assert "# TYPE halfmoon_outbox_transactions_total counter" in exposition


def test_a_check_back_that_fences_the_transaction(
        registry: CollectorRegistry, shop_sessions: sessionmaker[Session], checking_broker: EmbeddedBroker,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The local transaction starts after the broker checked back: the fence answers
    ROLLBACK, and the transaction fails on its own insert."""
    monkeypatch.setattr("outbox.producer.new_transaction_id", lambda: "tx-late")
    engine = shop_sessions.kw["bind"]
    checked = threading.Event()

    class LateTransaction:
        def execute_local_transaction(self, message: Message, transaction_id: str) -> Resolution:
            wait_for(checked.is_set, "the check-back")
            with engine.begin() as connection:
                record_committed(connection, transaction_id, "shop")
            return Resolution.COMMIT

        def check_local_transaction(self, message: Message) -> Resolution:
            answer = check_transaction(engine, message.properties[TRANSACTION_ID_PROPERTY], "shop")
            checked.set()
            return answer

    producer = Producer(checking_broker, "shop")
    producer.register_check_listener(LateTransaction())
    with pytest.raises(TransactionFencedError):
        producer.send_message_in_transaction(Message("order.paid", b"{}"), "tx-late", LateTransaction())
    assert value(registry, "check_backs_total", producer_group="shop", answer="rollback") == 1
    assert value(registry, "fenced_transactions_total", producer_group="shop") == 1
    assert value(registry, "transactions_total", producer_group="shop", outcome="rolled_back") == 1


def test_deliveries_and_a_dedup_hit(registry: CollectorRegistry, shop_sessions: sessionmaker[Session],
                                    broker: EmbeddedBroker) -> None:
    awarded: list[str] = []

    @idempotent_consumer("points", shop_sessions)
    def award(session: Session, received) -> None:  # type: ignore[no-untyped-def]
        awarded.append(received.message.message_id)

    broker.send(Message("order.paid", b"{}", message_id="m1"))
    first = broker.receive("points", "order.paid", invisible_duration_s=0.05, wait_s=2)[0]
    assert award(first) is True  # handled, never acked: the broker delivers it again
    consume(broker, "points", "order.paid", award,
            until=lambda: value(registry, "deliveries_total", consumer_group="points", topic="order.paid",
                                outcome="skipped") == 1)
    assert awarded == ["m1"]
    assert value(registry, "duplicates_skipped_total", consumer_group="points") == 1
    broker.send(Message("order.paid", b"{}", message_id="m2"))
    consume(broker, "points", "order.paid", award,
            until=lambda: value(registry, "deliveries_total", consumer_group="points", topic="order.paid",
                                outcome="handled") == 1)
    assert awarded == ["m1", "m2"]


def test_a_purge_counts_its_rows_per_table_batch_by_batch(registry: CollectorRegistry, engine: Engine,
                                                            broker: EmbeddedBroker) -> None:
    old = datetime.now(UTC) - timedelta(days=30)
    with engine.begin() as connection:
        connection.execute(insert(consumed_message), [
            {"consumer_group": "points", "message_id": f"m{n}", "topic": "order.paid", "consumed_at": old}
            for n in range(7)])
        connection.execute(insert(transaction_log), [
            {"transaction_id": f"t{n}", "producer_group": "shop", "state": COMMITTED, "created_at": old}
            for n in range(3)])
    seen: list[float] = []
    purge_engine(engine, RetentionPolicy(), broker.open_transactions, PurgeOptions(batch_size=3, pause_s=0),
                 lambda _: seen.append(value(registry, "purged_rows_total", table=CONSUMED_MESSAGE)))
    assert value(registry, "purged_rows_total", table=TRANSACTION_LOG) == 3
    assert value(registry, "purged_rows_total", table=CONSUMED_MESSAGE) == 7
    assert seen[-3:] == [3, 6, 7]  # counted as each batch commits, not at the end
    purge_engine(engine, RetentionPolicy(), broker.open_transactions, PurgeOptions(dry_run=True))
    assert value(registry, "purged_rows_total", table=CONSUMED_MESSAGE) == 7  # a dry run deletes nothing


def test_install_is_idempotent_per_registry_and_uninstall_stops_counting() -> None:
    registry = CollectorRegistry()
    first = metrics.install(registry=registry)
    assert metrics.install(registry=registry) is first  # no duplicate registration
    instrumentation.announce(instrumentation.ROWS_PURGED, table="t", rows=1)
    assert value(registry, "purged_rows_total", table="t") == 1
    metrics.uninstall(registry)
    instrumentation.announce(instrumentation.ROWS_PURGED, table="t", rows=1)
    assert value(registry, "purged_rows_total", table="t") == 0  # unregistered
    assert not instrumentation.contains(instrumentation.ROWS_PURGED, first._on_purged)
