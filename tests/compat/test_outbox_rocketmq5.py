"""The outbox on ``rocketmq5://``: the official Python client against our own
``serve --grpc-port`` process (and against a real RocketMQ 5 cluster when
``HALFMOON_RMQ_ENDPOINTS`` names its proxy; its topic ``HALFMOON_RMQ_TOPIC`` must be a
TRANSACTION topic): multi-message commit, rollback, a producer SIGKILLed after its DB commit
settled by the fenced check-back in another process, the idempotent consumer."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import Message, Resolution, TransactionState, connect
from broker_embedded.client.rocketmq5 import TRANSACTION_PROPERTY, RocketMQ5Broker
from broker_embedded.errors import InvalidMessageError, UnknownReceiptError, UnsupportedError
from outbox import Producer, install, json_message, message_json, send
from outbox.integrations.sqlalchemy.check_back import answer_check_backs, fence_answer
from outbox.integrations.sqlalchemy.consumer import idempotent_consumer
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.tables import metadata, transaction_log
from outbox.settings import OutboxSettings

from .conftest import GrpcBroker, eventually

#: A producer sending two messages in one outbox transaction that SIGKILLs itself after its DB
#: commit (before COMMIT reaches the broker) or before it (after the half messages).
PRODUCER = r"""
import os, signal
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker
from outbox import Producer, install, json_message, send
from outbox.integrations.sqlalchemy.engine import create_engine

