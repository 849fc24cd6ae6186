"""Broker throughput, side by side with Redis and RabbitMQ on this machine.

    ./dev bench broker_throughput [--seconds 5] [--recovery-mib 1024] [--prefill 20000] [--skip-peers]
                                  [--tx-only] [--repeat 3] [--profile] [--quick] [--metrics-overhead] [--grpc]
                                  [--baseline DIR]

All durable: our broker in sync flush mode (a send is acknowledged after fsync), a private
redis-server with ``appendonly yes, appendfsync always``, RabbitMQ with publisher
confirms on a durable queue and persistent messages (when it answers on 127.0.0.1:5672).
Workloads, for 256 B and 1 KiB bodies:

* sequential: one connection, one send at a time, each waiting for its ack;
* in flight: several client processes, many concurrent sends each (ours: 4 processes x
  128 sends in flight on one asyncio connection; Redis: pipelines of 100); ours also with
  SEND_BATCH_MESSAGE (4 processes x 4 batches of 64 in flight);
* receive+ack: drain a pre-filled queue, acking every message (ours: batches of 256 with
  per-message acks pipelined on one asyncio connection, and again with one ACK_MESSAGE_BATCH
  per received batch, "batched acks"; Redis: batches of 64, one
  multi-id XACK per batch; RabbitMQ: prefetch 64, basic_ack, which does not wait);
* recovery: SIGKILL a writer with ``--recovery-mib`` of log, time the reopen;
* transactions (256 B, one message each; ``--tx-only`` runs only these): ours
  SEND_HALF then END_TRANSACTION COMMIT, each waiting for its answer, against a fresh
  server; Redis: HSET of the half message, then one MULTI/EXEC with the commit's writes
  (XADD of the message, DEL of the half, HSET of the resolution). Sequential: one
  connection, one transaction at a time; in flight: 4 processes x 32 transactions at a
  time (ours on one asyncio connection per process, Redis on a pool of 32).

``--metrics-overhead`` runs only the 256 B sequential, in-flight, batch, transaction and
receive+ack workloads of ours, against two servers side by side: one without an HTTP port
and one with ``--http-port`` whose /metrics is scraped every second. ``--repeat N`` rounds,
each running every workload on both back to back; it prints both figures and the on/off
ratio of each pair (the target: metrics cost at most 5 %, a ratio >= 0.95).

``--grpc`` runs only the official RocketMQ 5 Python client (``rocketmq-python-client``, a dev
dependency) over gRPC next to our native protocol, on one server started with ``--port`` and
``--grpc-port``: sends and transactions (send + commit), 256 B, sequential and from
``GRPC_THREADS`` threads (native: a client per thread; gRPC: one Producer, as its users share
it). ``--repeat N`` rounds, each running every workload over both, back to back (which goes first
alternates); it prints both figures and the gRPC/native ratio of each pair.

``--repeat N`` runs everything in N rounds, ours and the peers alternating (the order reversed
every other round, ``_common.alternating_rounds``), and prints the median (min-max) of each
figure; ``ours/Redis`` is the median of each round's ratio, next to issue 24's target (``TARGETS``)
and whether our median meets it. Under each workload, the server's CPU time per operation
(utime + stime of the server process from /proc/<pid>/stat over the workload; not measured
for RabbitMQ, which this benchmark does not start). ``--profile`` then runs the broker under
cProfile (``_common.PROFILED_BROKER``: every thread, timed by its own CPU clock) for the
in-flight sends and the transactions, and prints the top 10 functions by self time per
operation. ``--baseline DIR`` runs our workloads once more per round against a server from
another checkout (before/after in one run), printed next to ours with ``ours/baseline``, the
median of each round's ratio (above 1 is faster for rates, costlier for CPU rows).
``--quick`` is a smoke run of about a minute (256 B only, 1 s per workload).
The machine's load is printed at the start and the end.
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from _common import (
    alternating_rounds,
    concurrently,
    cpu_seconds,
    free_port,
    halfmoon_process,
    in_processes,
    machine_load,
    print_profile,
    ratios,
    redis_process,
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
IN_FLIGHT = "in flight 256B"
#: The suffix of our receive+ack rows with one ack_many per batch, compared with Redis's
#: receive+ack (one multi-id XACK per batch).
BATCHED_ACKS = ", batched acks"
PREFILL = 20_000


def cpu_row(workload: str) -> str:
    """The row of the server's CPU time per operation of ``workload``."""
    return f"{workload}: server CPU per op (µs)"


