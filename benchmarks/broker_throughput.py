"""Broker throughput, side by side with Redis and RabbitMQ on this machine.

    ./dev bench broker_throughput [--seconds 5] [--recovery-mib 1024] [--skip-peers]
                                  [--tx-only] [--repeat 3] [--metrics-overhead]

All durable: our broker in sync flush mode (a send is acknowledged after fsync), a private
redis-server with ``appendonly yes, appendfsync always``, RabbitMQ with publisher
confirms on a durable queue and persistent messages (when it answers on 127.0.0.1:5672).
Workloads, for 256 B and 1 KiB bodies:

* sequential: one connection, one send at a time, each waiting for its ack;
* in flight: several client processes, many concurrent sends each (ours: 4 processes x
  128 sends in flight on one asyncio connection; Redis: pipelines of 100); ours also with
  SEND_BATCH_MESSAGE (4 processes x 4 batches of 64 in flight);
* receive+ack: drain a pre-filled queue, acking every message (ours: batches of 256 with
  per-message acks pipelined on one asyncio connection; Redis: batches of 64, one
  multi-id XACK per batch; RabbitMQ: prefetch 64, basic_ack, which does not wait);
* recovery: SIGKILL a writer with ``--recovery-mib`` of log, time the reopen;
* transactions (256 B, one message each; ``--tx-only`` runs only these): ours
  SEND_HALF then END_TRANSACTION COMMIT, each waiting for its answer, against a fresh
  server; Redis: HSET of the half message, then one MULTI/EXEC with the commit's writes
  (XADD of the message, DEL of the half, HSET of the resolution). Sequential: one
  connection, one transaction at a time; in flight: 4 processes x 32 transactions at a
  time (ours on one asyncio connection per process, Redis on a pool of 32).

``--metrics-overhead`` runs only the 256 B sequential, in-flight, batch, transaction and
receive+ack workloads of ours, each against a fresh server without an HTTP port and against
one with ``--http-port`` whose /metrics is scraped every second, and prints both figures and
their ratio (the target: metrics cost at most 5 %).

``--repeat N`` runs everything N times and prints the median (min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from _common import (
    concurrently,
    free_port,
    halfmoon_server,
    in_processes,
    redis_server,
    repeat,
    summary,
    timed,
)

from broker_embedded import AsyncBrokerClient, BrokerClient, Message, Resolution
from broker_embedded.store.message_store import MessageStore

SIZES = (256, 1024)
PROCESSES = 4
TX_BODY = b"x" * 256
TX_IN_FLIGHT_PER_PROCESS = 32
TX_SEQUENTIAL = "tx sequential 256B (tx/s)"
TX_IN_FLIGHT = f"tx in flight, {PROCESSES} procs x {TX_IN_FLIGHT_PER_PROCESS} 256B (tx/s)"
TARGETS = {TX_SEQUENTIAL: ">= 1,500", TX_IN_FLIGHT: ">= 8,000"}


# -- our broker ---------------------------------------------------------------------------
def _send_one(client: BrokerClient, body: bytes) -> None:
    client.send(Message("bench-seq", body))


def _tx_one(client: BrokerClient, body: bytes) -> None:
    """One transaction of one message: the half message, then END_TRANSACTION COMMIT."""
    tx_id = uuid.uuid4().hex
    client.send_half(Message("bench-tx", body), producer_group="bench", transaction_id=tx_id)
    client.end_transaction(tx_id, Resolution.COMMIT, producer_group="bench")


async def _send_step(client: AsyncBrokerClient, body: bytes, batch: int) -> int:
    """A send, or (``batch`` > 1) a SEND_BATCH_MESSAGE of ``batch`` messages."""
    if batch == 1:
        await client.send(Message("bench-inflight", body))
    else:
        await client.send_batch([Message("bench-inflight", body) for _ in range(batch)])
    return batch


async def _tx_step(client: AsyncBrokerClient, body: bytes, batch: int) -> int:
    """``_tx_one`` on the asyncio client (``batch`` is unused: one message per transaction)."""
    tx_id = uuid.uuid4().hex
    await client.send_half(Message("bench-tx", body), producer_group="bench", transaction_id=tx_id)
    await client.end_transaction(tx_id, Resolution.COMMIT, producer_group="bench")
    return 1


Step = Callable[[AsyncBrokerClient, bytes, int], Awaitable[int]]


def _inflight_worker(url: str, step: Step, body: bytes, in_flight: int, batch: int, seconds: float,
                     out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One process, one pipelined asyncio connection keeping ``in_flight`` ``step`` loops
    running; puts how many operations they did on ``out``."""

    async def run() -> int:
        async with AsyncBrokerClient(url, timeout_s=30) as client:
            return await concurrently(in_flight, seconds, functools.partial(step, client, body, batch))

    out.put(asyncio.run(run()))