def die(session):
    print(transaction_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if os.environ["CRASH"] == "after_commit":
    event.listen(Session, "after_commit", die)  # before the outbox's own listener: COMMIT is not sent
factory = sessionmaker(create_engine(os.environ["OUTBOX_DATABASE_URL"]))
install(factory, Producer(os.environ["OUTBOX_BROKER_URL"], "shop"))
with factory.begin() as session:
    for n in (1, 2):
        transaction_id = send(session, json_message(os.environ["TOPIC"], {"order_id": "o1", "n": n}))
    if os.environ["CRASH"] == "before_commit":
        die(session)
"""


@pytest.fixture(params=["serve --grpc-port", "cluster"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the ``rocketmq5://`` URL, a topic for the test)."""
    if request.param == "cluster":
        endpoints = os.environ.get("HALFMOON_RMQ_ENDPOINTS")
        if not endpoints:
            pytest.skip("HALFMOON_RMQ_ENDPOINTS (a RocketMQ 5 proxy, host:port) is not set")
        return f"rocketmq5://{endpoints}", os.environ.get("HALFMOON_RMQ_TOPIC", "halfmoon_outbox")
    grpc_broker: GrpcBroker = request.getfixturevalue("grpc_broker")
    return f"rocketmq5://{grpc_broker.endpoint}", f"outbox-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(url)
    metadata.create_all(engine)
    yield url
    engine.dispose()


def _drain(broker: RocketMQ5Broker, group: str, topic: str, count: int, within_s: float = 20) -> list[bytes]:
    """Receive and ack until ``count`` bodies came (bounded), then one more empty poll."""
    bodies: list[bytes] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        batch = broker.receive(group, topic, wait_s=1, invisible_duration_s=20)
        for received in batch:
            bodies.append(received.message.body)
            broker.ack(group, received.receipt_handle)
        if len(bodies) >= count and not batch:
            break
    return bodies


def test_multi_message_transaction_commits_together_and_rollback_never(target: tuple[str, str], database: str) -> None:
    url, topic = target
    producer = Producer(url, "shop")
    assert isinstance(producer.broker, RocketMQ5Broker)
    factory = sessionmaker(create_engine(database))
    install(factory, producer)
    try:
        with factory.begin() as session:
            committed = send(session, json_message(topic, {"n": 1}))
            send(session, json_message(topic, {"n": 2}))
        with pytest.raises(ValueError), factory.begin() as session:
            send(session, json_message(topic, {"n": "rolled back"}))
            raise ValueError("the business rule failed")
        group = f"points-{uuid.uuid4().hex[:8]}"
        assert sorted(_drain(producer.broker, group, topic, 2)) == [b'{"n":1}', b'{"n":2}']
        with factory() as session:
            assert session.execute(select(transaction_log.c.transaction_id)).scalars().all() == [committed]
        # both broker transactions are ended already: a repeat is a no-op, as on every transport
        again = producer.broker.end_transaction(committed, Resolution.COMMIT, producer_group="shop")
        assert (again.state, again.applied, len(again.message_ids)) == (TransactionState.COMMITTED, False, 2)
    finally:
        producer.close()


@pytest.mark.parametrize(("crash", "resolution"), [("after_commit", Resolution.COMMIT),
                                                 ("before_commit", Resolution.ROLLBACK)])
def test_killed_producer_is_settled_by_the_fenced_check_back(grpc_broker: GrpcBroker, database: str, crash: str,
                                                             resolution: Resolution) -> None:
    """SIGKILLed after its DB commit: the check-backs of both broker transactions commit; before
    it: they roll back, nothing is delivered."""
    topic = f"paid-{uuid.uuid4().hex[:10]}"
    url = f"rocketmq5://{grpc_broker.endpoint}"
    env = {**os.environ, "OUTBOX_BROKER_URL": url, "OUTBOX_DATABASE_URL": database, "TOPIC": topic,
           "CRASH": crash, "HOME": tempfile.mkdtemp(prefix="rocketmq-client-home-")}
    crashed = subprocess.run([sys.executable, "-c", PRODUCER], env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr
    transaction_id = crashed.stdout.strip()

    # A long-running process of the group, publishing the topic, answers by the fence.
    checker = Producer(RocketMQ5Broker(url, topics=(topic,)), "shop")
    answers: list[tuple[str, Resolution]] = []
    fence = OutboxSettings(database_url=database)
    def recorded(transaction: str, group: str) -> Resolution:
        resolution = fence_answer(fence)(transaction, group)
        answers.append((transaction, resolution))
        return resolution

    answer_check_backs(checker, answer=recorded)
    try:
        assert eventually(lambda: len(answers) >= 2, within_s=30), (answers, transaction_id)
        assert answers[:2] == [(transaction_id, resolution)] * 2
        if resolution is Resolution.ROLLBACK:
            assert checker.broker.receive("points", topic, wait_s=2) == []
            return
        received = []
        eventually(lambda: received.extend(checker.broker.receive("points", topic, wait_s=1)) or len(received) >= 2)
        assert sorted(message_json(r.message)["n"] for r in received) == [1, 2]
        assert {r.transaction_id for r in received} == {transaction_id}
        assert {r.message.properties[TRANSACTION_PROPERTY] for r in received} == {transaction_id}
    finally:
        checker.close()


def test_idempotent_consumer_handles_a_redelivery_once(grpc_broker: GrpcBroker, database: str) -> None:
    topic = f"once-{uuid.uuid4().hex[:10]}"
    broker = connect(f"rocketmq5://{grpc_broker.endpoint}")
    assert isinstance(broker, RocketMQ5Broker)
    factory = sessionmaker(create_engine(database))
    handled: list[object] = []

    @idempotent_consumer("points", factory)
    def handle(session: Session, received: object) -> None:
        handled.append(received)

    try:
        broker.send(json_message(topic, {"order_id": "o7"}))
        first = eventually(lambda: broker.receive("points", topic, wait_s=1))
        assert handle(first[0]) is not False
        # Not acked: released at once, it comes back and the duplicate check skips it.
        released = broker.change_invisible_duration("points", first[0].receipt_handle, 1)
        with pytest.raises(UnknownReceiptError):
            broker.ack("points", first[0].receipt_handle)
        again = eventually(lambda: broker.receive("points", topic, wait_s=1))
        assert again[0].message.message_id == first[0].message.message_id and released
        assert handle(again[0]) is False
        broker.ack("points", again[0].receipt_handle)
        assert len(handled) == 1
    finally:
        broker.close()


def test_receive_with_a_tag_filter_and_a_changed_one(grpc_broker: GrpcBroker) -> None:
    """``filter_expression`` subscribes the client's SimpleConsumer; a new expression
    re-subscribes it; a malformed one is refused before any call."""
    topic = f"tags-{uuid.uuid4().hex[:10]}"
    broker = RocketMQ5Broker(f"rocketmq5://{grpc_broker.endpoint}")
    try:
        for tag in ("paid", "created"):
            broker.send(Message(topic, tag.encode(), tag=tag))
        paid = eventually(lambda: broker.receive("billing", topic, wait_s=1, filter_expression="paid"))
        assert [r.message.body for r in paid] == [b"paid"]
        broker.ack("billing", paid[0].receipt_handle)
        broker.send(Message(topic, b"created later", tag="created"))
        later = eventually(lambda: broker.receive("billing", topic, wait_s=1, filter_expression="created"))
        assert [r.message.body for r in later] == [b"created later"]  # the first was passed over
        with pytest.raises(InvalidMessageError, match="not a TAG expression"):
            broker.receive("billing", topic, filter_expression="paid ||")
    finally:
        broker.close()


def test_receive_with_an_sql92_filter(grpc_broker: GrpcBroker) -> None:
    """``filter_type="SQL92"`` subscribes the client's SimpleConsumer with an SQL filter;
    a malformed one is refused before any call."""
    topic = f"sql-{uuid.uuid4().hex[:10]}"
    broker = RocketMQ5Broker(f"rocketmq5://{grpc_broker.endpoint}")
    try:
        for amount in (3, 12):
            broker.send(Message(topic, f"{amount}".encode(), properties={"amount": str(amount)}))
        got = eventually(lambda: broker.receive("big", topic, wait_s=1, filter_expression="amount > 5",
                                                filter_type="SQL92"))
        assert [r.message.body for r in got] == [b"12"]
        with pytest.raises(InvalidMessageError, match="not a condition at position 0"):
            broker.receive("big", topic, filter_expression="amount", filter_type="SQL92")
    finally:
        broker.close()


def test_what_a_proxy_cannot_give_raises_unsupported(grpc_broker: GrpcBroker) -> None:
    broker = RocketMQ5Broker(f"rocketmq5://{grpc_broker.endpoint}")
    try:
        for call in (broker.list_parked, broker.open_transactions, broker.stats, lambda: broker.list_dlq("g"),
                     lambda: broker.transaction_state("t"), lambda: broker.query_by_id("m")):
            with pytest.raises(UnsupportedError, match="not available on a RocketMQ 5 proxy"):
                call()
    finally:
        broker.close()



def test_without_the_client_a_rocketmq5_url_names_the_extra() -> None:
    script = ("import sys; sys.modules['rocketmq'] = None\n"  # as if the client were not installed
              "from broker_embedded import connect\n"
              "try:\n    connect('rocketmq5://127.0.0.1:1')\nexcept ImportError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "pip install 'halfmoon[rocketmq5]'" in result.stdout, result.stderr
