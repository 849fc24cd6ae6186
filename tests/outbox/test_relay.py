"""The relay over a real broker server process and real databases: orders keep succeeding
while the broker is SIGKILLed, and once it is back the relay hands every stored message
over; a fresh consumer group reads each committed order's message exactly once, and each
message group's messages are stored in the broker in the order the orders were placed.
Also: a transaction the broker refuses holds back its message group only; two relays at
once (PostgreSQL); ``outbox relay`` SIGKILLed at random points, then run again.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient, Message, Resolution
from outbox import Producer, json_message, message_json, transactional_message
from outbox.integrations.sqlalchemy.recorder import RECORDER
from outbox.integrations.sqlalchemy.relay import backlog, relay
from outbox.integrations.sqlalchemy.tables import stored_message
from outbox.relay import relay_task, run_relays
from outbox.stored import store_messages
from tests.ports import free_port

from ..server.conftest import ServerProcess

pytestmark = pytest.mark.skipif(not hasattr(BrokerClient, "relay_committed"), reason="needs relay_committed")

ROOT = Path(__file__).resolve().parents[2]
GROUP = "shop"
TOPIC = "order.paid"

shop = MetaData()
orders = Table("relay_orders", shop, Column("n", Integer, primary_key=True))

Pay = Callable[[int], int]


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    shop.create_all(engine)
    return sessionmaker(engine)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "broker")
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


def paying(producer: Producer, factory: sessionmaker[Session], groups: int = 3) -> Pay:
    """``pay(n)``: order ``n`` and its message ``{"n": n}`` in message group ``c{n % groups}``."""

    @transactional_message(producer, factory, topic=TOPIC, message_group=lambda n: f"c{n % groups}")
    def pay(session: Session, n: int) -> int:
        session.execute(orders.insert().values(n=n))
        return n

    return pay


def store_while_down(factory: sessionmaker[Session], numbers: range, groups: int = 3) -> None:
    """Orders placed while no broker listens: each stores its message."""
    producer = Producer(f"tcp://127.0.0.1:{free_port()}", GROUP, on_broker_down="store")
    pay = paying(producer, factory, groups)
    for n in numbers:
        pay(n)
    producer.close()


def relay_all(engine: Engine, url: str, timeout_s: float = 30) -> None:
    """Relay passes until no stored message waits."""
    with BrokerClient(url) as client:
        relaying = relay(engine, client, batch_size=5)
        deadline = time.monotonic() + timeout_s
        while backlog(engine):
            assert time.monotonic() < deadline, backlog(engine)
            relaying.relay_once()


def consumed(url: str) -> list[Message]:
    """What a fresh consumer group receives from the topic (acknowledged as it goes)."""
    received: list[Message] = []
    with BrokerClient(url) as client:
        while batch := client.receive("points", TOPIC, max_messages=64, wait_s=1.0):
            received += [r.message for r in batch]
            client.ack_many("points", [r.receipt_handle for r in batch])
    return received


def assert_exactly_once_in_group_order(url: str, numbers: range) -> None:
    counts = Counter(message_json(message)["n"] for message in consumed(url))
    assert counts == Counter(numbers)
    by_group: dict[str | None, list[int]] = {}
    with BrokerClient(url) as client:
        (info,) = [topic for topic in client.list_topics() if topic.name == TOPIC]
        for queue in range(info.queues):
            offset = 0
            while batch := client.read(TOPIC, queue, offset, 64):
                offset += len(batch)
                for stored in batch:
                    by_group.setdefault(stored.message.message_group, []).append(message_json(stored.message)["n"])
    for group, ns in by_group.items():
        assert ns == sorted(ns), f"message group {group} out of order: {ns}"


@pytest.mark.slow
def test_orders_succeed_through_a_broker_kill_and_the_relay_delivers_each_message_once(
        engine: Engine, factory: sessionmaker[Session], server: ServerProcess) -> None:
    server.start()
    producer = Producer(server.url, GROUP, on_broker_down="store")
    pay = paying(producer, factory)
    for n in range(6):  # sent as half messages
        pay(n)
    producer.flush()
    server.kill()
    for n in range(6, 18):  # stored
        assert pay(n) == n
    server.start()
    time.sleep(1.0)  # past the producer's back-off: it asks the broker again
    for n in range(18, 24):  # their groups' stored messages wait: stored behind them
        pay(n)
    assert [b.unrelayed for b in backlog(engine)] == [18]

    relay_all(engine, server.url)
    for n in range(24, 30):  # the groups are drained: half messages again
        pay(n)
    producer.close()
    assert_exactly_once_in_group_order(server.url, range(30))
    with factory() as session:
        assert session.execute(select(orders.c.n).order_by(orders.c.n)).scalars().all() == list(range(30))
        assert len(session.execute(select(stored_message.c.seq)).all()) == 18


def test_a_transaction_the_broker_refuses_holds_back_its_message_group_only(
        engine: Engine, factory: sessionmaker[Session], server: ServerProcess) -> None:
    """A stored transaction the broker knows as rolled back: its group's later messages
    wait behind it, another group's go."""
    server.start()
    with BrokerClient(server.url) as client:
        client.send_half(json_message(TOPIC, {"n": -1}), producer_group=GROUP, transaction_id="refused")
        client.end_transaction("refused", Resolution.ROLLBACK, producer_group=GROUP)
    with factory.begin() as session:
        execute, sql = RECORDER.statements(session)
        store_messages(execute, sql, "refused", GROUP, [json_message(TOPIC, {"n": -1}, message_group="c0")])
    store_while_down(factory, range(4), groups=2)  # c0, c1, c0, c1

    with BrokerClient(server.url) as client:
        assert relay(engine, client).relay_once() == 2
    assert sorted(message_json(m)["n"] for m in consumed(server.url)) == [1, 3]
    with factory() as session:
        waiting = session.execute(select(stored_message.c.message_group).where(
            stored_message.c.relayed_at.is_(None))).scalars().all()
    assert waiting == ["c0", "c0", "c0"]


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_relays_at_once_hand_over_each_message_once_in_group_order(
        engine: Engine, factory: sessionmaker[Session], server: ServerProcess) -> None:
    store_while_down(factory, range(60), groups=4)
    server.start()
    stop = threading.Event()
    clients = [BrokerClient(server.url) for _ in range(2)]
    threads = [threading.Thread(target=run_relays, args=([relay(engine, client, batch_size=4)], stop, 0.05))
               for client in clients]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while backlog(engine):
            assert time.monotonic() < deadline, backlog(engine)
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for client in clients:
            client.close()
    assert_exactly_once_in_group_order(server.url, range(60))


