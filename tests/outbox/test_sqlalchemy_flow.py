"""The decorator and the session hook against a real broker, and the failure rules."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient, Message, TransactionState
from broker_embedded.broker.export import transaction_states
from broker_embedded.errors import BrokerUnavailableError
from outbox import (
    BodyNotSerializableError,
    BrokerUnavailable,
    Producer,
    SavepointError,
    install,
    json_message,
    message_json,
    send,
    transactional_message,
)
from outbox.integrations.sqlalchemy.tables import transaction_log
from tests.ports import free_port

shop = MetaData()
orders = Table("orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))


@pytest.fixture
def factory(engine):
    shop.create_all(engine)
    return sessionmaker(engine)


def _states(broker) -> dict[str, TransactionState]:
    return {tx: state for tx, (state, _) in transaction_states(broker).items()}


def test_decorator_commits_the_message_with_the_transaction(factory, broker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str, amount: int) -> str:
        session.execute(orders.insert().values(id=order_id, amount=amount))
        return order_id

    assert pay("o1", amount=100) == "o1"
    received = broker.receive("points", "order.paid", wait_s=2)
    assert [message_json(r.message) for r in received] == [{"order_id": "o1", "amount": 100}]
    with factory() as session:
        assert session.execute(select(transaction_log.c.state)).scalars().all() == ["COMMITTED"]
        assert received[0].transaction_id == session.execute(select(transaction_log.c.transaction_id)).scalar()


def test_business_failure_rolls_back_and_sends_rollback(factory, broker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))
        raise ValueError("insufficient balance")

    with pytest.raises(ValueError, match="insufficient"):
        pay("o1")
    assert list(_states(broker).values()) == [TransactionState.ROLLED_BACK]
    assert broker.receive("points", "order.paid", wait_s=0.3) == []
    with factory() as session:
        assert session.execute(select(orders)).all() == []
        assert session.execute(select(transaction_log)).all() == []


def test_database_failure_sends_rollback_and_raises(factory, broker) -> None:
    producer = Producer(broker, "shop")
    with factory.begin() as session:
        session.execute(orders.insert().values(id="dup", amount=1))

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))

    with pytest.raises(IntegrityError):
        pay("dup")
    assert list(_states(broker).values()) == [TransactionState.ROLLED_BACK]


def test_unserialisable_body_fails_before_anything_is_sent(factory, broker) -> None:
    producer = Producer(broker, "shop")
    ran = []

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, when: object) -> None:
        ran.append(when)

    with pytest.raises(BodyNotSerializableError):
        pay(object())
    assert ran == [] and _states(broker) == {}


def test_broker_down_at_half_send_means_the_function_does_not_run(factory) -> None:
    producer = Producer(BrokerClient(f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=1), "shop")
    ran = []

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)

    with pytest.raises(BrokerUnavailable):
        pay("o1")
    assert ran == []
    with factory() as session:
        assert session.execute(select(transaction_log)).all() == []


def test_broker_down_at_end_transaction_still_succeeds_and_warns(factory, broker, caplog) -> None:
    class FailingEnd:
        """The real broker, whose END_TRANSACTION link drops (the network, not the broker)."""

        def __getattr__(self, name):
            return getattr(broker, name)

        def end_transaction(self, *args, **kwargs):
            raise BrokerUnavailableError("connection reset")

    producer = Producer(FailingEnd(), "shop")  # type: ignore[arg-type]

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> str:
        session.execute(orders.insert().values(id=order_id, amount=5))
        return order_id

    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert pay("o1") == "o1"
    assert "check-back will resolve it" in caplog.text
    assert list(_states(broker).values()) == [TransactionState.PENDING]


def test_session_hook_sends_several_messages_in_one_transaction(factory, broker) -> None:
    producer = Producer(broker, "shop")
    install(factory, producer)
    with factory() as session, session.begin():
        tx_a = send(session, json_message("order.paid", {"n": 1}))
        tx_b = send(session, json_message("order.shipped", {"n": 1}))
        assert tx_a == tx_b
    assert list(_states(broker).values()) == [TransactionState.COMMITTED]
    assert len(broker.receive("g", "order.paid", wait_s=1)) == 1
    assert len(broker.receive("g", "order.shipped", wait_s=1)) == 1


def test_session_rollback_sends_rollback(factory, broker) -> None:
    install(factory, Producer(broker, "shop"))
    with factory() as session:
        session.begin()
        send(session, Message("order.paid", b"x"))
        session.rollback()
    assert list(_states(broker).values()) == [TransactionState.ROLLED_BACK]


def test_first_message_inside_a_savepoint_is_refused(factory, broker) -> None:
    install(factory, Producer(broker, "shop"))
    with factory() as session, session.begin():
        savepoint = session.begin_nested()
        with pytest.raises(SavepointError):
            send(session, Message("order.paid", b"first inside a savepoint"))
        savepoint.rollback()
    assert _states(broker) == {}


def test_released_savepoint_keeps_its_messages(factory, broker) -> None:
    install(factory, Producer(broker, "shop"))
    with factory() as session, session.begin():
        send(session, Message("order.paid", b"outer"))
        with session.begin_nested():
            send(session, Message("order.paid", b"inner, released"))
        failed = session.begin_nested()  # a savepoint that sent nothing may roll back freely
        failed.rollback()
    bodies = sorted(r.message.body for r in broker.receive("g", "order.paid", max_messages=10, wait_s=1))
    assert bodies == [b"inner, released", b"outer"]
    assert list(_states(broker).values()) == [TransactionState.COMMITTED]


@pytest.mark.parametrize("depth", [1, 2])
def test_rolled_back_savepoint_that_sent_poisons_the_commit(factory, broker, depth: int) -> None:
    install(factory, Producer(broker, "shop"))
    with factory() as session:
        with pytest.raises(SavepointError, match="rolled back"):
            with session.begin():
                send(session, Message("order.paid", b"outer"))
                session.execute(orders.insert().values(id="o1", amount=1))
                outer_savepoint = session.begin_nested()
                if depth == 2:  # released into a savepoint that then rolls back
                    with session.begin_nested():
                        send(session, Message("order.paid", b"inner"))
                else:
                    send(session, Message("order.paid", b"inner"))
                outer_savepoint.rollback()
    assert list(_states(broker).values()) == [TransactionState.ROLLED_BACK]
    assert broker.receive("g", "order.paid", max_messages=10, wait_s=0.5) == []
    with factory() as session:
        assert session.execute(select(orders)).all() == []
        assert session.execute(select(transaction_log)).all() == []


def test_oneway_end_returns_after_the_commit_and_flush_settles_it(factory, broker) -> None:
    producer = Producer(broker, "shop", oneway_end=True)

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> str:
        session.execute(orders.insert().values(id=order_id, amount=3))
        return order_id

    @transactional_message(producer, factory, topic="order.paid")
    def refuse(session: Session, order_id: str) -> None:
        raise ValueError("refused")

    assert pay("o1") == "o1"
    with pytest.raises(ValueError):
        refuse("o2")
    assert producer.flush(30)
    assert sorted(s.value for s in _states(broker).values()) == sorted(
        [TransactionState.COMMITTED.value, TransactionState.ROLLED_BACK.value])
    assert [message_json(r.message) for r in broker.receive("points", "order.paid", wait_s=2)] == [
        {"order_id": "o1"}]
    producer.close()


def test_database_unreachable_after_the_half_message_sends_rollback(broker) -> None:
    from sqlalchemy import create_engine

    unreachable = sessionmaker(create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"))
    ran = []

    @transactional_message(Producer(broker, "shop"), unreachable, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)

    with pytest.raises(OperationalError):
        pay("o1")
    assert ran == []
    assert list(_states(broker).values()) == [TransactionState.ROLLED_BACK]


def test_fenced_transaction_fails_cleanly_and_sends_rollback(factory, broker, monkeypatch) -> None:
    from outbox import TransactionFencedError, check_transaction

    monkeypatch.setattr("outbox.integrations.sqlalchemy.session.new_transaction_id", lambda: "tx-fenced")
    # The check-back arrived before the local transaction began: the fence wins.
    assert check_transaction(factory.kw["bind"], "tx-fenced", "shop").name == "ROLLBACK"
    ran = []

    @transactional_message(Producer(broker, "shop"), factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    with pytest.raises(TransactionFencedError, match="fenced"):
        pay("o1")
    assert ran == []
    assert _states(broker) == {"tx-fenced": TransactionState.ROLLED_BACK}
    with factory() as session:
        assert session.execute(select(orders)).all() == []
        assert session.execute(select(transaction_log.c.state)).scalars().all() == ["ROLLED_BACK"]


def test_decorator_sets_keys_tag_and_message_group(factory, broker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, factory, topic="order.paid", tag="paid",
                           body=lambda order_id, amount: {"id": order_id},
                           keys=lambda order_id, amount: [order_id, f"amount-{amount}"],
                           message_group=lambda order_id, amount: f"user-{order_id}")
    def pay(session: Session, order_id: str, amount: int) -> None:
        session.execute(orders.insert().values(id=order_id, amount=amount))

    @transactional_message(producer, factory, topic="order.refunded", keys=["refunds"])
    def refund(session: Session, order_id: str) -> None:
        pass

    pay("o1", amount=5)
    refund("o1")
    (paid,) = broker.receive("g", "order.paid", wait_s=2)
    assert (paid.message.keys, paid.message.tag, paid.message.message_group) == (
        ("o1", "amount-5"), "paid", "user-o1")
    assert message_json(paid.message) == {"id": "o1"}
    (refunded,) = broker.receive("g", "order.refunded", wait_s=2)
    assert refunded.message.keys == ("refunds",)


def test_delayed_transactional_message_is_delivered_after_commit(factory, broker) -> None:
    """RocketMQ 4.5.2 lost delayed transactional messages; here the delay starts at commit."""

    @transactional_message(Producer(broker, "shop"), factory, topic="order.remind", delay_level=1)
    def remind(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=0))

    remind("o1")
    assert list(_states(broker).values()) == [TransactionState.COMMITTED]
    received = []
    for _ in range(40):
        received += broker.receive("g", "order.remind", wait_s=0.5)
        if received:
            break
    assert [message_json(r.message) for r in received] == [{"order_id": "o1"}]


def test_closing_a_session_mid_transaction_sends_rollback_and_forgets_the_id(factory, broker) -> None:
    install(factory, Producer(broker, "shop"))
    session = factory()
    session.begin()
    first = send(session, Message("order.paid", b"abandoned"))
    session.close()  # no commit, no explicit rollback
    assert _states(broker) == {first: TransactionState.ROLLED_BACK}
    with session.begin():
        second = send(session, Message("order.paid", b"next"))
    assert second != first
    assert _states(broker)[second] is TransactionState.COMMITTED
    assert [r.message.body for r in broker.receive("g", "order.paid", max_messages=10, wait_s=1)] == [b"next"]
    session.close()


def test_decorator_sends_ordinary_values_and_takes_an_encoder(factory, broker) -> None:
    import datetime
    import json
    import uuid
    from decimal import Decimal

    producer = Producer(broker, "shop")
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

    @transactional_message(producer, factory, topic="order.paid")
    def pay(session: Session, order_id: uuid.UUID, amount: Decimal, at: datetime.datetime) -> None:
        session.execute(orders.insert().values(id=str(order_id)[:32], amount=int(amount)))

    class Cents(json.JSONEncoder):
        def default(self, o: object) -> object:
            return int(o * 100) if isinstance(o, Decimal) else super().default(o)

    @transactional_message(producer, factory, topic="order.refunded", encoder=Cents,
                           properties={"source": "shop"})
    def refund(session: Session, amount: Decimal) -> None:
        pass

    order_id = uuid.UUID(int=7)
    pay(order_id, Decimal("12.50"), when)
    refund(Decimal("1.25"))
    (paid,) = broker.receive("g", "order.paid", wait_s=2)
    assert message_json(paid.message) == {"order_id": str(order_id), "amount": "12.50",
                                          "at": "2026-01-02T03:04:05+00:00"}
    (refunded,) = broker.receive("g", "order.refunded", wait_s=2)
    assert message_json(refunded.message) == {"amount": 125}
    assert dict(refunded.message.properties) == {"source": "shop"}
    with pytest.raises(BodyNotSerializableError):
        refund({"not", "json"})


def test_decorator_sets_fixed_group_and_properties_and_current_transaction_id(factory, broker) -> None:
    from outbox import current_transaction_id

    producer = Producer(broker, "shop")
    seen: list[tuple[str | None, str | None]] = []

    @transactional_message(producer, factory, topic="order.paid", message_group="orders",
                           properties=lambda order_id: {"order": order_id})
    def pay(session: Session, order_id: str) -> None:
        seen.append((current_transaction_id(), current_transaction_id(session)))

    assert current_transaction_id() is None
    pay("o1")
    (paid,) = broker.receive("g", "order.paid", wait_s=2)
    assert paid.message.message_group == "orders" and dict(paid.message.properties) == {"order": "o1"}
    assert seen == [(paid.transaction_id, paid.transaction_id)]
    assert current_transaction_id() is None


def test_transaction_timeout_brings_the_first_check_back_forward(factory, broker) -> None:
    """The broker's own first check is an hour away (conftest); the message asks for 0.2 s."""
    import threading

    checked = threading.Event()
    broker.register_producer("shop", lambda request: checked.set())

    class DroppedEnd:
        def __getattr__(self, name):
            return getattr(broker, name)

        def end_transaction(self, *args, **kwargs):
            raise BrokerUnavailableError("connection reset")

    @transactional_message(Producer(DroppedEnd(), "shop"), factory, topic="order.paid",  # type: ignore[arg-type]
                           transaction_timeout_s=0.2)
    def pay(session: Session, order_id: str) -> None:
        pass

    pay("o1")
    assert checked.wait(60)


def test_a_message_from_unusable_arguments_is_refused_before_anything(factory, broker) -> None:
    from broker_embedded.errors import InvalidMessageError

    ran = []

    @transactional_message(Producer(broker, "shop"), factory, topic="order.paid",
                           keys=lambda order_id: [order_id])
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)

    with pytest.raises(InvalidMessageError):
        pay("two words")
    assert ran == [] and _states(broker) == {}
