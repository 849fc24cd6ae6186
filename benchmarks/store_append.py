"""Message store append throughput, CPU per record and recovery time, next to raw write+sync peers.

    .venv/bin/python benchmarks/store_append.py [--seconds 3] [--recovery-mib 1024]
        [--only TEXT] [--profile] [--compare CHECKOUT --rounds 3]

Rows, for 256 B and 1 KiB bodies, each with records/s and the process's CPU time (user +
system, all threads) per record:

* raw fsync / fdatasync peers: one ``os.pwrite`` + ``os.fsync`` (or ``os.fdatasync``) per
  record on a growing plain file (what a store without group commit could at best do
  sequentially; the pair shows what fdatasync saves on this filesystem); and ``over zeros``:
  ``os.pwrite`` + ``os.fdatasync`` over zeros written ahead as the commit log writes them
  (what a sync that writes no file size saves);
* sync, N putters: ``put`` from N threads, each acknowledged after an fsync covering it
  (group commit lets concurrent putters share fsyncs);
* sync put_batch: batches of 64 records, one fsync each;
* async: ``put`` from one thread, fsync every ``async_flush_interval_s``.

Recovery: a child process writes ``--recovery-mib`` of 256 B records, is SIGKILLed after
its last periodic checkpoint, and the parent times the reopen.

``--profile``: cProfile of sync ``put_batch(64)`` of 256 B records, the 10 functions with the
most own time, in microseconds per record. ``--compare CHECKOUT``: run the rows (no
recovery) ``--rounds`` times alternately against CHECKOUT's store and this tree's, each in
its own process, and print medians and ratios (the machine's load hits both sides alike).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _common import code_env

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord

SIZES = (256, 1024)
BATCH = 64
#: The raw peer's zeros written ahead (the commit log's ``PREALLOCATE_BYTES``; a checkout
#: compared with may not have it).
AHEAD_BYTES = 1 << 20
#: (label, threads, flush mode or the raw peer's sync call, records per put call)
CASES = (
    ("raw write+fsync peer, 1 thread", 1, "fsync", 1),
    ("raw write+fdatasync peer, 1 thread", 1, "fdatasync", 1),
    ("raw fdatasync over zeros peer, 1 thread", 1, "ahead", 1),
    ("sync put, 1 putter", 1, "sync", 1),
    ("sync put, 8 putters", 8, "sync", 1),
    ("sync put, 64 putters", 64, "sync", 1),
    (f"sync put_batch({BATCH}), 1 thread", 1, "sync", BATCH),
    ("async put, 1 thread", 1, "async", 1),
)


def _record(body: bytes, n: int) -> StoredRecord:
    return StoredRecord(topic="bench", queue_id=n % 8, body=body, properties={"UNIQ_KEY": f"m{n}"})


Rate = tuple[float, float]  # records/s, CPU microseconds per record


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _timed(seconds: float, threads: int, work: Callable[[int, threading.Event], int]) -> Rate:
    """Run ``work(worker, stop)`` in ``threads`` threads for ``seconds``; records/s and the
    process's CPU microseconds per record."""
    stop = threading.Event()
    counts = [0] * threads

    def run(worker: int) -> None:
        counts[worker] = work(worker, stop)

    pool = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
    started, cpu = time.perf_counter(), _cpu_seconds()
    for thread in pool:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in pool:
        thread.join()
    done = max(sum(counts), 1)
    return done / (time.perf_counter() - started), (_cpu_seconds() - cpu) / done * 1e6


def raw_sync_peer(directory: Path, size: int, seconds: float, sync: Callable[[int], None],
                  ahead: bool = False) -> Rate:
    """One ``pwrite`` + ``sync`` per record on a plain file that grows with each record or,
    ``ahead``, holds zeros written ahead of them (``AHEAD_BYTES`` more once half of them are
    used, as the commit log does with its ``PREALLOCATE_BYTES``)."""
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT, 0o644)
    payload = os.urandom(size)
    zeros = bytes(AHEAD_BYTES)

    def work(_worker: int, stop: threading.Event) -> int:
        done = end = allocated = 0
        while not stop.is_set():
            os.pwrite(fd, payload, end)
            end += size
            if ahead and allocated - end < AHEAD_BYTES // 2:
                allocated = end + os.pwrite(fd, zeros, end)
            sync(fd)
            done += 1
        return done

    try:
        return _timed(seconds, 1, work)
    finally:
        os.close(fd)


def store_rate(
    directory: Path, size: int, seconds: float, threads: int, mode: str, batch: int = 1
) -> Rate:
    config = StoreConfig(flush_mode=mode, segment_size=64 * 1024 * 1024)  # type: ignore[arg-type]
    body = os.urandom(size)
    with MessageStore(directory, config) as store:

        def work(worker: int, stop: threading.Event) -> int:
            done = 0
            while not stop.is_set():
                if batch == 1:
                    store.put(_record(body, worker))
                else:
                    store.put_batch([_record(body, done + n) for n in range(batch)])
                done += batch
            return done

        return _timed(seconds, threads, work)


WRITER = r"""
import os, sys, time
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
store = MessageStore(sys.argv[1], StoreConfig(flush_mode="async", checkpoint_interval_s=1.0))
total, body = int(sys.argv[2]), os.urandom(256)
written, n = 0, 0
while written < total:
    batch = [StoredRecord(topic="bench", queue_id=i % 8, body=body,
                          properties={"UNIQ_KEY": f"m{n + i}"}) for i in range(256)]
    written += sum(r.size for r in store.put_batch(batch))
    n += 256
store.flush()
time.sleep(2.5)  # let a periodic checkpoint cover most of the log
print(n, flush=True)
time.sleep(3600)
"""