@dataclass(frozen=True)
class Target:
    """Issue 24's bar for a row: ours against Redis in the same round (``vs_redis``), and an
    absolute floor (``at_least``) or ceiling (``at_most``) on our median."""

    vs_redis: float | None = None
    at_least: float | None = None
    at_most: float | None = None

    def __str__(self) -> str:
        parts = [f">= {self.vs_redis:.1f}x Redis" if self.vs_redis is not None else "",
                 f">= {self.at_least:,.0f}" if self.at_least is not None else "",
                 f"<= {self.at_most:,.0f}" if self.at_most is not None else ""]
        return ", ".join(part for part in parts if part)

    def met(self, ours: float, vs_redis: float | None) -> bool:
        return ((self.vs_redis is None or (vs_redis is not None and vs_redis >= self.vs_redis))
                and (self.at_least is None or ours >= self.at_least)
                and (self.at_most is None or ours <= self.at_most))


TARGETS = {
    "sequential 256B": Target(vs_redis=1.0),
    IN_FLIGHT: Target(vs_redis=0.5),
    cpu_row(IN_FLIGHT): Target(at_most=10),
    "receive+ack 256B": Target(vs_redis=1.0),
    f"receive+ack 256B{BATCHED_ACKS}": Target(vs_redis=1.0),
    TX_SEQUENTIAL: Target(vs_redis=0.8, at_least=1_500),
    TX_IN_FLIGHT: Target(at_least=8_000),
}


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


async def _drain(url: str, topic: str, batched_acks: bool = False) -> int:
    """Receive a topic to the end in batches, acking every message: one ack request each
    (pipelined), or one ``ack_many`` per batch when ``batched_acks``."""
    received = 0
    async with AsyncBrokerClient(url, timeout_s=30) as client:
        while batch := await client.receive("bench", topic, max_messages=256):
            if batched_acks:
                refused = [o for o in await client.ack_many("bench", [m.receipt_handle for m in batch]) if o]
                assert not refused, refused
            else:
                await asyncio.gather(*(client.ack("bench", m.receipt_handle) for m in batch))
            received += len(batch)
    return received


def with_server_cpu(results: dict[str, float], pid: int, row: str, run: Callable[..., float], *args: Any) -> None:
    """Put ``run(*args)`` (operations per second) into ``results[row]`` and the CPU time
    process ``pid`` spent per operation meanwhile into ``results[cpu_row(row)]``."""
    start, cpu_start = time.perf_counter(), cpu_seconds(pid)
    rate = run(*args)
    operations = rate * (time.perf_counter() - start)
    results[row] = rate
    results[cpu_row(row)] = (cpu_seconds(pid) - cpu_start) / operations * 1e6


def halfmoon(seconds: float, work: Path, sizes: Sequence[int], prefill: int,
             code: Path | None = None) -> dict[str, float]:
    """Our workloads, against a server running checkout ``code`` (default: this one)."""
    results: dict[str, float] = {}
    with halfmoon_process(work / "hm", code=code) as (server, port):
        url = f"tcp://127.0.0.1:{port}"
        client = BrokerClient(url, timeout_s=30)
        for size in sizes:
            body = b"x" * size
            with_server_cpu(results, server.pid, f"sequential {size}B",
                            timed, seconds, repeat(functools.partial(_send_one, client, body)))
            for label, in_flight, batch in (("in flight", 128, 1), ("in flight, batches of 64", 4, 64)):
                with_server_cpu(results, server.pid, f"{label} {size}B", in_processes,
                                PROCESSES, _inflight_worker, (url, _send_step, body, in_flight, batch, seconds))
            for suffix, batched_acks in (("", False), (BATCHED_ACKS, True)):
                topic = f"bench-drain-{size}{'-batched' if batched_acks else ''}"
                _fill(client, topic, body, prefill)
                with_server_cpu(results, server.pid, f"receive+ack {size}B{suffix}",
                                _drain_rate, url, topic, batched_acks)
        client.close()
    return results


