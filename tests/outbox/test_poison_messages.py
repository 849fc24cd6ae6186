"""A message the broker would refuse fails with a typed error before any database or
broker work: nothing to roll back, nothing stored that a restart could trip on."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import EmbeddedBroker
from broker_embedded.errors import InvalidMessageError
from outbox import Producer, transactional_message
from outbox.integrations.sqlalchemy.tables import transaction_log


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement the engine runs from now on."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def _nothing_happened(engine: Engine, broker: EmbeddedBroker, log_end: int, statements: list[str]) -> None:
    assert statements == [], "no database work"
    assert broker.store.commitlog.write_offset == log_end, "no broker write"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(transaction_log)).scalar() == 0


@pytest.mark.parametrize("timeout", [math.inf, math.nan, -1.0])
def test_an_unusable_transaction_timeout_fails_at_decoration(
    engine: Engine, broker: EmbeddedBroker, statements: list[str], timeout: float
) -> None:
    log_end = broker.store.commitlog.write_offset
    ran: list[str] = []
    with pytest.raises(InvalidMessageError, match="transaction_timeout_s"):
        @transactional_message(Producer(broker, "shop"), sessionmaker(engine), topic="order.paid",
                               transaction_timeout_s=timeout)
        def pay(session: Session, order_id: str) -> None:
            ran.append(order_id)

        pay("o-1")
    assert ran == []
    _nothing_happened(engine, broker, log_end, statements)


@pytest.mark.parametrize("keys", [lambda order_id: ["k" * 200], lambda order_id: [order_id]])
def test_a_message_built_from_unusable_arguments_fails_before_the_transaction(
    engine: Engine, broker: EmbeddedBroker, statements: list[str], keys: Callable[[str], list[str]]
) -> None:
    ran: list[str] = []

    @transactional_message(Producer(broker, "shop"), sessionmaker(engine), topic="order.paid", keys=keys)
    def pay(session: Session, order_id: str) -> None:
        ran.append(order_id)

    log_end = broker.store.commitlog.write_offset
    with pytest.raises(InvalidMessageError):
        pay("order one")
    assert ran == []
    _nothing_happened(engine, broker, log_end, statements)