def recovery(directory: Path, mib: int) -> tuple[int, float, float]:
    """Records written, seconds to reopen, seconds until the index is loaded too."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(mib * 1024 * 1024)],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    records = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    started = time.perf_counter()
    store = MessageStore(directory)
    elapsed = time.perf_counter() - started
    assert store.lookup_message_id(f"m{records - 1}")  # waits for the index load
    indexed = time.perf_counter() - started
    assert sum(store.queue_max_offset("bench", q) for q in range(8)) == records
    store.close()
    return records, elapsed, indexed


Row = tuple[str, int, float, float]  # label, body size, records/s, CPU us per record


def measure(base: Path, seconds: float, only: str, quiet: bool) -> list[Row]:
    rows: list[Row] = []
    for size in SIZES:
        for label, threads, mode, batch in CASES:
            if only not in label:
                continue
            directory = base / f"{size}-{len(rows)}"
            directory.mkdir()
            if mode in ("fsync", "fdatasync"):
                rate, cpu = raw_sync_peer(directory, size, seconds, getattr(os, mode))
            elif mode == "ahead":
                rate, cpu = raw_sync_peer(directory, size, seconds, os.fdatasync, ahead=True)
            else:
                rate, cpu = store_rate(directory, size, seconds, threads, mode, batch)
            rows.append((label, size, rate, cpu))
            if not quiet:
                print(f"{label:<36} {size:>5} B  {rate:>12,.0f} records/s  {cpu:>8.1f} us CPU/record", flush=True)
            subprocess.run(["rm", "-rf", str(directory)], check=True)
    return rows


def profile(base: Path, rounds: int = 400) -> None:
    """cProfile of sync put_batch(64), 256 B: the 10 functions with the most own time."""
    body = os.urandom(256)
    with MessageStore(base / "profile", StoreConfig(scrub_bytes_per_s=0)) as store:
        batches = [[_record(body, n * BATCH + i) for i in range(BATCH)] for n in range(rounds)]
        profiler = cProfile.Profile()
        profiler.enable()
        for records in batches:
            store.put_batch(records)
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = rounds * BATCH
    print(f"put_batch({BATCH}) of 256 B, cProfile, own time per record (us), top 10:")
    top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:10]
    for (filename, line, name), (_, calls, own, cumulative, _) in top:
        where = f"{Path(filename).name}:{line}({name})" if line else name
        print(f"  {own / total * 1e6:7.2f}  cumulative {cumulative / total * 1e6:7.2f}  "
              f"calls/record {calls / total:5.2f}  {where}")


def compare(checkout: Path, rounds: int, seconds: float, only: str) -> None:
    """Alternate rounds of the rows against ``checkout``'s store and this tree's."""
    trees = {"before": checkout.resolve(), "after": Path(__file__).resolve().parent.parent}
    results: dict[str, list[list[Row]]] = {"before": [], "after": []}
    for round_ in range(rounds):
        for side, tree in trees.items():
            out = subprocess.run(
                [sys.executable, __file__, "--json", "--seconds", str(seconds), "--only", only],
                env=code_env(tree), cwd=tree, check=True, capture_output=True, text=True,
            ).stdout
            results[side].append([tuple(row) for row in json.loads(out)])  # type: ignore[misc]
            print(f"round {round_ + 1} {side} done", file=sys.stderr, flush=True)
    print(f"before: {trees['before']}   after: {trees['after']}   {rounds} alternating rounds, medians")
    print(f"{'case':<36} {'body':>6} {'records/s before':>17} {'after':>9} {'ratio':>6}"
          f" {'CPU us/rec before':>18} {'after':>7} {'ratio':>6}")
    for index, (label, size, _, _) in enumerate(results["after"][0]):
        rate = {side: statistics.median(run[index][2] for run in runs) for side, runs in results.items()}
        cpu = {side: statistics.median(run[index][3] for run in runs) for side, runs in results.items()}
        print(f"{label:<36} {size:>4} B {rate['before']:>17,.0f} {rate['after']:>9,.0f} "
              f"{rate['after'] / rate['before']:>6.2f} {cpu['before']:>18.1f} {cpu['after']:>7.1f} "
              f"{cpu['after'] / cpu['before']:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--recovery-mib", type=int, default=1024, help="0: no recovery row")
    parser.add_argument("--only", default="", help="only the rows whose label contains this")
    parser.add_argument("--profile", action="store_true", help="profile put_batch instead")
    parser.add_argument("--compare", type=Path, help="a checkout to compare this tree's store with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # --compare's rounds
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.rounds, args.seconds, args.only)
        return
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        base = Path(tmp)
        if args.profile:
            profile(base)
            return
        rows = measure(base, args.seconds, args.only, args.json)
        if args.json:
            print(json.dumps(rows))
            return
        recovered = recovery(base / "recovery", args.recovery_mib) if args.recovery_mib else None
    print()
    print(f"{'case':<36} {'body':>7}  {'records/s':>12}  {'CPU us/record':>13}")
    for label, size, rate, cpu in rows:
        print(f"{label:<36} {size:>5} B  {rate:>12,.0f}  {cpu:>13.1f}")
    if recovered:
        records, seconds, indexed = recovered
        print(f"recovery after SIGKILL: {args.recovery_mib} MiB, {records:,} records: open {seconds:.2f} s, "
              f"index loaded {indexed:.2f} s")


if __name__ == "__main__":
    main()