def _fill(client: BrokerClient, topic: str, body: bytes, count: int) -> None:
    """Create ``topic`` (4 queues) and send it ``count`` messages from 16 threads."""
    client.create_topic(topic, 4)

    def fill() -> None:
        for _ in range(count // 16):
            client.send(Message(topic, body))

    sender = [threading.Thread(target=fill) for _ in range(16)]
    for t in sender:
        t.start()
    for t in sender:
        t.join()


def _drain_rate(url: str, topic: str, batched_acks: bool = False) -> float:
    """Drain ``topic`` with acks (``_drain``); messages received per second."""
    start = time.perf_counter()
    received = asyncio.run(_drain(url, topic, batched_acks))
    return received / (time.perf_counter() - start)


def halfmoon_tx(seconds: float, work: Path, code: Path | None = None) -> dict[str, float]:
    """Transactions over TCP against a fresh sync-flush server (running checkout ``code``)."""
    results: dict[str, float] = {}
    with halfmoon_process(work / "hm-tx", code=code) as (server, port):
        url = f"tcp://127.0.0.1:{port}"
        with BrokerClient(url, timeout_s=30) as client:
            with_server_cpu(results, server.pid, TX_SEQUENTIAL,
                            timed, seconds, repeat(functools.partial(_tx_one, client, TX_BODY)))
        with_server_cpu(results, server.pid, TX_IN_FLIGHT, in_processes,
                        PROCESSES, _inflight_worker, (url, _tx_step, TX_BODY, TX_IN_FLIGHT_PER_PROCESS, 1, seconds))
    return results


def _tx_sequential(url: str, seconds: float) -> float:
    """``_tx_one`` on a connection of its own for ``seconds``; transactions per second."""
    with BrokerClient(url, timeout_s=30) as client:
        return timed(seconds, repeat(functools.partial(_tx_one, client, TX_BODY)))


def profile_hot_paths(seconds: float, work: Path) -> None:
    """``--profile``: the broker under cProfile for the in-flight sends and the transactions
    (each on a server of its own, profiled after a first run as warm-up); the top 10
    functions by self time per operation."""
    workloads: dict[str, Callable[[str], float]] = {
        f"in flight, {PROCESSES} procs x 128 256B sends": lambda url: in_processes(
            PROCESSES, _inflight_worker, (url, _send_step, TX_BODY, 128, 1, seconds)),
        "tx sequential 256B (send_half + END COMMIT)": functools.partial(_tx_sequential, seconds=seconds),
        TX_IN_FLIGHT: lambda url: in_processes(
            PROCESSES, _inflight_worker, (url, _tx_step, TX_BODY, TX_IN_FLIGHT_PER_PROCESS, 1, seconds)),
    }
    for number, (title, run) in enumerate(workloads.items()):
        profile = work / f"profile-{number}.pstats"
        with halfmoon_process(work / f"profiled-{number}", profile_to=profile) as (server, port):
            url = f"tcp://127.0.0.1:{port}"
            run(url)  # warm-up: imports, threads and connections, then forgotten
            server.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            start = time.perf_counter()
            operations = round(run(url) * (time.perf_counter() - start))
        print_profile(profile, title, operations)


#: The columns of ``--metrics-overhead``.
METRICS_OFF, METRICS_ON, ON_OFF = "metrics off", "metrics on, scraped 1/s", "on/off"


class Scraper:
    """GETs ``url`` once a second while ``active`` is set, as Prometheus would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.active = threading.Event()
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if self.active.is_set():
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
                self.scrapes += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _sequential(url: str, seconds: float) -> int:
    with BrokerClient(url, timeout_s=30) as client:
        done, stop = 0, time.perf_counter() + seconds
        while time.perf_counter() < stop:
            _send_one(client, TX_BODY)
            done += 1
        return done


def _in_flight(step: Step, in_flight: int, batch: int) -> Callable[[str, float], int]:
    def run(url: str, seconds: float) -> int:
        start = time.perf_counter()
        rate = in_processes(PROCESSES, _inflight_worker, (url, step, TX_BODY, in_flight, batch, seconds))
        return round(rate * (time.perf_counter() - start))

    return run


def _send_receive_ack(url: str, seconds: float) -> int:
    """5,000 messages sent into a topic of their own, then received and acked (``_fill``,
    ``_drain_rate``; ``seconds`` unused)."""
    topic = f"bench-drain-{uuid.uuid4().hex[:8]}"
    with BrokerClient(url, timeout_s=30) as client:
        _fill(client, topic, TX_BODY, 5_000)
    _drain_rate(url, topic)
    return 5_000


#: The workloads of ``--metrics-overhead``: name, and a run against a server URL for about
#: some seconds returning how many operations it did.
METRICS_WORKLOADS: dict[str, Callable[[str, float], int]] = {
    "sequential 256B": _sequential,
    f"in flight, {PROCESSES} procs x 128 256B": _in_flight(_send_step, 128, 1),
    f"in flight, {PROCESSES} procs x 4 batches of 64 256B": _in_flight(_send_step, 4, 64),
    TX_IN_FLIGHT: _in_flight(_tx_step, TX_IN_FLIGHT_PER_PROCESS, 1),
    "send, then receive+ack, 5,000 256B (msgs/s)": _send_receive_ack,
}


def metrics_overhead(seconds: float, work: Path, rounds: int) -> Columns:
    """Two servers side by side, one without an HTTP port and one with ``--http-port``
    whose /metrics is scraped every second while it is measured. Each round runs every
    workload on both, back to back (which goes first alternates), so a pair sees the same
    load on this shared machine. Per workload and column: operations per second, the
    server's CPU time per operation (what the metrics add to each, whatever the load), and
    per round the on/off ratios of both."""
    columns: Columns = {}
    http_port = free_port()
    with halfmoon_process(work / "metrics-off") as (off, off_port), \
            halfmoon_process(work / "metrics-on", "--http-port", str(http_port)) as (on, on_port):
        urls = {off.pid: f"tcp://127.0.0.1:{off_port}", on.pid: f"tcp://127.0.0.1:{on_port}"}
        scraper = Scraper(f"http://127.0.0.1:{http_port}/metrics")
        try:
            for round_number in range(rounds):
                for name, workload in METRICS_WORKLOADS.items():
                    rate, cpu = {}, {}
                    for pid in ((off.pid, on.pid) if round_number % 2 == 0 else (on.pid, off.pid)):
                        if pid == on.pid:
                            scraper.active.set()
                        start, cpu_start = time.perf_counter(), cpu_seconds(pid)
                        done = workload(urls[pid], seconds)
                        rate[pid] = done / (time.perf_counter() - start)
                        cpu[pid] = (cpu_seconds(pid) - cpu_start) / done * 1e6
                        scraper.active.clear()
                    measure_into(columns, METRICS_OFF, {name: rate[off.pid], cpu_row(name): cpu[off.pid]})
                    measure_into(columns, METRICS_ON, {name: rate[on.pid], cpu_row(name): cpu[on.pid]})
                    measure_into(columns, ON_OFF, {name: rate[on.pid] / rate[off.pid],
                                                   cpu_row(name): cpu[on.pid] / cpu[off.pid]})
        finally:
            scraper.close()
        if not scraper.scrapes:
            raise RuntimeError("no scrape of /metrics happened during the run")
    return columns


def print_metrics_overhead(columns: Columns, rounds: int) -> None:
    """Both columns and the rounds' ratios: median (min-max). The target: metrics cost at
    most 5 %: throughput on/off >= 0.95, server CPU per operation on/off <= 1.05."""
    print(f"{rounds} rounds; each cell: median (min-max) over the rounds; on/off: of each round's pair")
    print(f"{'workload (ops/s)':<48}{METRICS_OFF:>30}{METRICS_ON:>30}{ON_OFF:>22}{'target':>10}")
    for name in METRICS_WORKLOADS:
        for row, label, target in ((name, name, ">= 0.95"), (cpu_row(name), "  server CPU per op (µs)", "<= 1.05")):
            cells = [columns[column][row] for column in (METRICS_OFF, METRICS_ON, ON_OFF)]
            print(f"{label:<48}{summary(cells[0]):>30}{summary(cells[1]):>30}{summary(cells[2], '.3f'):>22}"
                  f"{target:>10}")
    ratios = columns[ON_OFF]
    for label, rows in (("all workloads, throughput", list(METRICS_WORKLOADS)),
                        ("all workloads, server CPU per op", [cpu_row(name) for name in METRICS_WORKLOADS])):
        print(f"{label:<48}{'':>60}{summary([r for row in rows for r in ratios[row]], '.3f'):>22}")


#: The columns of ``--grpc``, and its threads.
NATIVE, GRPC, GRPC_NATIVE = "native TCP", "gRPC, official Python client", "gRPC/native"
GRPC_THREADS = 4
GRPC_TOPIC = "bench-grpc"


class AlwaysCommit:
    """The Python client's transaction checker for ``--grpc`` (a check is never due: every
    transaction is committed within the timeout)."""

    def check(self, message: Any) -> Any:
        import rocketmq

        return rocketmq.TransactionResolution.COMMIT


def _import_rocketmq(home: Path) -> Any:
    """The official client, which picks its log folder (``~/logs/rocketmq_python``) at import."""
    previous = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        import rocketmq
    finally:
        if previous is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = previous
    return rocketmq


def _grpc_send(rocketmq: Any, producer: Any) -> None:
    message = rocketmq.Message()
    message.topic, message.body = GRPC_TOPIC, TX_BODY
    producer.send(message)


def _grpc_tx(rocketmq: Any, producer: Any) -> None:
    """One transaction of one message: the half message, then EndTransaction COMMIT."""
    message = rocketmq.Message()
    message.topic, message.body = GRPC_TOPIC, TX_BODY
    transaction = producer.begin_transaction()
    producer.send(message, transaction)
    transaction.commit()


def _threaded(threads: int, seconds: float, steps: Sequence[Callable[[], None]]) -> int:
    """Run ``steps[i]`` in a loop in thread i (``threads`` of them) for ``seconds``; the calls made."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def run(n: int) -> None:
        while time.perf_counter() < stop:
            steps[n]()
            counts[n] += 1

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def grpc_versus_native(seconds: float, work: Path, rounds: int) -> Columns:
    """Sends and transactions over the native protocol and over gRPC with the official Python
    client, against one server; per round, each workload on both back to back."""
    rocketmq = _import_rocketmq(work / "rocketmq-home")
    grpc_port = free_port()
    columns: Columns = {}
    with halfmoon_process(work / "grpc", "--grpc-port", str(grpc_port)) as (server, port):
        url = f"tcp://127.0.0.1:{port}"
        config = rocketmq.ClientConfiguration(f"127.0.0.1:{grpc_port}", rocketmq.Credentials("", ""))
        producer = rocketmq.Producer(config, (GRPC_TOPIC,), AlwaysCommit())
        producer.startup()
        natives = [BrokerClient(url, timeout_s=30) for _ in range(GRPC_THREADS)]
        try:
            _grpc_tx(rocketmq, producer)  # the route and the Telemetry settings, before timing
            grpc_steps = {"send": functools.partial(_grpc_send, rocketmq, producer),
                          "tx": functools.partial(_grpc_tx, rocketmq, producer)}
            native_steps = {"send": [functools.partial(_send_one, client, TX_BODY) for client in natives],
                            "tx": [functools.partial(_tx_one, client, TX_BODY) for client in natives]}
            for round_number in range(rounds):
                for kind, label in (("send", "send 256B"), ("tx", "tx (send + commit) 256B")):
                    for threads in (1, GRPC_THREADS):
                        row = f"{label}, {'sequential' if threads == 1 else f'{threads} threads'}"
                        runs = {NATIVE: functools.partial(_threaded, threads, seconds, native_steps[kind]),
                                GRPC: functools.partial(_threaded, threads, seconds, [grpc_steps[kind]] * threads)}
                        figures = {}
                        for column in (NATIVE, GRPC) if round_number % 2 == 0 else (GRPC, NATIVE):
                            start, server_cpu, client_cpu = time.perf_counter(), cpu_seconds(server.pid), \
                                time.process_time()
                            done = runs[column]()
                            figures[column] = {
                                row: done / (time.perf_counter() - start),
                                cpu_row(row): (cpu_seconds(server.pid) - server_cpu) / done * 1e6,
                                _clientcpu_row(row): (time.process_time() - client_cpu) / done * 1e6,
                            }
                            measure_into(columns, column, figures[column])
                        measure_into(columns, GRPC_NATIVE, {name: figures[GRPC][name] / figures[NATIVE][name]
                                                            for name in figures[NATIVE]})
        finally:
            for client in natives:
                client.close()
            producer.shutdown()
    return columns


