"""What ``@transactional_message`` costs on PostgreSQL next to a table outbox, and how fast messages arrive.

    ./dev bench outbox_overhead [--seconds 6] [--rounds 3] [--postgres postgresql://postgres@127.0.0.1:5432/test]
                                [--only sync|async] [--poll-intervals 0.1,1] [--profile] [--timeline] [--quick]

In one run, on a fresh database and a broker server process (SQLAlchemy 2 + psycopg 3):

* throughput, at 1 client, 8 threads and 8 processes: a bare local transaction (one
  insert + commit); the table outbox peer (the same insert plus an outbox row in one
  transaction, as django-outbox-pattern does, while a relay process polls the outbox every
  ``--poll-intervals[0]`` with ``SELECT ... FOR UPDATE SKIP LOCKED``, publishes each row to
  our broker and deletes it); and ``@transactional_message`` in each of its modes (``MODES``:
  the defaults (the half overlapping the transaction, END oneway), the overlap with END
  waited (``Producer(oneway_end=False)``), the half awaited before the transaction with
  END waited (``overlap=False``: the only mode before issue 24) and with END oneway; a
  mode the installed code refuses is "n/a"). Each
  share is of the bare transaction in the same round; the variants alternate in rounds
  (``_common.alternating_rounds``), figures are medians over the rounds. After each
  variant's window the next waits until the relay has published every outbox row (its
  catch-up: the table outbox's writes to the broker happen after its calls, and would
  otherwise run in the next variant's window). Each row also has the CPU every process
  spent per call (``CPU_GROUPS``: the clients, PostgreSQL's processes on this machine, the
  broker, the relay), in the window and in the catch-up after it, and the calls per second
  whose message was in the broker by the window's end ("delivered/s": the decorator's
  every call; the table outbox's less the rows its relay had not published yet, which
  keep growing while the clients keep the machine busy);
* latency from the DB commit to the consumer's handler: each decorator mode against the
  table outbox's relay at each poll interval (100 ms, and 1 s as django-outbox-pattern's
  default), the samples interleaved; then the decorator (defaults) alone, a call every
  10 ms (a lone call's END is not followed by another write);
* asyncio (asyncpg, ``AsyncProducer``): a bare async transaction against the same with
  the async ``@transactional_message``, at 1 and 8 concurrent tasks, with the half
  message awaited before the transaction and overlapping it (``overlap=True``).

``--profile`` runs the decorator (defaults) at 1 client under cProfile, in this process,
and prints the top 10 functions by self time per message. ``--timeline`` splits a
decorated call's wall time at 1 client into the steps between the engine's events, next
to a bare transaction that writes the same transaction_log row (``timeline``). ``--quick`` is a smoke run of
about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import functools
import itertools
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _common import (
    alternating_rounds,
    cpu_seconds,
    halfmoon_process,
    in_threads,
    machine_load,
    percentile,
    print_profile,
    ratios,
    repeat,
    scratch_postgres,
    summary,
    timed,
)
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient, Message
from outbox import AsyncProducer, ConfigurationError, Producer, message_json, transactional_message
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata

app = MetaData()
orders = Table("bench_orders", app, Column("id", String(40), primary_key=True), Column("amount", Integer))
#: The table outbox peer's table: one row per message, relayed by topic.
relay_outbox = Table("bench_relay_outbox", app, Column("id", Integer, primary_key=True, autoincrement=True),
                     Column("topic", String(80), index=True), Column("payload", Text))


async def run_tasks(tasks: int, seconds: float, call: Callable[[], Awaitable[None]]) -> float:
    """``in_threads`` for coroutines: ``tasks`` concurrent tasks on one loop; calls per second."""
    counts = [0] * tasks
    stop = time.perf_counter() + seconds

    async def work(i: int) -> None:
        while time.perf_counter() < stop:
            await call()
            counts[i] += 1

    start = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(tasks)))
    return sum(counts) / (time.perf_counter() - start)


def async_overhead(url: str, broker_url: str, broker_pid: int, seconds: float, rounds: int) -> None:
    """Bare async transactions against the async decorator, the half awaited or overlapping,
    on a loop of its own, in alternating rounds."""
    loop = asyncio.new_event_loop()
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

    variants = {BARE: bare, "decorator(overlap=False)": decorated(False), "decorator(overlap=True)": decorated(True)}

    def rate(tasks: int, name: str, seconds: float) -> float:
        return loop.run_until_complete(run_tasks(tasks, seconds, variants[name]))

    meter = CpuMeter(broker_pid)
    print("\nasyncio (asyncpg, AsyncProducer)")
    try:
        for tasks in (1, 8):
            rate(tasks, BARE, 1.0)  # warm-up
            print_throughput(f"{tasks} task(s)", tasks, alternating_rounds(rounds, {
                name: functools.partial(measured_run, meter, None, functools.partial(rate, tasks), name,
                                        seconds / rounds) for name in variants
            }), {})
    finally:
        loop.run_until_complete(producer.aclose())
        loop.run_until_complete(engine.dispose())
        loop.close()


#: The decorator's modes: the Producer's options and the decorator's, each set explicitly
#: only where the mode says so (the defaults are whatever the installed code does).
DEFAULTS = "decorator, defaults"
MODES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    DEFAULTS: ({}, {}),
    "overlap, END waited": ({"oneway_end": False}, {"overlap": True}),
    "half first, END waited": ({"oneway_end": False}, {"overlap": False}),
    "half first, END oneway": ({"oneway_end": True}, {"overlap": False}),
}
BARE, TABLE_OUTBOX = "bare INSERT+COMMIT", "table outbox"
THROUGHPUT_TOPIC = "bench.relay.throughput"
#: The client settings: how many clients, named, and whether each is a process of its own
#: (or a thread of this one).
CLIENTS = ((1, "1 client", False), (8, "8 threads", False), (8, "8 processes", True))


class Variants:
    """The workloads one client runs, built on their own engine and broker connections:
    ``calls[name]`` makes one transaction; a decorator mode the installed code refuses is in
    ``refused`` instead, with why."""

    def __init__(self, url: str, broker_url: str, topic_prefix: str = "bench.paid") -> None:
        self.engine = create_engine(url, pool_size=20)
        self.factory = sessionmaker(self.engine)
        self.producers: list[Producer] = []
        self.calls: dict[str, Callable[[], None]] = {BARE: self.bare, TABLE_OUTBOX: self.table_outbox}
        self.refused: dict[str, str] = {}
        self.topics: dict[str, str] = {}
        for number, (mode, (producer_options, decorator_options)) in enumerate(MODES.items()):
            try:
                producer = Producer(broker_url, f"bench-{number}", **producer_options)
            except (TypeError, ConfigurationError) as exc:
                self.refused[mode] = f"{type(exc).__name__}: {exc}"
                continue
            self.producers.append(producer)
            try:
                decorated = self.decorate(producer, f"{topic_prefix}.{number}", decorator_options)
            except (TypeError, ConfigurationError) as exc:
                self.refused[mode] = f"{type(exc).__name__}: {exc}"
                continue
            self.calls[mode], self.topics[mode] = functools.partial(self.call, decorated), f"{topic_prefix}.{number}"

    def decorate(self, producer: Producer, topic: str, options: dict[str, Any]) -> Callable[[str], None]:
        @transactional_message(producer, self.factory, topic=topic, body=lambda order_id: {"id": order_id},
                               **options)
        def paid(session: Session, order_id: str) -> None:
            session.info["bench_order"] = order_id
            session.execute(orders.insert().values(id=order_id, amount=1))

        return paid

    @staticmethod
    def call(decorated: Callable[[str], None]) -> None:
        decorated(uuid.uuid4().hex)

    def bare(self) -> None:
        with self.factory.begin() as session:
            session.execute(orders.insert().values(id=uuid.uuid4().hex, amount=1))

    def table_outbox(self, topic: str = THROUGHPUT_TOPIC) -> None:
        """The peer: the business row and an outbox row in one transaction."""
        order_id = uuid.uuid4().hex
        with self.factory() as session, session.begin():
            session.info["bench_order"] = order_id
            session.execute(orders.insert().values(id=order_id, amount=1))
            session.execute(relay_outbox.insert().values(topic=topic, payload=f'{{"id": "{order_id}"}}'))

    def flush(self) -> None:
        """Wait for the background END_TRANSACTIONs (``oneway_end``), so a round does not
        leave work to the next."""
        for producer in self.producers:
            producer.flush()

    def close(self) -> None:
        for producer in self.producers:
            producer.close()
        self.engine.dispose()


def relay(url: str, broker_url: str, topic: str, poll_s: float, stop: Any) -> None:
    """The table outbox's relay (django-outbox-pattern's kind): every ``poll_s``, up to 100
    of ``topic``'s outbox rows, locked with ``FOR UPDATE SKIP LOCKED``, are published to
    our broker one by one (each send waits for its fsync'd ack) and deleted, in one
    transaction."""
    engine = create_engine(url, pool_size=1)
    client = BrokerClient(broker_url)
    try:
        while not stop.wait(poll_s):
            with engine.begin() as connection:
                pending = connection.execute(select(relay_outbox).where(relay_outbox.c.topic == topic).order_by(
                    relay_outbox.c.id).with_for_update(skip_locked=True).limit(100)).all()
                for row in pending:
                    client.send(Message(topic, row.payload.encode()))
                if pending:
                    connection.execute(relay_outbox.delete().where(relay_outbox.c.id.in_([r.id for r in pending])))
    finally:
        client.close()
        engine.dispose()


def _client_process(url: str, broker_url: str, commands: Any, results: Any) -> None:
    """One of ``ProcessClients``: builds its ``Variants``, then runs the one each command
    names, from the command's start time for its seconds, and answers its calls per second."""
    variants = Variants(url, broker_url)
    results.put(0.0)
    while (command := commands.get()) is not None:
        name, seconds, start_at = command
        time.sleep(max(0.0, start_at - time.time()))
        results.put(in_threads(1, seconds, variants.calls[name])[0])
        variants.flush()
    variants.close()


class ProcessClients:
    """``processes`` client processes (spawned: no forked threads or connections), each
    with its own ``Variants``; ``rate`` runs one variant in all at once."""

    def __init__(self, processes: int, url: str, broker_url: str) -> None:
        context = mp.get_context("spawn")
        self.results = context.Queue()
        self.commands = [context.Queue() for _ in range(processes)]
        self.processes = [context.Process(target=_client_process, args=(url, broker_url, commands, self.results))
                          for commands in self.commands]
        for process in self.processes:
            process.start()
        for _ in self.processes:
            self.results.get(timeout=120)  # built

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes if process.pid is not None]

    def rate(self, name: str, seconds: float) -> float:
        """Calls per second of variant ``name`` over all the processes, started together."""
        start_at = time.time() + 0.2
        for commands in self.commands:
            commands.put((name, seconds, start_at))
        return float(sum(self.results.get(timeout=seconds + 120) for _ in self.commands))

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(timeout=60)


