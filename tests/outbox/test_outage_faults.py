"""Issue 25's fault test: the broker SIGKILLed and kept down, several times, while producers in
store mode keep calling and are SIGKILLed themselves, and relays are SIGKILLed too.

Processes, all real: the broker server (Celery checker), a Celery worker answering check-backs
from PostgreSQL, two producers (``@transactional_message`` on SQLAlchemy with
``Producer(on_broker_down="store")``, each writing an order row per call in three message
groups of its own), two ``outbox relay`` processes. Each cycle: the broker up for a few
seconds, then SIGKILLed and kept down (``HALFMOON_OUTAGE_DOWN_S``, 12 s by default: the
producers' probe ends their outage within a second of the broker's return, so a longer
outage adds only stored calls; set 30 or more for a soak) while one
producer and one relay are SIGKILLed at random moments and restarted; then the broker
restarts on the same data. After the last cycle the producers stop, the relays drain the
table and the check-backs settle. Then:

* every committed order's message is in the broker exactly once, and none for an order that
  did not commit (the broker's queues read from their start);
* no call failed (store mode takes the broker's absence);
* per message group, every message that went through the table precedes in the broker every
  later message of its group (a call waits behind its group's stored messages).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from broker_embedded import BrokerClient, BrokerError
from outbox.integrations.sqlalchemy.tables import metadata, stored_message
from outbox.stored import decode

from ..server.conftest import ServerProcess

TOPIC = "order.paid"
DOWN_S = float(os.environ.get("HALFMOON_OUTAGE_DOWN_S", "12"))
CYCLES = int(os.environ.get("HALFMOON_OUTAGE_CYCLES", "3"))

PRODUCER = r"""
import os, random, sys, time
from sqlalchemy import Column, Integer, MetaData, String, Table, UniqueConstraint, func, select
from sqlalchemy.orm import sessionmaker
from outbox import Producer, transactional_message
from outbox.integrations.sqlalchemy.engine import create_engine

me = os.environ["PRODUCER_ID"]
engine = create_engine(os.environ["OUTBOX_DATABASE_URL"], pool_size=2)
orders = Table("fault_orders", MetaData(), Column("producer", String(8), primary_key=True),
               Column("grp", String(8), primary_key=True), Column("n", Integer, primary_key=True))
factory = sessionmaker(engine)
producer = Producer(os.environ["OUTBOX_BROKER_URL"], "shop", on_broker_down="store")

@transactional_message(producer, factory, topic="order.paid",
                       message_group=lambda producer, grp, n: f"{producer}-{grp}")
def pay(session, producer, grp, n):
    session.execute(orders.insert().values(producer=producer, grp=grp, n=n))

groups = ["a", "b", "c"]
with engine.connect() as conn:
    last = {g: conn.execute(select(func.coalesce(func.max(orders.c.n), 0)).where(
        orders.c.producer == me, orders.c.grp == g)).scalar_one() for g in groups}
stop = os.environ["STOP_FILE"]
while not os.path.exists(stop):
    grp = random.choice(groups)
    try:
        pay(me, grp, last[grp] + 1)
    except Exception as exc:
        print(f"FAILED {type(exc).__name__}: {exc}", flush=True)
        time.sleep(0.05)
        continue
    last[grp] += 1
    time.sleep(random.uniform(0, 0.02))
