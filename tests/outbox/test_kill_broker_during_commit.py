"""SIGKILL the broker server 0-20 ms into END_TRANSACTION, after the order's DB commit.

Each order is one ``@transactional_message`` call on PostgreSQL sending three messages
with 3 MiB bodies (one by the decorator, two with ``outbox.send``); every fourth order
raises, so its transaction rolls back and END carries ROLLBACK. The DB commit (or
rollback) arms a SIGKILL of the broker server (``python -m broker_embedded serve``, a
fresh data dir per order) 0-20 ms later, while the producer's END is under way. The server
is restarted, a producer of the group answers check-backs from the fenced
transaction_log, and then: a committed order has all three messages readable exactly
once, a rolled-back order none.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import Message, Resolution, SendResult, TransactionState
from broker_embedded.errors import UnknownTransactionError
from outbox import Producer, check_transaction, send, transactional_message
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.session import current_transaction_id
from outbox.integrations.sqlalchemy.tables import COMMITTED, metadata, transaction_log
from outbox.messages import to_json_bytes
from outbox.producer import TRANSACTION_ID_PROPERTY

from ..broker.crashcut import describe, exactly_once, kill_delays, kill_later, visible, wait_until
from ..server.conftest import ServerProcess

GROUP = "shop"
TOPIC = "order.paid"
PAD = "x" * (3 * 1024 * 1024)
SEGMENT_SIZE = 5 * 1024 * 1024
#: Every kill delay of 0..20 ms about one and a half times. With the bug 3 of 18 committing
#: orders lost messages in a run of 24 (kills 10-12 ms after the DB commit); 0.8-2 s an order.
ORDERS = 32


class Failed(Exception):
    """Raised inside an order that must roll back."""


class KillOnTransactionEnd:
    """Session listener (run before the outbox's own): once armed, the next DB commit or
    rollback starts a SIGKILL of ``server`` ``delay_s`` later."""

    def __init__(self) -> None:
        self.armed: tuple[ServerProcess, float] | None = None
        self.killers: list[Any] = []

    def __call__(self, session: Session) -> None:
        if self.armed is not None:
            server, delay_s = self.armed
            self.armed = None
            self.killers.append(kill_later(server, delay_s))

    def join(self) -> None:
        for killer in self.killers:
            killer.join()
        self.killers.clear()


@pytest.fixture
def kill_on_end() -> Iterator[KillOnTransactionEnd]:
    listener = KillOnTransactionEnd()
    for name in ("after_commit", "after_rollback"):
        event.listen(Session, name, listener, insert=True)
    try:
        yield listener
    finally:
        listener.join()
        for name in ("after_commit", "after_rollback"):
            event.remove(Session, name, listener)


class FencedCheck:
    """Answers the group's check-backs from the fenced transaction_log."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def execute_local_transaction(self, message: Message, arg: Any) -> Resolution:
        raise NotImplementedError("only answers check-backs")

    def check_local_transaction(self, message: Message) -> Resolution:
        return check_transaction(self.engine, message.properties[TRANSACTION_ID_PROPERTY], GROUP)


class RecordingProducer(Producer):
    """A producer that remembers the ids of the half messages it sent."""

    def __init__(self, url: str) -> None:
        super().__init__(url, GROUP)
        self.sent: list[str] = []

    def start_half(self, message: Message, transaction_id: str) -> Future[SendResult]:
        self.sent.append(message.message_id)
        return super().start_half(message, transaction_id)


@dataclass
class Order:
    """What one order did: its transaction, its messages, and whether it should commit."""

    order_id: str
    transaction_id: str = ""
    message_ids: tuple[str, ...] = ()
    fails: bool = False


def place_order(producer: RecordingProducer, factory: sessionmaker[Session], order: Order) -> None:
    """The app's code: three messages in one DB transaction, rolled back if the order fails."""

    @transactional_message(producer, factory, topic=TOPIC,
                           body=lambda order_id: {"order_id": order_id, "part": 1, "pad": PAD})
    def pay(session: Session, order_id: str) -> None:
        for part in (2, 3):
            send(session, Message(TOPIC, to_json_bytes({"order_id": order_id, "part": part, "pad": PAD})))
        order.transaction_id = current_transaction_id(session) or ""
        order.message_ids = tuple(producer.sent)
        if order.fails:
            raise Failed(order_id)

    try:
        pay(order.order_id)
    except Failed:
        pass


def run_order(tmp_path: Path, engine: Engine, kill_on_end: KillOnTransactionEnd, order: Order,
              delay_s: float) -> str | None:
    """One order with a kill during its END; a description of a violation, or None."""
    data = tmp_path / f"broker-{order.order_id}"
    server = ServerProcess(data, "--segment-size", str(SEGMENT_SIZE), "--transaction-timeout", "0.5",
                           "--check-interval", "0.5", "--log-level", "WARNING")
    factory = sessionmaker(engine)
    try:
        server.start()
        producer = RecordingProducer(server.url)
        try:
            kill_on_end.armed = (server, delay_s)
            place_order(producer, factory, order)
            kill_on_end.join()
        finally:
            producer.close()
        server.start()
        checker = Producer(server.url, GROUP)
        try:
            checker.register_check_listener(FencedCheck(engine))
            client = checker.broker

            def broker_state() -> TransactionState | None:
                """None: the broker stored none of its half messages (an order that raised
                rolls back without waiting for them, so the kill may come first)."""
                try:
                    return client.transaction_state(order.transaction_id)
                except UnknownTransactionError:
                    return None

            if not wait_until(lambda: broker_state() is not TransactionState.PENDING, 30):
                return "still PENDING 30 s after the restart"
            state = broker_state()
            seen = visible(client, TOPIC)
        finally:
            checker.close()
        with engine.connect() as conn:
            db_state = conn.execute(select(transaction_log.c.state).where(
                transaction_log.c.transaction_id == order.transaction_id)).scalar_one_or_none()
        committed = db_state == COMMITTED
        if committed == order.fails:
            return f"the DB says {db_state} for an order that {'fails' if order.fails else 'commits'}"
        wanted = order.message_ids if committed else ()
        if (state is TransactionState.COMMITTED) != committed or not exactly_once(seen, wanted):
            return (f"DB {db_state}, broker {state.name if state else 'without the transaction'}, {describe(seen, list(order.message_ids))} "
                    f"readable ({'3 messages, each once' if committed else 'none'} expected)")
        return None
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.postgres
def test_broker_killed_during_end_loses_no_message_of_a_committed_order(
    tmp_path: Path, postgres_url: str, kill_on_end: KillOnTransactionEnd,
) -> None:
    engine = create_engine(postgres_url)
    metadata.create_all(engine)
    try:
        problems = []
        for n, delay_s in enumerate(kill_delays(ORDERS)):
            order = Order(f"o{n}", fails=n % 4 == 3)
            problem = run_order(tmp_path, engine, kill_on_end, order, delay_s)
            if problem is not None:
                problems.append(f"{order.order_id} (killed after {delay_s * 1000:.0f} ms): {problem}")
    finally:
        engine.dispose()
    committed = sum(1 for n in range(ORDERS) if n % 4 != 3)
    assert not problems, (f"{len(problems)} of {ORDERS} orders ({committed} of them committing) "
                          "broke atomicity:\n  " + "\n  ".join(problems))