async def _drain(url: str, topic: str) -> int:
    """Receive a topic to the end in batches, acking every message (acks pipelined)."""
    received = 0
    async with AsyncBrokerClient(url, timeout_s=30) as client:
        while batch := await client.receive("bench", topic, max_messages=256):
            await asyncio.gather(*(client.ack("bench", m.receipt_handle) for m in batch))
            received += len(batch)
    return received


def halfmoon(seconds: float, work: Path) -> dict[str, float]:
    results: dict[str, float] = {}
    with halfmoon_server(work / "hm") as url:
        client = BrokerClient(url, timeout_s=30)
        for size in SIZES:
            body = b"x" * size
            results[f"sequential {size}B"] = timed(seconds, repeat(functools.partial(_send_one, client, body)))
            for label, in_flight, batch in (("in flight", 128, 1), ("in flight, batches of 64", 4, 64)):
                results[f"{label} {size}B"] = in_processes(
                    PROCESSES, _inflight_worker, (url, _send_step, body, in_flight, batch, seconds))
            results[f"receive+ack {size}B"] = _drain_rate(client, url, f"bench-drain-{size}", body)
        client.close()
    return results


def _drain_rate(client: BrokerClient, url: str, topic: str, body: bytes, prefill: int = 20_000) -> float:
    """Fill ``topic`` with ``prefill`` messages (16 sending threads), then drain it with
    acks (``_drain``); messages received per second."""
    client.create_topic(topic, 4)

    def fill(count: int = prefill // 16) -> None:
        for _ in range(count):
            client.send(Message(topic, body))

    sender = [threading.Thread(target=fill) for _ in range(16)]
    for t in sender:
        t.start()
    for t in sender:
        t.join()
    start = time.perf_counter()
    received = asyncio.run(_drain(url, topic))
    return received / (time.perf_counter() - start)


def halfmoon_tx(seconds: float, work: Path) -> dict[str, float]:
    """Transactions over TCP against a fresh sync-flush server."""
    with halfmoon_server(work / "hm-tx") as url, BrokerClient(url, timeout_s=30) as client:
        return {
            TX_SEQUENTIAL: timed(seconds, repeat(functools.partial(_tx_one, client, TX_BODY))),
            TX_IN_FLIGHT: in_processes(PROCESSES, _inflight_worker,
                                       (url, _tx_step, TX_BODY, TX_IN_FLIGHT_PER_PROCESS, 1, seconds)),
        }


#: The columns of ``--metrics-overhead``.
METRICS_OFF, METRICS_ON = "metrics off", "metrics on, scraped 1/s"


def _scrape_every_second(url: str, stop: threading.Event, scrapes: list[int]) -> None:
    """GET ``url`` once a second until ``stop``, as Prometheus would; counts the scrapes."""
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
        scrapes[0] += 1


def metrics_overhead(seconds: float, work: Path, metrics: bool) -> dict[str, float]:
    """The hot workloads (256 B) against a fresh server, with ``--http-port`` and a scrape
    of /metrics every second (``metrics``), or without an HTTP port."""
    body = TX_BODY
    http_port = free_port()
    extra = ("--http-port", str(http_port)) if metrics else ()
    with halfmoon_server(work / ("hm-metrics-on" if metrics else "hm-metrics-off"), *extra) as url, \
            BrokerClient(url, timeout_s=30) as client:
        stop, scrapes = threading.Event(), [0]
        scraper = threading.Thread(target=_scrape_every_second,
                                   args=(f"http://127.0.0.1:{http_port}/metrics", stop, scrapes))
        if metrics:
            scraper.start()
        try:
            results = {
                "sequential 256B": timed(seconds, repeat(functools.partial(_send_one, client, body))),
                f"in flight, {PROCESSES} procs x 128 256B": in_processes(
                    PROCESSES, _inflight_worker, (url, _send_step, body, 128, 1, seconds)),
                f"in flight, {PROCESSES} procs x 4 batches of 64 256B": in_processes(
                    PROCESSES, _inflight_worker, (url, _send_step, body, 4, 64, seconds)),
                TX_IN_FLIGHT: in_processes(PROCESSES, _inflight_worker,
                                           (url, _tx_step, body, TX_IN_FLIGHT_PER_PROCESS, 1, seconds)),
                "receive+ack 256B": _drain_rate(client, url, "bench-drain-metrics", body),
            }
        finally:
            stop.set()
            if metrics:
                scraper.join()
        if metrics and not scrapes[0]:
            raise RuntimeError("no scrape of /metrics happened during the run")
    return results


def print_metrics_overhead(columns: Columns, runs: int) -> None:
    """Both columns and the ratio of their medians (the target: metrics cost <= 5 %)."""
    if runs > 1:
        print(f"median of {runs} runs (min-max); off and on alternate which goes first")
    print(f"{'workload (ops/s)':<48}{METRICS_OFF:>30}{METRICS_ON:>30}{'on/off':>10}{'target':>10}")
    for row, off in columns[METRICS_OFF].items():
        on = columns[METRICS_ON][row]
        ratio = statistics.median(on) / statistics.median(off)
        print(f"{row:<48}{summary(off):>30}{summary(on):>30}{ratio:>10.3f}{'>= 0.95':>10}")


RECOVERY_WRITER = r"""
import sys
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
store = MessageStore(sys.argv[1], StoreConfig(flush_mode="async", segment_size=256 * 1024 * 1024))
target = int(sys.argv[2]) * 1024 * 1024
body = b"r" * 1024
batch = [StoredRecord(topic=f"recovery{i % 8}", queue_id=i % 4, body=body,
                      properties={"UNIQ_KEY": f"k{i}"}) for i in range(512)]
while store.commitlog.write_offset < target:
    store.put_batch(batch)
print("written", flush=True)
import time; time.sleep(600)
"""


def recovery(mib: int, work: Path) -> dict[str, float]:
    folder = work / "recovery"
    writer = subprocess.Popen([sys.executable, "-c", RECOVERY_WRITER, str(folder), str(mib)],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    writer.stdout.readline()
    time.sleep(2.5)  # let a checkpoint happen, as in a running broker
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    start = time.perf_counter()
    store = MessageStore(folder)
    elapsed = time.perf_counter() - start
    store.close()
    return {f"recovery after SIGKILL, {mib} MiB log (s)": elapsed}


# -- peers --------------------------------------------------------------------------------
def redis_streams(seconds: float, work: Path) -> dict[str, float]:
    import redis

    results: dict[str, float] = {}
    with redis_server(work / "redis") as port:
        r = redis.Redis(port=port)
        for size in SIZES:
            body = b"x" * size
            results[f"sequential {size}B"] = timed(seconds, repeat(functools.partial(r.xadd, "seq", {"b": body})))

            def pipelined(body: bytes = body) -> int:
                pipe = r.pipeline(transaction=False)
                for _ in range(100):
                    pipe.xadd("inflight", {"b": body})
                pipe.execute()
                return 100

            results[f"in flight {size}B"] = timed(seconds, pipelined)
            stream = f"drain{size}"
            pipe = r.pipeline(transaction=False)
            for _ in range(20_000):
                pipe.xadd(stream, {"b": body})
            pipe.execute()
            r.xgroup_create(stream, "g", id="0")
            received, start = 0, time.perf_counter()
            while entries := cast(list[Any], r.xreadgroup("g", "c", {stream: ">"}, count=64)):
                ids = [entry_id for _, items in entries for entry_id, _ in items]
                r.xack(stream, "g", *ids)
                received += len(ids)
            results[f"receive+ack {size}B"] = received / (time.perf_counter() - start)
    return results


def _redis_tx_one(r: Any, body: bytes) -> None:
    """The Redis rendering of a transaction: the half message stored (HSET), then one
    MULTI/EXEC doing the commit: the message into its stream, the half deleted, the
    resolution kept."""
    tx_id = uuid.uuid4().hex
    r.hset(f"half:{tx_id}", mapping={"topic": "bench-tx", "body": body})
    pipe = r.pipeline(transaction=True)
    pipe.xadd("bench-tx", {"b": body})
    pipe.delete(f"half:{tx_id}")
    pipe.hset("tx-state", tx_id, "committed")
    pipe.execute()


async def _redis_tx_step(r: Any, body: bytes) -> int:
    """``_redis_tx_one`` on the asyncio client."""
    tx_id = uuid.uuid4().hex
    await r.hset(f"half:{tx_id}", mapping={"topic": "bench-tx", "body": body})
    pipe = r.pipeline(transaction=True)
    pipe.xadd("bench-tx", {"b": body})
    pipe.delete(f"half:{tx_id}")
    pipe.hset("tx-state", tx_id, "committed")
    await pipe.execute()
    return 1


def _redis_tx_worker(port: int, in_flight: int, seconds: float,
                     out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One process, ``in_flight`` concurrent transactions on a pool of connections."""
    import redis.asyncio

    async def run() -> int:
        r = redis.asyncio.Redis(port=port, max_connections=in_flight)
        try:
            return await concurrently(in_flight, seconds, functools.partial(_redis_tx_step, r, TX_BODY))
        finally:
            await r.aclose()

    out.put(asyncio.run(run()))


def redis_tx(seconds: float, work: Path) -> dict[str, float]:
    """Transactions against a fresh AOF-always redis-server."""
    import redis

    with redis_server(work / "redis-tx") as port:
        r = redis.Redis(port=port)
        results = {
            TX_SEQUENTIAL: timed(seconds, repeat(functools.partial(_redis_tx_one, r, TX_BODY))),
            TX_IN_FLIGHT: in_processes(PROCESSES, _redis_tx_worker, (port, TX_IN_FLIGHT_PER_PROCESS, seconds)),
        }
        r.close()
    return results


def rabbitmq(seconds: float) -> dict[str, float]:
    try:
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        print(f"RabbitMQ not measured: {exc}", file=sys.stderr)
        return {}
    results: dict[str, float] = {}
    channel = connection.channel()
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for size in SIZES:
        body = b"x" * size
        queue = f"halfmoon-bench-{size}"
        channel.queue_declare(queue, durable=True)
        channel.queue_purge(queue)
        results[f"sequential {size}B"] = timed(
            seconds, repeat(functools.partial(channel.basic_publish, "", queue, body, persistent)))
        channel.queue_purge(queue)
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=64)
        publisher = connection.channel()
        for _ in range(20_000):
            publisher.basic_publish("", queue, body, persistent)
        received, start = 0, time.perf_counter()
        for method, _props, _body in consumer.consume(queue, inactivity_timeout=1):
            if method is None:
                break
            consumer.basic_ack(method.delivery_tag)
            received += 1
        consumer.cancel()
        results[f"receive+ack {size}B"] = received / (time.perf_counter() - start)
        channel.queue_delete(queue)
    connection.close()
    return results


Columns = dict[str, dict[str, list[float]]]


def measure_into(columns: Columns, column: str, results: dict[str, float]) -> None:
    """Add one run's figures to ``columns`` (samples per column and row)."""
    for row, value in results.items():
        columns.setdefault(column, {}).setdefault(row, []).append(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--recovery-mib", type=int, default=1024)
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--tx-only", action="store_true", help="only the transactional workloads")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the median is printed")
    parser.add_argument("--metrics-overhead", action="store_true",
                        help="only the hot workloads, with the HTTP port and metrics (scraped every second) "
                             "and without, in the same run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hm-bench-"))
    ours, redis_column = "halfmoon (sync fsync)", "Redis (AOF always)"
    columns: Columns = {}
    if args.metrics_overhead:
        try:
            for run in range(args.repeat):
                for metrics in ((False, True) if run % 2 == 0 else (True, False)):
                    measure_into(columns, METRICS_ON if metrics else METRICS_OFF,
                                 metrics_overhead(args.seconds, work / f"{run}", metrics))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print_metrics_overhead(columns, args.repeat)
        return
    try:
        for run in range(args.repeat):
            if not args.tx_only:
                measure_into(columns, ours, halfmoon(args.seconds, work / f"{run}"))
                measure_into(columns, ours, recovery(args.recovery_mib, work / f"{run}"))
            measure_into(columns, ours, halfmoon_tx(args.seconds, work / f"{run}"))
            if not args.skip_peers:
                if not args.tx_only:
                    measure_into(columns, redis_column, redis_streams(args.seconds, work / f"{run}"))
                    measure_into(columns, "RabbitMQ (confirms)", rabbitmq(args.seconds))
                measure_into(columns, redis_column, redis_tx(args.seconds, work / f"{run}"))
            shutil.rmtree(work / f"{run}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = list(dict.fromkeys(k for column in columns.values() for k in column))
    if args.repeat > 1:
        print(f"median of {args.repeat} runs (min-max)")
    print(f"{'workload (ops/s unless noted)':<48}" + "".join(f"{name:>34}" for name in columns) + f"{'target':>12}")
    for row in rows:
        cells = "".join(f"{summary(columns[name].get(row, [])):>34}" for name in columns)
        print(f"{row:<48}{cells}{TARGETS.get(row, ''):>12}")


if __name__ == "__main__":
    main()