#: The processes whose CPU a throughput run counts, by role: the clients making the calls,
#: PostgreSQL's (every process named ``postgres`` on this machine), the broker server's, the
#: table outbox's relay.
CPU_GROUPS = ("clients", "PostgreSQL", "broker", "relay")
#: The longest the relay may take to publish what a round left in the outbox.
CATCH_UP_LIMIT_S = 600.0


class CpuMeter:
    """CPU seconds so far of each of ``CPU_GROUPS`` (``clients``: the pids making the calls)."""

    def __init__(self, broker_pid: int, relay_pid: int | None = None) -> None:
        self.broker_pid, self.relay_pid = broker_pid, relay_pid
        self.clients: list[int] = [os.getpid()]

    def read(self) -> dict[str, float]:
        relay = [] if self.relay_pid is None else [self.relay_pid]
        return dict(zip(CPU_GROUPS, (_cpu_of(self.clients), _cpu_of(_postgres_pids()), _cpu_of([self.broker_pid]),
                                     _cpu_of(relay)), strict=True))


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds of the processes ``pids`` that are still running."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass  # a PostgreSQL backend that just ended
    return total


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@dataclasses.dataclass
class Run:
    """One variant's round: calls per second in its window; the CPU microseconds per call of
    each of ``CPU_GROUPS`` during the window, and after it while the table outbox's relay
    published what the window left in the outbox (``catch_up_s``; nothing for the decorator,
    whose messages are all sent, ENDs included, within its run); ``delivered_rate``: the
    calls per second of the window whose message was in the broker at its end (the
    decorator's all; the table outbox's less what its relay had not published yet)."""

    rate: float
    cpu_us: dict[str, float]
    catch_up_cpu_us: dict[str, float]
    catch_up_s: float
    delivered_rate: float

    @property
    def total_cpu_us(self) -> float:
        return sum(self.cpu_us.values()) + sum(self.catch_up_cpu_us.values())