def _clientcpu_row(workload: str) -> str:
    return f"{workload}: client CPU per op (µs)"


def print_grpc_versus_native(columns: Columns, rounds: int) -> None:
    """Per workload: operations per second, then the server's and the benchmark process's
    (the clients') CPU time per operation; median (min-max) over the rounds."""
    print(f"{rounds} rounds; each cell: median (min-max) over the rounds; gRPC/native: of each round's pair")
    print(f"{'workload (ops/s)':<44}{NATIVE:>28}{GRPC:>32}{GRPC_NATIVE:>22}")
    for row in columns[NATIVE]:
        label = row if ": " not in row else f"  {row.split(': ', 1)[1]}"
        print(f"{label:<44}{summary(columns[NATIVE][row]):>28}{summary(columns[GRPC][row]):>32}"
              f"{summary(columns[GRPC_NATIVE][row], '.3f'):>22}")


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
def redis_streams(seconds: float, work: Path, sizes: Sequence[int], prefill: int) -> dict[str, float]:
    import redis

    results: dict[str, float] = {}
    with redis_process(work / "redis") as (server, port):
        r = redis.Redis(port=port)
        for size in sizes:
            body = b"x" * size
            with_server_cpu(results, server.pid, f"sequential {size}B",
                            timed, seconds, repeat(functools.partial(r.xadd, "seq", {"b": body})))

            def pipelined(body: bytes = body) -> int:
                pipe = r.pipeline(transaction=False)
                for _ in range(100):
                    pipe.xadd("inflight", {"b": body})
                pipe.execute()
                return 100

            with_server_cpu(results, server.pid, f"in flight {size}B", timed, seconds, pipelined)
            stream = f"drain{size}"
            pipe = r.pipeline(transaction=False)
            for _ in range(prefill):
                pipe.xadd(stream, {"b": body})
            pipe.execute()
            r.xgroup_create(stream, "g", id="0")
            with_server_cpu(results, server.pid, f"receive+ack {size}B", _redis_drain_rate, r, stream)
    return results


