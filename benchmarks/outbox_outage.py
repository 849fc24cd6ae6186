"""What a decorated call costs while the broker is down (store mode), and how fast the stored messages drain.

    ./dev bench outbox_outage [--seconds 6] [--rounds 3] [--stored 100000] [--relays 1]
                              [--postgres postgresql://postgres@127.0.0.1:5432/test] [--quick]

In one run, on a fresh PostgreSQL database (SQLAlchemy 2 + psycopg 3):

* throughput and per-call p50/p99 at 1 client and 8 threads, the broker down (its URL points at a
  closed port): a bare local transaction (one insert + commit); the table outbox peer (the same
  insert plus an outbox row in one transaction, as django-outbox-pattern writes it); and
  ``@transactional_message`` with ``Producer(on_broker_down="store")``, which writes its message to
  ``outbox_stored_message`` beside the transaction_log row. Variants alternate in rounds
  (``_common.alternating_rounds``); figures are medians over the rounds, shares are of the bare
  transaction in the same round;
* the drain: ``--stored`` messages are stored by decorated calls (8 threads) while the broker is
  down; then a broker server starts, ``--relays`` ``outbox relay`` processes hand the messages over,
  and a consumer receives them. Printed: the time from the broker's start to the last row marked
  relayed and to the last message received, messages per second, and whether every message
  arrived exactly once.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import (
    alternating_rounds,
    free_port,
    halfmoon_process,
    in_threads,
    machine_load,
    percentile,
    ratios,
    scratch_postgres,
)
from outbox_overhead import app, orders, relay_outbox
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient
from outbox import Producer, transactional_message
from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata
from outbox.integrations.sqlalchemy.tables import stored_message

TOPIC = "bench.outage"
BARE, TABLE_OUTBOX, STORED = "bare transaction", "table outbox (row only)", "decorator, store mode"
CLIENTS = ((1, "1 client"), (8, "8 threads"))


class Calls:
    """The three variants on one engine; the producer's broker is down for good."""

    def __init__(self, url: str, dead_broker_url: str) -> None:
        self.engine = create_engine(url, pool_size=20)
        self.factory = sessionmaker(self.engine)
        self.producer = Producer(dead_broker_url, "bench-outage", on_broker_down="store")

        @transactional_message(self.producer, self.factory, topic=TOPIC, body=lambda order_id: {"id": order_id})
        def paid(session: Session, order_id: str) -> None:
            session.execute(orders.insert().values(id=order_id, amount=1))

        self.calls: dict[str, Callable[[], None]] = {
            BARE: self.bare, TABLE_OUTBOX: self.table_outbox, STORED: lambda: paid(uuid.uuid4().hex)}

    def bare(self) -> None:
        with self.factory.begin() as session:
            session.execute(orders.insert().values(id=uuid.uuid4().hex, amount=1))

    def table_outbox(self) -> None:
        order_id = uuid.uuid4().hex
        with self.factory.begin() as session:
            session.execute(orders.insert().values(id=order_id, amount=1))
            session.execute(relay_outbox.insert().values(topic=TOPIC, payload=f'{{"id": "{order_id}"}}'))

    def close(self) -> None:
        self.producer.close()
        self.engine.dispose()


def throughput(calls: Calls, args: argparse.Namespace) -> None:
    print(f"broker down: {args.rounds} alternating round(s) of {args.seconds / args.rounds:.1f} s per variant; "
          "cells: median calls/s, share of bare in the same round, per-call p50 / p99 (all rounds)")
    for clients, label in CLIENTS:
        calls.calls[BARE]()  # warm-up
        rounds = alternating_rounds(args.rounds, {
            name: functools.partial(in_threads, clients, args.seconds / args.rounds, call)
            for name, call in calls.calls.items()})
        rates = {name: [rate for rate, _ in results] for name, results in rounds.items()}
        for name, results in rounds.items():
            durations = [d for _, every in results for d in every]
            share = statistics.median(ratios(rates[name], rates[BARE]))
            print(f"  {label:<10} {name:<26} {statistics.median(rates[name]):>9,.0f}/s  {share:>6.0%} of bare  "
                  f"p50 {percentile(durations, 0.5) * 1000:.2f} ms  p99 {percentile(durations, 0.99) * 1000:.2f} ms")


def store(calls: Calls, count: int) -> float:
    """Store ``count`` messages by decorated calls on 8 threads; the seconds it took."""
    done = iter(range(count))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if next(done, None) is None:
                    return
            calls.calls[STORED]()

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def drain(url: str, work: Path, port: int, count: int, relays: int) -> None:
    """Start the broker on ``port`` and the relays; time the hand-over of ``count`` stored messages."""
    engine = create_engine(url)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    relay_cmd = [sys.executable, "-m", "outbox", "relay", "--database-url", url,
                 "--broker-url", f"tcp://127.0.0.1:{port}"]
    processes: list[subprocess.Popen[bytes]] = []
    seen: dict[bytes, int] = {}
    try:
        with halfmoon_process(work / "broker", port=port) as _:
            started = time.perf_counter()
            processes = [subprocess.Popen(relay_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                         for _ in range(relays)]
            relayed_s = received_s = None
            with BrokerClient(f"tcp://127.0.0.1:{port}") as client:
                deadline = started + max(600.0, count / 50)
                while time.perf_counter() < deadline and (relayed_s is None or received_s is None):
                    received = client.receive("bench-drain", TOPIC, max_messages=256, wait_s=0.2)
                    for message in received:
                        seen[message.message.body] = seen.get(message.message.body, 0) + 1
                    if received:
                        client.ack_many("bench-drain", [m.receipt_handle for m in received])
                    if received_s is None and len(seen) >= count:
                        received_s = time.perf_counter() - started
                    if relayed_s is None:
                        with engine.connect() as connection:
                            waiting = connection.execute(select(func.count()).select_from(stored_message).where(
                                stored_message.c.relayed_at.is_(None))).scalar_one()
                        if waiting == 0:
                            relayed_s = time.perf_counter() - started
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
        engine.dispose()
    copies = sum(seen.values())
    print(f"drain of {count:,} stored messages with {relays} relay(s): last marked relayed after "
          f"{relayed_s if relayed_s is not None else float('nan'):.1f} s, last received after "
          f"{received_s if received_s is not None else float('nan'):.1f} s "
          f"({count / received_s if received_s else 0:,.0f} msg/s); received {len(seen):,} distinct, "
          f"{copies - len(seen):,} duplicates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per variant and client setting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stored", type=int, default=100_000, help="messages to store, then drain")
    parser.add_argument("--relays", type=int, default=1, help="outbox relay processes for the drain")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 0.5 s, 2,000 stored")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.stored = 1.0, 2, min(args.stored, 2_000)
    print(machine_load("at start"), flush=True)
    work = Path(tempfile.mkdtemp(prefix="hm-outage-bench-"))
    port = free_port()  # nothing listens here until the drain starts the broker on it
    try:
        with scratch_postgres(args.postgres) as url:
            engine = create_engine(url)
            app.create_all(engine)
            outbox_metadata.create_all(engine)
            engine.dispose()
            calls = Calls(url, f"tcp://127.0.0.1:{port}")
            try:
                throughput(calls, args)
                with calls.engine.begin() as connection:  # the drain counts only its own messages
                    connection.execute(stored_message.delete())
                seconds = store(calls, args.stored)
                print(f"stored {args.stored:,} messages in {seconds:.1f} s ({args.stored / seconds:,.0f}/s, "
                      "8 threads)")
            finally:
                calls.close()
            drain(url, work, port, args.stored, args.relays)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