def relay_backlog(engine: Any) -> int:
    """Outbox rows the relay has not published (and deleted) yet."""
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(relay_outbox)).scalar_one())


def relay_caught_up(engine: Any) -> float:
    """Seconds until the relay has published every outbox row (at most ``CATCH_UP_LIMIT_S``)."""
    started = time.perf_counter()
    while relay_backlog(engine):
        if time.perf_counter() - started > CATCH_UP_LIMIT_S:
            raise RuntimeError(f"the relay did not catch up in {CATCH_UP_LIMIT_S:.0f} s")
        time.sleep(0.05)
    return time.perf_counter() - started


def measured_run(meter: CpuMeter, engine: Any, rate: Callable[[str, float], float], name: str,
                 seconds: float) -> Run:
    """Variant ``name`` for ``seconds`` (``rate``: its calls per second), then the relay's
    catch-up (none without an ``engine``), with the CPU of each process group in both."""
    before = meter.read()
    calls_per_s = rate(name, seconds)
    window = meter.read()
    unpublished = 0 if engine is None else relay_backlog(engine)
    catch_up_s = 0.0 if engine is None else relay_caught_up(engine)
    after = meter.read()
    calls = max(1.0, calls_per_s * seconds)
    return Run(calls_per_s, {group: (window[group] - before[group]) / calls * 1e6 for group in CPU_GROUPS},
               {group: (after[group] - window[group]) / calls * 1e6 for group in CPU_GROUPS}, catch_up_s,
               calls_per_s - unpublished / seconds)


