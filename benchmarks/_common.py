"""Helpers shared by the benchmarks: ports, timing, repeats, and the servers they start.

Benchmarks run as scripts (``./dev bench NAME``), so this module is imported as
``_common`` from the script's own directory.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Once something listens on ``port``; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(port) from None
            time.sleep(0.05)


def timed(seconds: float, step: Callable[[], int]) -> float:
    """Run ``step`` (returns how many operations it did) for ``seconds``; ops per second."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += step()
    return done / (time.perf_counter() - start)


def repeat(call: Callable[[], object]) -> Callable[[], int]:
    """A ``timed`` step that makes one call."""

    def step() -> int:
        call()
        return 1

    return step


async def concurrently(in_flight: int, seconds: float, step: Callable[[], Awaitable[int]]) -> int:
    """Keep ``in_flight`` loops of ``step`` (returns how many operations it did) running
    for ``seconds``; the operations done."""
    stop = time.perf_counter() + seconds

    async def loop() -> int:
        done = 0
        while time.perf_counter() < stop:
            done += await step()
        return done

    return sum(await asyncio.gather(*(loop() for _ in range(in_flight))))


def in_threads(clients: int, seconds: float, call: Callable[[], None]) -> tuple[float, list[float]]:
    """``clients`` threads calling ``call`` over and over for ``seconds``: calls per second
    over all of them, and each call's seconds."""
    durations: list[list[float]] = [[] for _ in range(clients)]
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        mine = durations[i]
        while (start := time.perf_counter()) < stop:
            call()
            mine.append(time.perf_counter() - start)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [d for mine in durations for d in mine]
    return len(every) / (time.perf_counter() - started), every


def in_processes(processes: int, target: Callable[..., None], args: tuple[Any, ...]) -> float:
    """Start ``processes`` copies of ``target(*args, out)``, each putting how many operations
    it did on ``out``; operations per second over all of them, start-up included."""
    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=target, args=(*args, out)) for _ in range(processes)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return float(total) / (time.perf_counter() - start)


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (0-1) of ``values``; NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def summary(samples: list[float], fmt: str = ",.1f") -> str:
    """``median`` of repeated runs, with their range when there are several."""
    if not samples:
        return "n/a"
    median = format(statistics.median(samples), fmt)
    if len(samples) == 1:
        return median
    return f"{median} ({format(min(samples), fmt)}-{format(max(samples), fmt)})"


