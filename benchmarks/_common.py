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
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(port)


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


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def code_env(code: Path) -> dict[str, str]:
    """This environment with checkout ``code`` first on PYTHONPATH."""
    path = [str(code), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


@contextmanager
def halfmoon_process(data_dir: Path, *extra: str,
                     code: Path | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A ``python -m broker_embedded serve`` process on a free port (sync flush unless
    ``extra`` says otherwise), running checkout ``code`` if given (first on its PYTHONPATH
    and its working directory, which ``-m`` puts before it); yields it and its port,
    terminates it on exit."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "broker_embedded", "serve", "--data-dir", str(data_dir.resolve()), "--port", str(port),
         "--log-level", "WARNING", *extra],
        env=code_env(code) if code else None, cwd=code,
    )
    try:
        wait_port(port)
        yield server, port
    finally:
        server.terminate()
        server.wait(timeout=60)


@contextmanager
def halfmoon_server(data_dir: Path, *extra: str) -> Iterator[str]:
    """``halfmoon_process``; yields its ``tcp://`` URL."""
    with halfmoon_process(data_dir, *extra) as (_, port):
        yield f"tcp://127.0.0.1:{port}"


@contextmanager
def redis_server(folder: Path) -> Iterator[int]:
    """A private redis-server, ``appendonly yes, appendfsync always``; yields its port."""
    port = free_port()
    folder.mkdir(parents=True)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                               "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                              stdout=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)