def throughput(url: str, broker_url: str, broker_pid: int, args: argparse.Namespace) -> None:
    """The throughput table: per client setting, each variant's calls per second (median
    over the alternating rounds), its share of the bare transaction (median of each
    round's ratio), what it adds per call, its share over the table outbox's, and the CPU
    every process spent per call. Each round starts with the relay caught up, so no
    variant's window holds the relaying of the table outbox's rows."""
    mp_stop = mp.get_context("spawn").Event()
    relay_process = mp.get_context("spawn").Process(
        target=relay, args=(url, broker_url, THROUGHPUT_TOPIC, args.poll_intervals[0], mp_stop))
    relay_process.start()
    assert relay_process.pid is not None
    meter = CpuMeter(broker_pid, relay_process.pid)
    variants = Variants(url, broker_url)
    names = list(variants.calls)
    print(f"throughput: {args.rounds} alternating round(s) of {args.seconds / args.rounds:.1f} s per variant; "
          f"cells: median (min-max); share: of bare in the same round; the table outbox's relay polls every "
          f"{args.poll_intervals[0] * 1000:.0f} ms (SKIP LOCKED), publishes each row to our broker and deletes it; "
          "after each window the next waits until the relay has published every row (its catch-up)")
    for mode, reason in variants.refused.items():
        print(f"  {mode}: n/a, refused by the installed code ({reason})")
    processes: ProcessClients | None = None
    try:
        for clients, label, in_processes in CLIENTS:
            if in_processes:
                processes = ProcessClients(clients, url, broker_url)
                rate, meter.clients = processes.rate, processes.pids
            else:
                rate, meter.clients = functools.partial(_threads_rate, variants, clients), [os.getpid()]
            rate(BARE, 1.0)  # warm-up
            rounds = alternating_rounds(args.rounds, {
                name: functools.partial(measured_run, meter, variants.engine, rate, name, args.seconds / args.rounds)
                for name in names})
            print_throughput(label, clients, rounds, variants.refused)
            if processes is not None:
                processes.close()
                processes = None
    finally:
        if processes is not None:
            processes.close()
        mp_stop.set()
        relay_process.join(timeout=60)
        variants.close()


