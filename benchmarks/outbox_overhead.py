"""What ``@transactional_message`` costs on PostgreSQL, and how fast its messages arrive.

    ./dev bench outbox_overhead [--seconds 6] [--rounds 3] [--postgres postgresql://postgres@127.0.0.1:5432/test]
                                [--only sync|async]

In one run, on a fresh database and a broker server process:

* throughput: a bare local transaction (one insert + commit) against the same with
  ``@transactional_message``, with 1 and 8 concurrent clients, with END_TRANSACTION
  waited for (the default) and sent in the background (``Producer(oneway_end=True)``,
  RocketMQ's ``endTransactionOneway``);
* latency from the DB commit to the consumer's handler: ours (half message, COMMIT right
  after the commit) against a polling outbox relay in the style of django-outbox-pattern
  (outbox row in the transaction; a relay polls every 100 ms, publishes, deletes);
* asyncio (asyncpg, ``AsyncProducer``): a bare async transaction against the same with
  the async ``@transactional_message``, at 1 and 8 concurrent tasks, with the half
  message awaited before the transaction and overlapping it (``overlap=True``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
from _common import free_port, percentile, wait_port
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine, event, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient, Message
from outbox import AsyncProducer, Producer, message_json, transactional_message
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata

app = MetaData()
orders = Table("bench_orders", app, Column("id", String(40), primary_key=True), Column("amount", Integer))
relay_outbox = Table("bench_relay_outbox", app, Column("id", Integer, primary_key=True, autoincrement=True),
                     Column("order_id", String(40)), Column("committed_at", Float))


def run_clients(clients: int, seconds: float, call: Callable[[], None]) -> float:
    counts = [0] * clients
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


async def run_tasks(tasks: int, seconds: float, call: Callable[[], Awaitable[None]]) -> float:
    """``run_clients`` for coroutines: ``tasks`` concurrent tasks on one loop; calls per second."""
    counts = [0] * tasks
    stop = time.perf_counter() + seconds

    async def work(i: int) -> None:
        while time.perf_counter() < stop:
            await call()
            counts[i] += 1

    start = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(tasks)))
    return sum(counts) / (time.perf_counter() - start)


def print_rates(unit: str, rows: list[tuple[int, float, float, float]], second: str) -> None:
    """The throughput table: bare against decorated and against the ``second`` variant."""
    print(f"{unit:>8}{'bare tx/s':>11}{'decorated tx/s':>16}{'ratio':>7}{'added ms':>10}"
          f"{second + ' tx/s':>17}{'ratio':>7}{'added ms':>10}")
    for clients, bare_rate, ours_rate, second_rate in rows:
        added = (clients / ours_rate - clients / bare_rate) * 1000
        added_second = (clients / second_rate - clients / bare_rate) * 1000
        print(f"{clients:>8}{bare_rate:>11,.0f}{ours_rate:>16,.0f}{ours_rate / bare_rate:>7.0%}{added:>10.3f}"
              f"{second_rate:>17,.0f}{second_rate / bare_rate:>7.0%}{added_second:>10.3f}")


async def async_overhead(url: str, broker_url: str, seconds: float, rounds: int) -> None:
    """Bare async transactions against the async decorator, the half awaited or overlapping."""
    engine = create_async_engine(url.replace("postgresql+psycopg://", "postgresql+asyncpg://"), pool_size=20)
    sessions = async_sessionmaker(engine)
    producer = AsyncProducer(broker_url, "bench-async")

    async def bare() -> None:
        async with sessions.begin() as session:
            await session.execute(orders.insert().values(id=uuid.uuid4().hex, amount=1))

    def decorated(overlap: bool) -> Callable[[], Awaitable[None]]:
        @transactional_message(producer, sessions, topic="bench.paid", body=lambda order_id: {"id": order_id},
                               overlap=overlap)
        async def paid(session: AsyncSession, order_id: str) -> None:
            await session.execute(orders.insert().values(id=order_id, amount=1))

        return lambda: paid(uuid.uuid4().hex)

    variants = [bare, decorated(False), decorated(True)]
    rows = []
    for tasks in (1, 8):
        await run_tasks(tasks, 1.0, bare)  # warm-up
        totals = [0.0] * len(variants)
        for _ in range(rounds):
            for i, variant in enumerate(variants):
                totals[i] += await run_tasks(tasks, seconds / rounds, variant)
        bare_rate, awaited_rate, overlap_rate = (total / rounds for total in totals)
        rows.append((tasks, bare_rate, awaited_rate, overlap_rate))
    print("\nasyncio (asyncpg, AsyncProducer); decorated = half awaited before the transaction")
    print_rates("tasks", rows, "overlap")
    await producer.aclose()
    await engine.dispose()


def sync_overhead(url: str, port: int, args: argparse.Namespace) -> None:
    """Throughput of the blocking decorator and commit-to-handler latency against a relay."""
    engine = create_engine(url, pool_size=20)
    factory = sessionmaker(engine)
    producer = Producer(BrokerClient(f"tcp://127.0.0.1:{port}"), "bench")
    oneway = Producer(BrokerClient(f"tcp://127.0.0.1:{port}"), "bench", oneway_end=True)

    def bare() -> None:
        with factory.begin() as session:
            session.execute(orders.insert().values(id=uuid.uuid4().hex, amount=1))

    @transactional_message(producer, factory, topic="bench.paid", body=lambda order_id: {"id": order_id})
    def paid(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))

    @transactional_message(oneway, factory, topic="bench.paid", body=lambda order_id: {"id": order_id})
    def paid_oneway(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))

    # Variants alternate in short rounds so a noisy neighbour (2 shared cores) hits
    # all of them alike; each rate is total calls / total time over its rounds.
    variants: list[Callable[[], None]] = [bare, lambda: paid(uuid.uuid4().hex),
                                          lambda: paid_oneway(uuid.uuid4().hex)]
    rows = []
    for clients in (1, 8):
        run_clients(clients, 1.0, bare)  # warm-up
        totals = [0.0] * len(variants)
        for _ in range(args.rounds):
            for i, variant in enumerate(variants):
                totals[i] += run_clients(clients, args.seconds / args.rounds, variant)
            oneway.flush()
        bare_rate, ours_rate, oneway_rate = (total / args.rounds for total in totals)
        rows.append((clients, bare_rate, ours_rate, oneway_rate))
    print_rates("clients", rows, "oneway-end")

    # -- latency: DB commit -> consumer handler --------------------------------------
    committed: dict[str, float] = {}
    latencies: dict[str, list[float]] = {"halfmoon": [], "polling relay (100 ms)": []}

    def consume(topic: str, kind: str, stop: threading.Event) -> None:
        client = BrokerClient(f"tcp://127.0.0.1:{port}")
        while not stop.is_set():
            for received in client.receive("lat", topic, max_messages=32, wait_s=0.5):
                now = time.time()
                order_id = message_json(received.message)["id"]
                if order_id in committed:
                    latencies[kind].append((now - committed[order_id]) * 1000)
                client.ack("lat", received.receipt_handle)
        client.close()

    # insert=True: runs before the outbox's own after_commit listener (which sends
    # COMMIT), so the stamp is the DB commit, not the end of END_TRANSACTION.
    @event.listens_for(Session, "after_commit", insert=True)
    def stamp(session: Session) -> None:
        order_id = session.info.pop("bench_order", None)
        if order_id:
            committed[order_id] = time.time()

    @transactional_message(producer, factory, topic="bench.latency", body=lambda order_id: {"id": order_id})
    def timed_paid(session: Session, order_id: str) -> None:
        session.info["bench_order"] = order_id
        session.execute(orders.insert().values(id=order_id, amount=1))

    def relay(stop: threading.Event) -> None:
        client = BrokerClient(f"tcp://127.0.0.1:{port}")
        while not stop.wait(0.1):
            with factory.begin() as session:
                pending = session.execute(select(relay_outbox).with_for_update(skip_locked=True).limit(100)).all()
                for row in pending:
                    client.send(Message("bench.relay", f'{{"id": "{row.order_id}"}}'.encode()))
                if pending:
                    session.execute(relay_outbox.delete().where(relay_outbox.c.id.in_([r.id for r in pending])))
        client.close()

    def relay_paid(order_id: str) -> None:
        with factory() as session, session.begin():
            session.info["bench_order"] = order_id
            session.execute(orders.insert().values(id=order_id, amount=1))
            session.execute(relay_outbox.insert().values(order_id=order_id, committed_at=time.time()))

    stop = threading.Event()
    threads = [threading.Thread(target=consume, args=("bench.latency", "halfmoon", stop)),
               threading.Thread(target=consume, args=("bench.relay", "polling relay (100 ms)", stop)),
               threading.Thread(target=relay, args=(stop,))]
    for t in threads:
        t.start()
    time.sleep(1.0)
    for _ in range(args.latency_samples):
        timed_paid(uuid.uuid4().hex)
        relay_paid(uuid.uuid4().hex)
        time.sleep(0.01)
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join()
    print()
    print(f"{'commit -> handler latency':<28}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for kind, values in latencies.items():
        print(f"{kind:<28}{len(values):>6}{percentile(values, 0.5):>10.2f}{percentile(values, 0.99):>10.2f}"
              f"{statistics.fmean(values) if values else float('nan'):>10.2f}")
    oneway.close()
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per variant and client count")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per client count")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--only", choices=["sync", "async"], help="run only the blocking or the asyncio part")
    args = parser.parse_args()
    database = f"hm_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    url = args.postgres.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + database
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="hm-outbox-bench-"))
    server = subprocess.Popen([sys.executable, "-m", "broker_embedded", "serve", "--data-dir", str(work / "b"),
                               "--port", str(port), "--log-level", "WARNING"])
    try:
        wait_port(port)
        engine = create_engine(url, pool_size=20)
        app.create_all(engine)
        outbox_metadata.create_all(engine)
        engine.dispose()
        if args.only != "async":
            sync_overhead(url, port, args)
        if args.only != "sync":
            asyncio.run(async_overhead(url, f"tcp://127.0.0.1:{port}", args.seconds, args.rounds))
    finally:
        server.terminate()
        server.wait()
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


if __name__ == "__main__":
    main()
