"""A database without the framework tables: one typed error that says what to run,
instead of the driver's "no such table" (SQLite) or UndefinedTable (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import Message, TransactionState
from broker_embedded.broker.export import transaction_states
from outbox import (
    Producer,
    SchemaMissingError,
    check_transaction,
    idempotent_consumer,
    transactional_message,
)
from outbox.integrations.sqlalchemy.engine import create_engine


@pytest.fixture
def bare_engine(db_url: str) -> Iterator[Engine]:
    engine = create_engine(db_url)  # no outbox migrate
    yield engine
    engine.dispose()


def test_the_producer_insert_names_the_migration(bare_engine, broker) -> None:
    ran = []

    @transactional_message(Producer(broker, "shop"), sessionmaker(bare_engine), topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)

    with pytest.raises(SchemaMissingError, match="outbox_transaction_log does not exist in .*: run `outbox migrate "
                                                 "--database-url URL`") as caught:
        pay("o1")
    assert "\n" not in str(caught.value) and ran == []
    assert [state for state, _ in transaction_states(broker).values()] == [TransactionState.ROLLED_BACK]


def test_the_check_names_the_migration(bare_engine) -> None:
    with pytest.raises(SchemaMissingError, match="outbox_transaction_log does not exist"):
        check_transaction(bare_engine, "tx-1", "shop", lock_timeout_ms=200)


def test_the_idempotent_consumer_names_the_migration(bare_engine, broker) -> None:
    broker.send(Message("order.paid", b"{}"))
    (received,) = broker.receive("member", "order.paid", wait_s=2)
    handled = []

    @idempotent_consumer("member", sessionmaker(bare_engine))
    def award(session: Session, message) -> None:
        handled.append(message)

    with pytest.raises(SchemaMissingError, match="outbox_consumed_message does not exist"):
        award(received)
    assert handled == []