def _threads_rate(variants: Variants, clients: int, name: str, seconds: float) -> float:
    rate = in_threads(clients, seconds, variants.calls[name])[0]
    variants.flush()
    return rate


def print_throughput(label: str, clients: int, runs: dict[str, list[Run]], refused: dict[str, str]) -> None:
    """One client setting's rows: the first of ``runs`` is the bare transaction the
    shares are of; the table outbox, if measured, the peer the last columns compare to.
    Then the CPU per call of each process group, in the window and in the relay's catch-up."""
    rates = {name: [run.rate for run in samples] for name, samples in runs.items()}
    bare = next(iter(rates.values()))
    table_share = ratios(rates[TABLE_OUTBOX], bare) if TABLE_OUTBOX in rates else []
    table_cpu = [run.total_cpu_us for run in runs.get(TABLE_OUTBOX, [])]
    table_delivered = [run.delivered_rate for run in runs.get(TABLE_OUTBOX, [])]
    print(f"\n{label:<30}{'tx/s':>24}{'share of bare %':>22}{'added ms':>10}"
          f"{'share / table outbox' if table_share else '':>22}{' (issue 24: >= 1)' if table_share else '':<18}"
          f"{'CPU µs/call, all':>18}{'/ table outbox':>20}{'catch-up s':>12}"
          f"{'delivered/s' if table_delivered else '':>24}{'/ table outbox' if table_delivered else '':>20}")
    for name, samples in rates.items():
        share = ratios(samples, bare)
        added = (clients / statistics.median(samples) - clients / statistics.median(bare)) * 1000
        versus_table = (summary(ratios(share, table_share), ".2f")
                        if table_share and name not in (BARE, TABLE_OUTBOX) else "")
        cpu = [run.total_cpu_us for run in runs[name]]
        cpu_versus_table = summary(ratios(cpu, table_cpu), ".2f") if table_cpu and name != TABLE_OUTBOX else ""
        delivered = [run.delivered_rate for run in runs[name]]
        delivered_cells = ""
        if table_delivered and name != BARE:
            delivered_cells = f"{summary(delivered, ',.0f'):>24}"
            if name != TABLE_OUTBOX:
                delivered_cells += f"{summary(ratios(delivered, table_delivered), '.2f'):>20}"
        print(f"{name:<30}{summary(samples, ',.0f'):>24}{summary([s * 100 for s in share], '.0f'):>22}"
              f"{added:>10.2f}{versus_table:>22}{'':<18}{statistics.median(cpu):>18,.0f}{cpu_versus_table:>20}"
              f"{statistics.median(run.catch_up_s for run in runs[name]):>12.1f}{delivered_cells}")
    for name in refused:
        print(f"{name:<30}{'n/a':>24}")
    print(f"{'CPU µs per call, median':<30}" + "".join(f"{group:>18}" for group in CPU_GROUPS)
          + f"{'all':>10}   (window + the relay's catch-up after it)")
    for name, name_runs in runs.items():
        cells = [f"{statistics.median(r.cpu_us[g] for r in name_runs):,.0f}"
                 f" + {statistics.median(r.catch_up_cpu_us[g] for r in name_runs):,.0f}" for g in CPU_GROUPS]
        print(f"{name:<30}" + "".join(f"{cell:>18}" for cell in cells)
              + f"{statistics.median(r.total_cpu_us for r in name_runs):>10,.0f}")