def _redis_drain_rate(r: Any, stream: str) -> float:
    """Read ``stream`` to the end in batches of 64 (XREADGROUP), one multi-id XACK per batch;
    entries per second."""
    received, start = 0, time.perf_counter()
    while entries := cast(list[Any], r.xreadgroup("g", "c", {stream: ">"}, count=64)):
        ids = [entry_id for _, items in entries for entry_id, _ in items]
        r.xack(stream, "g", *ids)
        received += len(ids)
    return received / (time.perf_counter() - start)


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

    results: dict[str, float] = {}
    with redis_process(work / "redis-tx") as (server, port):
        r = redis.Redis(port=port)
        with_server_cpu(results, server.pid, TX_SEQUENTIAL,
                        timed, seconds, repeat(functools.partial(_redis_tx_one, r, TX_BODY)))
        with_server_cpu(results, server.pid, TX_IN_FLIGHT, in_processes,
                        PROCESSES, _redis_tx_worker, (port, TX_IN_FLIGHT_PER_PROCESS, seconds))
        r.close()
    return results


def rabbitmq(seconds: float, sizes: Sequence[int], prefill: int) -> dict[str, float]:
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
    for size in sizes:
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
        for _ in range(prefill):
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


def fresh(work: Path, run: Callable[[Path], dict[str, float]]) -> Callable[[], dict[str, float]]:
    """``run`` in a folder of its own under ``work``, removed afterwards."""

    def in_fresh_folder() -> dict[str, float]:
        folder = work / uuid.uuid4().hex[:8]
        try:
            return run(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return in_fresh_folder


OURS, REDIS, RABBITMQ, VS_REDIS = "halfmoon (sync fsync)", "Redis (AOF always)", "RabbitMQ (confirms)", "ours/Redis"
#: ``--baseline``: halfmoon from another checkout, and ours over it per round.
BASELINE, VS_BASELINE = "halfmoon, baseline", "ours/baseline"


def side_by_side(args: argparse.Namespace, work: Path) -> Columns:
    """Every workload of ours and of the peers, in ``args.repeat`` alternating rounds (the
    order reversed every other round); per column and row, one figure per round, and per
    round our figure over Redis's."""
    sizes, seconds, prefill = SIZES[:1] if args.quick else SIZES, args.seconds, args.prefill
    runs: dict[str, Callable[[], dict[str, float]]] = {}
    if not args.tx_only:
        runs[OURS] = fresh(work, lambda folder: halfmoon(seconds, folder, sizes, prefill))
        runs["recovery"] = fresh(work, lambda folder: recovery(args.recovery_mib, folder))
    runs["ours tx"] = fresh(work, lambda folder: halfmoon_tx(seconds, folder))
    if args.baseline is not None:
        if not args.tx_only:
            runs[BASELINE] = fresh(work, lambda folder: halfmoon(seconds, folder, sizes, prefill, args.baseline))
        runs["baseline tx"] = fresh(work, lambda folder: halfmoon_tx(seconds, folder, args.baseline))
    if not args.skip_peers:
        if not args.tx_only:
            runs[REDIS] = fresh(work, lambda folder: redis_streams(seconds, folder, sizes, prefill))
            runs[RABBITMQ] = lambda: rabbitmq(seconds, sizes, prefill)
        runs["Redis tx"] = fresh(work, lambda folder: redis_tx(seconds, folder))
    column_of = {"recovery": OURS, "ours tx": OURS, "Redis tx": REDIS, "baseline tx": BASELINE}
    rounds = alternating_rounds(args.repeat, runs)
    columns: Columns = {}
    for name, figures in rounds.items():
        for figure in figures:
            measure_into(columns, column_of.get(name, name), figure)
    for row, ours in columns[OURS].items():
        redis = columns.get(REDIS, {}).get(row.replace(BATCHED_ACKS, ""))
        if redis and len(redis) == len(ours):
            columns.setdefault(VS_REDIS, {})[row] = ratios(ours, redis)
        before = columns.get(BASELINE, {}).get(row)
        if before and len(before) == len(ours):
            columns.setdefault(VS_BASELINE, {})[row] = ratios(ours, before)
    return columns


def print_side_by_side(columns: Columns, rounds: int) -> None:
    """The table: each cell the median (min-max) over the rounds; ours/Redis the median of
    each round's ratio; the target of issue 24 and whether our median meets it."""
    print(f"{rounds} alternating round(s); each cell: median (min-max) over the rounds; "
          f"{VS_REDIS}: median of each round's ratio")
    names = [name for name in (OURS, BASELINE, VS_BASELINE, REDIS, RABBITMQ) if name in columns]
    print(f"{'workload (ops/s unless noted)':<56}" + "".join(f"{name:>30}" for name in names)
          + f"{VS_REDIS:>20}{'target':>26}{'met':>5}")
    rows = list(dict.fromkeys(row for column in columns.values() for row in column))
    for row in rows:
        cells = "".join(f"{summary(columns[name].get(row, []), '.2f' if name == VS_BASELINE else ',.1f'):>30}"
                        for name in names)
        vs_redis = columns.get(VS_REDIS, {}).get(row, [])
        target = TARGETS.get(row)
        met = ""
        if target is not None and (ours := columns[OURS].get(row)):
            met = "yes" if target.met(statistics.median(ours),
                                      statistics.median(vs_redis) if vs_redis else None) else "no"
        label = row if ": " not in row else f"  {row.split(': ', 1)[1]}"
        print(f"{label:<56}{cells}{summary(vs_redis, '.2f'):>20}{str(target or ''):>26}{met:>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--recovery-mib", type=int, default=1024)
    parser.add_argument("--prefill", type=int, default=PREFILL, help="messages per receive+ack workload")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--tx-only", action="store_true", help="only the transactional workloads")
    parser.add_argument("--repeat", type=int, default=1,
                        help="alternating rounds; each figure is the median over them")
    parser.add_argument("--profile", action="store_true",
                        help="then the broker under cProfile: top 10 functions per message for the in-flight "
                             "sends and the transactions")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of about a minute: 256 B only, 1 s per workload, 2,000 messages "
                             "drained, a 32 MiB recovery")
    parser.add_argument("--metrics-overhead", action="store_true",
                        help="only the hot workloads, with the HTTP port and metrics (scraped every second) "
                             "and without, in the same run")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout (e.g. `git archive <rev> | tar -x -C DIR`) whose server runs the same "
                             "workloads in the same rounds, printed next to ours with ours/baseline")
    parser.add_argument("--grpc", action="store_true",
                        help="only sends and transactions over gRPC (the official Python client) next to the "
                             "native protocol, on one server")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.prefill, args.recovery_mib = min(args.seconds, 1.0), min(args.prefill, 2_000), 32
    work = Path(tempfile.mkdtemp(prefix="hm-bench-"))
    print(machine_load("at start"), flush=True)
    try:
        if args.metrics_overhead:
            print_metrics_overhead(metrics_overhead(args.seconds, work, args.repeat), args.repeat)
        elif args.grpc:
            print_grpc_versus_native(grpc_versus_native(args.seconds, work, args.repeat), args.repeat)
        else:
            print_side_by_side(side_by_side(args, work), args.repeat)
            if args.profile:
                profile_hot_paths(args.seconds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