def alternating_rounds(rounds: int, runs: dict[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Call every run once per round, in the given order on even rounds and reversed on odd
    ones, so a noisy neighbour (2 shared cores) hits all of them alike; each run's results,
    one per round. Quote the median of each, or of per-round ratios (``ratios``)."""
    results: dict[str, list[T]] = {name: [] for name in runs}
    for round_number in range(rounds):
        names = list(runs) if round_number % 2 == 0 else list(reversed(runs))
        for name in names:
            results[name].append(runs[name]())
    return results


def ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Per-round ratios of two runs' samples (pairs from the same round)."""
    return [n / d for n, d in zip(numerators, denominators, strict=True) if d]


def machine_load(when: str) -> str:
    """``when``, the load averages and the cores, for the first and last line of a run."""
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return (f"machine load {when}: loadavg {one} {five} {fifteen} (1, 5, 15 min), {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def code_env(code: Path) -> dict[str, str]:
    """This environment with checkout ``code`` first on PYTHONPATH."""
    path = [str(code), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


#: ``python -c`` code running ``python -m broker_embedded ARGS`` (argv[1] is the output, the
#: rest the broker's arguments) under cProfile, one profiler per thread (the event loop, the
#: executor's threads and the store's sync thread alike) timing that thread's CPU time (so
#: a thread blocked on a lock or a socket adds nothing). SIGUSR1 clears what they collected
#: (send it after a warm-up, so start-up and imports are left out); at exit (SIGTERM stops
#: the broker cleanly) the merged statistics are written to argv[1] for ``pstats``.
PROFILED_BROKER = r"""
import cProfile, pstats, runpy, signal, sys, threading, time
out = sys.argv.pop(1)
profiles = [cProfile.Profile(time.thread_time)]
def profile_thread(*_):
    profile = cProfile.Profile(time.thread_time)
    profiles.append(profile)
    profile.enable()
def restart(*_):
    for profile in list(profiles):
        profile.clear()
threading.setprofile(profile_thread)
signal.signal(signal.SIGUSR1, restart)
sys.argv[0] = "broker_embedded"
profiles[0].enable()
try:
    runpy.run_module("broker_embedded", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    profiles[0].disable()
    threading.setprofile(None)
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    stats.dump_stats(out)
"""


@contextmanager
def listening(server: subprocess.Popen[bytes], port: int) -> Iterator[None]:
    """Once ``server`` listens on ``port``; terminates it (and waits for it) on exit."""
    try:
        wait_port(port)
        yield
    finally:
        server.terminate()
        server.wait(timeout=60)


def serve_arguments(data_dir: Path, port: int, *extra: str) -> list[str]:
    """The arguments of ``python -m broker_embedded`` serving ``data_dir`` on ``port`` (sync
    flush unless ``extra`` says otherwise), logging at its default level, as users run it
    (what it logs per request is part of its cost)."""
    return ["serve", "--data-dir", str(data_dir.resolve()), "--port", str(port), *extra]


@contextmanager
def halfmoon_process(data_dir: Path, *extra: str, code: Path | None = None, profile_to: Path | None = None,
                     port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A ``python -m broker_embedded serve`` process on ``port`` (default: a free one) (sync flush unless
    ``extra`` says otherwise), running checkout ``code`` if given (first on its PYTHONPATH
    and its working directory, which ``-m`` puts before it), under cProfile writing to
    ``profile_to`` at exit if given (``PROFILED_BROKER``); yields it and its port,
    terminates it on exit. Its log goes to ``<data_dir>.log``, not to this run's output."""
    port = free_port() if port is None else port
    launcher = ["-m", "broker_embedded"] if profile_to is None else ["-c", PROFILED_BROKER, str(profile_to)]
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with data_dir.with_name(data_dir.name + ".log").open("ab") as log:
        server = subprocess.Popen([sys.executable, *launcher, *serve_arguments(data_dir, port, *extra)],
                                  env=code_env(code) if code else None, cwd=code, stdout=log, stderr=log)
    with listening(server, port):
        yield server, port


@contextmanager
def scratch_postgres(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database next to ``admin_url``'s for one run, as a SQLAlchemy psycopg
    URL; dropped (connections forced out) at the end."""
    import psycopg

    database = f"hm_bench_{os.urandom(4).hex()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        yield admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + database
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def print_profile(path: Path, title: str, operations: int, top: int = 10) -> None:
    """The ``top`` functions of a profile (``PROFILED_BROKER``'s, or one of this process
    timed by ``time.thread_time``) by self time, in µs per operation (``operations`` done
    while it ran) and as a share of all self time."""
    import pstats

    entries = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in entries.values())
    print(f"\n{title}: top {top} functions by self CPU time, {operations:,} operations, "
          f"{total / operations * 1e6:.1f} µs of profiled CPU per operation (cProfile inflates it; "
          f"read the shares)")
    print(f"{'µs/op':>8}{'share':>8}{'calls/op':>10}  function")
    ranked = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:top]
    for (filename, line, function), (_, calls, self_time, _, _) in ranked:
        where = f"{Path(filename).parent.name}/{Path(filename).name}:{line}" if line else filename
        print(f"{self_time / operations * 1e6:>8.2f}{self_time / total:>8.1%}{calls / operations:>10.2f}  "
              f"{function} ({where})")


def redis_command(folder: Path, port: int) -> list[str]:
    """A private redis-server's command line: its files in ``folder``, on ``port``, every write
    in its AOF and fsync'd before the answer (``appendfsync always``), no snapshots."""
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--appendonly", "yes",
            "--appendfsync", "always", "--save", ""]


@contextmanager
def redis_process(folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A private redis-server, ``appendonly yes, appendfsync always``; yields it and its port."""
    port = free_port()
    folder.mkdir(parents=True)
    server = subprocess.Popen(redis_command(folder, port), stdout=subprocess.DEVNULL)
    with listening(server, port):
        yield server, port