def latency(url: str, broker_url: str, args: argparse.Namespace) -> None:
    """Commit -> consumer handler, per decorator mode and per relay poll interval, the
    samples interleaved; the stamp is the DB commit (an ``after_commit`` listener put
    before the outbox's own). Then the decorator (defaults) alone, a call every 10 ms:
    calls no other write follows closely (the broker writes their ENDs at once)."""
    committed: dict[str, float] = {}
    latencies: dict[str, list[float]] = {}

    def consume(topic: str, kind: str, stop: threading.Event) -> None:
        with BrokerClient(broker_url) as client:
            while not stop.is_set():
                for received in client.receive("lat", topic, max_messages=32, wait_s=0.5):
                    now = time.time()
                    order_id = message_json(received.message)["id"]
                    if order_id in committed:
                        latencies[kind].append((now - committed[order_id]) * 1000)
                    client.ack("lat", received.receipt_handle)

    @event.listens_for(Session, "after_commit", insert=True)
    def stamp(session: Session) -> None:
        order_id = session.info.pop("bench_order", None)
        if order_id:
            committed[order_id] = time.time()

    variants = Variants(url, broker_url, topic_prefix="bench.latency")
    lone = Variants(url, broker_url, topic_prefix="bench.lone")
    stop = threading.Event()
    workers: list[threading.Thread] = []
    senders: list[Callable[[], None]] = []
    for mode, topic in variants.topics.items():
        latencies[mode] = []
        senders.append(variants.calls[mode])
        workers.append(threading.Thread(target=consume, args=(topic, mode, stop)))
    for poll_s in args.poll_intervals:
        kind, topic = f"table outbox, relay every {poll_s * 1000:.0f} ms", f"bench.relay.{poll_s * 1000:.0f}ms"
        latencies[kind] = []
        senders.append(functools.partial(variants.table_outbox, topic))
        workers.append(threading.Thread(target=consume, args=(topic, kind, stop)))
        workers.append(threading.Thread(target=relay, args=(url, broker_url, topic, poll_s, stop)))
    alone = f"{DEFAULTS}, alone every 10 ms"
    latencies[alone] = []
    workers.append(threading.Thread(target=consume, args=(lone.topics[DEFAULTS], alone, stop)))
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.0)
        for _ in range(args.latency_samples):
            for send in senders:
                send()
            time.sleep(0.01)
        time.sleep(max(args.poll_intervals) + 1.5)
        for _ in range(args.latency_samples):
            lone.calls[DEFAULTS]()
            time.sleep(0.01)
        time.sleep(1.0)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
        event.remove(Session, "after_commit", stamp)
        variants.close()
        lone.close()
    print(f"\n{'commit -> handler latency':<40}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}"
          "  (issue 24: ours p99 <= 3.15 ms)")
    for kind, values in latencies.items():
        print(f"{kind:<40}{len(values):>6}{percentile(values, 0.5):>10.2f}{percentile(values, 0.99):>10.2f}"
              f"{statistics.fmean(values) if values else float('nan'):>10.2f}")
    for mode in variants.refused:
        print(f"{mode:<40}{'n/a':>6}")


#: The steps of one call, each ended by an engine event (the last by the call's return).
STEPS = ("call -> BEGIN", "BEGIN -> transaction_log INSERT", "transaction_log INSERT", "-> business INSERT",
         "business INSERT", "-> COMMIT", "COMMIT -> call returns")
TIMELINE_CASES = ("bare + transaction_log row", DEFAULTS)