def test_relay_task_relays_on_an_event_loop_until_cancelled(
        engine: Engine, factory: sessionmaker[Session], server: ServerProcess) -> None:
    store_while_down(factory, range(5))
    server.start()

    async def main() -> None:
        with BrokerClient(server.url) as client:
            task = asyncio.create_task(relay_task([relay(engine, client)], idle_s=0.05))
            while await asyncio.to_thread(backlog, engine):
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert_exactly_once_in_group_order(server.url, range(5))


def unrelayed(engine: Engine) -> int:
    return sum(group.unrelayed for group in backlog(engine))


def depth(client: BrokerClient) -> int:
    """How many messages the topic holds (0 before the first)."""
    return sum(sum(topic.depth) for topic in client.list_topics() if topic.name == TOPIC)


@pytest.mark.slow
def test_outbox_relay_killed_at_random_points_then_run_again(
        engine: Engine, factory: sessionmaker[Session], server: ServerProcess, db_url: str) -> None:
    """``outbox relay`` SIGKILLed 0-30 ms after the broker was seen receiving from it, up
    to four times; then run until nothing waits, and stopped with SIGTERM (exit 0)."""
    store_while_down(factory, range(90))
    server.start()
    command = [sys.executable, "-m", "outbox", "relay", "--database-url", db_url, "--broker-url", server.url,
               "--batch-size", "1", "--idle-s", "0.1"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(25)
    with BrokerClient(server.url) as client:
        for _ in range(4):
            before = depth(client)
            if before == 90:
                break
            proc = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while depth(client) == before and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.03))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    proc = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None and "relaying" in proc.stdout.readline()  # its signal handlers are set
        deadline = time.monotonic() + 30
        while unrelayed(engine):
            assert time.monotonic() < deadline, backlog(engine)
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, output
    assert_exactly_once_in_group_order(server.url, range(90))