print("STOPPED", flush=True)
"""


class Children:
    """The producers and relays, restartable, each with its log."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, tuple[list[str], dict[str, str]]] = {}

    def add(self, name: str, argv: list[str], **env: str) -> None:
        self.argv[name] = (argv, {**self.env, **env})
        self.start(name)

    def start(self, name: str) -> None:
        argv, env = self.argv[name]
        with (self.work / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill_and_restart(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        time.sleep(0.3)
        self.start(name)

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def end(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _read_topic(client: BrokerClient, topic: str) -> list[list[dict[str, object]]]:
    """Each queue of ``topic`` from its start, in the broker's order: the message bodies with their ids."""
    queues = []
    for info in client.list_topics():
        if info.name != topic:
            continue
        for queue_id in range(info.queues):
            messages: list[dict[str, object]] = []
            while batch := client.read(topic, queue_id, len(messages), 64):
                messages += [{**json.loads(m.message.body), "id": m.message.message_id} for m in batch]
            queues.append(messages)
    return queues


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except BrokerError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.postgres
def test_outages_lose_nothing_double_nothing_and_keep_group_order(tmp_path: Path, postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE fault_orders (producer varchar(8), grp varchar(8), n integer, "
                          "PRIMARY KEY (producer, grp, n))"))
    stop_file = tmp_path / "stop"
    env = {**os.environ, "OUTBOX_DATABASE_URL": postgres_url, "OUTBOX_CELERY_BROKER_URL": "filesystem://",
           "OUTBOX_CELERY_DATA_DIR": str(tmp_path / "celery"), "PYTHONUNBUFFERED": "1",
           "STOP_FILE": str(stop_file)}
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "2", "--check-interval", "1",
                           "--checker", "outbox.integrations.celery.checker:make_checker")
    env["OUTBOX_BROKER_URL"] = server.url
    children = Children(tmp_path, env)
    saved_env = dict(os.environ)
    os.environ.update(env)  # the server process inherits the Celery settings
    rng = random.Random(25)
    try:
        server.start()
        children.add("worker", [sys.executable, "-m", "celery", "-A", "outbox.integrations.celery.worker", "worker",
                                "-Q", "outbox.check.shop", "--pool", "threads", "-c", "2", "--loglevel", "INFO"])
        for number in (1, 2):
            children.add(f"producer-{number}", [sys.executable, "-c", PRODUCER], PRODUCER_ID=f"p{number}")
            children.add(f"relay-{number}", [sys.executable, "-m", "outbox", "relay", "--database-url",
                                             postgres_url, "--broker-url", server.url])
        for _cycle in range(CYCLES):
            time.sleep(4)
            server.kill()
            down_until = time.monotonic() + DOWN_S
            strikes = sorted(rng.uniform(1, DOWN_S - 1) for _ in range(2))
            for at, name in zip(strikes, (f"producer-{rng.randint(1, 2)}", f"relay-{rng.randint(1, 2)}"),
                                strict=True):
                time.sleep(max(0.0, down_until - DOWN_S + at - time.monotonic()))
                children.kill_and_restart(name)
            time.sleep(max(0.0, down_until - time.monotonic()))
            server.start()
        time.sleep(4)
        children.kill_and_restart(f"producer-{rng.randint(1, 2)}")  # with the broker up, too
        time.sleep(2)
        stop_file.touch()
        for number in (1, 2):
            children.procs[f"producer-{number}"].wait(60)

        with BrokerClient(server.url, timeout_s=10) as client:
            def settled() -> bool:
                with engine.connect() as conn:
                    waiting = conn.execute(select(func.count()).select_from(stored_message).where(
                        stored_message.c.relayed_at.is_(None))).scalar_one()
                return waiting == 0 and client.stats().pending_half == 0

            _wait(settled, 180, "the relays to drain the table and the check-backs to settle")
            queues = _read_topic(client, TOPIC)
        with engine.connect() as conn:
            committed = {(p, g, n) for p, g, n in conn.execute(text("SELECT producer, grp, n FROM fault_orders"))}
            stored_rows = [decode(bytes(row.message)) for row in conn.execute(select(stored_message.c.message))]
    finally:
        stop_file.touch()
        children.end()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        os.environ.clear()
        os.environ.update(saved_env)
        engine.dispose()

    for number in (1, 2):
        failures = [line for line in children.log(f"producer-{number}").splitlines() if line.startswith("FAILED")]
        assert not failures, failures[:5]
    in_broker = Counter((m["producer"], m["grp"], m["n"]) for queue in queues for m in queue)
    assert len(committed) > 100 and stored_rows, (len(committed), len(stored_rows))
    assert {key for key, copies in in_broker.items() if copies > 1} == set(), "duplicates in the broker"
    assert set(in_broker) - committed == set(), "phantoms: messages of orders that did not commit"
    assert committed - set(in_broker) == set(), "lost: committed orders without their message"
    stored_ids = {message.message_id for message in stored_rows}
    for queue in queues:
        for position, message in enumerate(queue):
            if message["id"] not in stored_ids:
                continue
            earlier_later = [m for m in queue[:position] if (m["producer"], m["grp"]) == (message["producer"],
                                                                                             message["grp"])
                             and int(m["n"]) > int(message["n"])]  # type: ignore[call-overload]
            assert not earlier_later, f"{message} went through the table but came after {earlier_later[:3]}"