def timeline(url: str, broker_url: str, rounds: int, calls: int = 1000) -> None:
    """``--timeline``: where a decorated call's wall time goes at 1 client. The decorator
    (defaults) and a bare transaction that writes the same transaction_log row first
    (``record_committed``) alternate in rounds; each step between the engine's events
    (BEGIN, each statement sent and answered, COMMIT) is timed per call, and the table
    prints each step's median and what the decorator adds to it: building the message
    and sending the half before BEGIN, awaiting the half's answer before COMMIT, the
    END after it."""
    variants = Variants(url, broker_url)
    marks: list[float] = []

    def mark(*_: Any) -> None:
        marks.append(time.perf_counter())

    for name in ("begin", "before_cursor_execute", "after_cursor_execute", "commit"):
        event.listen(variants.engine, name, mark)

    def bare_with_row() -> None:
        with variants.factory.begin() as session:
            record_committed(session, uuid.uuid4().hex, "bench-timeline")
            session.execute(orders.insert().values(id=uuid.uuid4().hex, amount=1))

    cases = dict(zip(TIMELINE_CASES, (bare_with_row, variants.calls[DEFAULTS]), strict=True))
    steps: dict[str, list[list[float]]] = {case: [[] for _ in STEPS] for case in cases}

    def run(case: str) -> None:
        call = cases[case]
        for _ in range(calls):
            marks.clear()
            mark()
            call()
            mark()
            if len(marks) == len(STEPS) + 1:  # else not the shape timed: skipped
                for step, (began, ended) in zip(steps[case], itertools.pairwise(marks), strict=True):
                    step.append((ended - began) * 1e6)

    try:
        for case in cases:  # warm-up
            run(case)
            steps[case] = [[] for _ in STEPS]
        alternating_rounds(rounds, {case: functools.partial(run, case) for case in cases})
    finally:
        variants.close()
    bare, decorated = (steps[case] for case in TIMELINE_CASES)
    print(f"\n{'timeline at 1 client, median µs per step':<44}{'bare + row':>12}{'decorator':>12}{'added':>9}"
          f"  ({rounds} alternating rounds of {calls:,} calls each)")
    for name, plain, ours in zip(STEPS, bare, decorated, strict=True):
        plain_us, ours_us = statistics.median(plain), statistics.median(ours)
        print(f"{name:<44}{plain_us:>12,.0f}{ours_us:>12,.0f}{ours_us - plain_us:>+9,.0f}")
    plain_total = statistics.median(map(sum, zip(*bare, strict=True)))
    ours_total = statistics.median(map(sum, zip(*decorated, strict=True)))
    print(f"{'the call (median of the sums)':<44}{plain_total:>12,.0f}{ours_total:>12,.0f}{ours_total - plain_total:>+9,.0f}")


def profile_decorator(url: str, broker_url: str, seconds: float) -> None:
    """``--profile``: the decorator with its defaults at 1 client under cProfile (this
    calling thread only: the client's Python); the top 10 functions by self CPU time per message."""
    variants = Variants(url, broker_url)
    call = variants.calls[DEFAULTS]
    profile_path = Path(tempfile.mkdtemp(prefix="hm-outbox-profile-")) / "decorator.pstats"
    profiler = cProfile.Profile(time.thread_time)
    start = time.perf_counter()
    profiler.enable()
    rate = timed(seconds, repeat(call))
    profiler.disable()
    done = round(rate * (time.perf_counter() - start))
    profiler.dump_stats(profile_path)
    variants.close()
    print_profile(profile_path, "@transactional_message (defaults), 1 client, the calling thread", done)
    shutil.rmtree(profile_path.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per variant and client setting")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per client setting")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--poll-intervals", default="0.1,1",
                        help="the table outbox relay's poll intervals in seconds, comma-separated; the first is "
                             "used during the throughput runs")
    parser.add_argument("--only", choices=["sync", "async"], help="run only the blocking or the asyncio part")
    parser.add_argument("--profile", action="store_true",
                        help="then the decorator (defaults, 1 client) under cProfile: top 10 functions per message")
    parser.add_argument("--timeline", action="store_true",
                        help="then where a decorated call's time goes at 1 client: each step between the "
                             "engine's events, next to a bare transaction writing the same transaction_log row")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of about a minute: 2 rounds of 0.5 s per variant, 50 latency samples")
    args = parser.parse_args()
    args.poll_intervals = [float(interval) for interval in args.poll_intervals.split(",")]
    if args.quick:
        args.seconds, args.rounds, args.latency_samples = 1.0, 2, min(args.latency_samples, 50)
    print(machine_load("at start"), flush=True)
    work = Path(tempfile.mkdtemp(prefix="hm-outbox-bench-"))
    try:
        with scratch_postgres(args.postgres) as url, halfmoon_process(work / "b") as (broker, port):
            broker_url = f"tcp://127.0.0.1:{port}"
            engine = create_engine(url, pool_size=20)
            app.create_all(engine)
            outbox_metadata.create_all(engine)
            engine.dispose()
            if args.only != "async":
                throughput(url, broker_url, broker.pid, args)
                latency(url, broker_url, args)
                if args.timeline:
                    timeline(url, broker_url, args.rounds, calls=300 if args.quick else 1000)
                if args.profile:
                    profile_decorator(url, broker_url, args.seconds)
            if args.only != "sync":
                async_overhead(url, broker_url, broker.pid, args.seconds, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
