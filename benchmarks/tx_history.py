"""Transaction history at scale: what 10k / 100k / 1M completed transactions cost one broker.

    ./dev bench tx_history [--sizes 10000 100000 1000000] [--10m] [--runs 3] [--window 6]

For each size, in a fresh data directory, every step in its own child process (so RSS is
the broker's alone, and a restart starts a new interpreter):

1. build: ``EmbeddedBroker`` with the store in async flush mode (history is built fast;
   its durability is not what is measured) and ``--build-threads`` threads running N
   transactions, each ``send_half`` of one 256 B message then END_TRANSACTION COMMIT.
   RSS (``/proc/self/statm``) is read after 1,000 warm-up transactions and after the N;
   growth per transaction = the difference / the transactions in between. The broker is
   then closed normally.
2. measure, ``--runs`` times: open the directory as ``serve`` does (sync flush, default
   config), timing the open (restart time), RSS after it; 8 pending transactions, then
   ``checks.run_once()`` timed 5 times (median), then those 8 committed; a latency window
   of ``--window`` s: ``--writers`` threads doing send_half + END COMMIT one after the
   other, paced to ``--rate`` tx/s in all (latency is each call's own time; a writer
   that falls behind does not burst), while another thread calls ``write_snapshots()``
   every ``--snapshot-every`` s (the store's checkpoint and the broker's check rounds run
   as usual); the sizes of the snapshot files in the data directory; close. The window's
   transactions stay in the history: run k measures size + the earlier runs' windows.

Figures are medians over the runs, (min-max) beside them. Uses only ``EmbeddedBroker``'s
constructor, ``send_half``, ``end_transaction``, ``checks.run_once``, ``write_snapshots``
and ``close``; a figure whose method is missing prints as n/a.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import percentile, rss_bytes, summary

from broker_embedded import EmbeddedBroker, Message, Resolution
from broker_embedded.broker.config import BrokerConfig
from broker_embedded.store.config import StoreConfig

TOPIC = "tx-history"
GROUP = "bench"
BODY = b"h" * 256
WARM_UP = 1_000
PENDING = 8
ROUNDS = 5
RESULT = "RESULT "
#: (row label, result key, format, target text, scale applied to the raw value)
ROWS: tuple[tuple[str, str, str, str, float], ...] = (
    ("history build (tx/s, async flush)", "build_tx_s", ",.0f", "", 1.0),
    ("RSS growth per tx, live (B)", "rss_per_tx", ",.0f", "<= 100 B", 1.0),
    ("RSS per tx after restart (B)", "rss_after_restart_per_tx", ",.0f", "", 1.0),
    ("check round, 8 pending (ms)", "check_round_s", ",.2f", "<= 5 ms at 1M", 1000.0),
    ("send_half+END p50 (ms)", "p50_s", ",.2f", "", 1000.0),
    ("send_half+END p99 (ms)", "p99_s", ",.2f", "", 1000.0),
    ("send_half+END worst (ms)", "worst_s", ",.1f", "<= 50 ms", 1000.0),
    ("tx/s done in the window", "window_tx_s", ",.0f", "", 1.0),
    ("write_snapshots() call (ms, worst)", "snapshot_call_s", ",.1f", "", 1000.0),
    ("snapshot files (MiB)", "snapshot_bytes", ",.2f", "", 1 / 2**20),
    ("restart: open returns (s)", "restart_s", ",.2f", "<= 3 s at 1M", 1.0),
    ("close (s)", "close_s", ",.2f", "", 1.0),
)


def transaction(broker: EmbeddedBroker, tx_id: str) -> None:
    """One completed transaction: a 256 B half message, then COMMIT."""
    broker.send_half(Message(TOPIC, BODY), producer_group=GROUP, transaction_id=tx_id)
    broker.end_transaction(tx_id, Resolution.COMMIT, producer_group=GROUP)


def in_threads(threads: int, work: Callable[[int], None]) -> None:
    """Run ``work(index)`` in ``threads`` threads and wait for them."""
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def report(result: dict[str, Any]) -> None:
    """Hand a child's figures to the parent (the last stdout line)."""
    print(RESULT + json.dumps(result), flush=True)


# -- child: build ---------------------------------------------------------------------------
def build(data_dir: Path, total: int, threads: int, max_rss: int) -> None:
    """Run ``total`` transactions into a new broker; report rate and RSS growth."""
    broker = EmbeddedBroker(data_dir, BrokerConfig(store=StoreConfig(flush_mode="async")))
    gc.collect()
    rss_empty = rss_bytes()
    for i in range(WARM_UP):
        transaction(broker, f"w{i}")
    gc.collect()
    rss_warm = rss_bytes()
    todo = total - WARM_UP
    step = max(1, todo // 10)
    aborted_at: int | None = None
    start = time.perf_counter()

    def work(worker: int) -> None:
        nonlocal aborted_at
        for i in range(worker, todo, threads):
            if aborted_at is not None:
                return
            transaction(broker, f"t{i}")
            if i % step == 0 and i:
                rss = rss_bytes()
                print(f"  built {i:,} of {todo:,} ({i / (time.perf_counter() - start):,.0f} tx/s, "
                      f"RSS {rss / 2**20:,.0f} MiB)", file=sys.stderr, flush=True)
                if rss > max_rss:
                    aborted_at = i

    in_threads(threads, work)
    elapsed = time.perf_counter() - start
    gc.collect()
    rss_end = rss_bytes()
    done = todo if aborted_at is None else aborted_at
    broker.close()
    report({"build_tx_s": done / elapsed, "rss_per_tx": (rss_end - rss_warm) / max(done, 1),
            "rss_empty": rss_empty, "rss_end": rss_end, "aborted_at": aborted_at})


# -- child: measure -------------------------------------------------------------------------
def _time_check_round(broker: EmbeddedBroker, run: int) -> float | None:
    """Median time of ``checks.run_once()`` with a few pending transactions present."""
    run_once = getattr(getattr(broker, "checks", None), "run_once", None)
    if run_once is None:
        return None
    pending = [f"pending-{run}-{k}" for k in range(PENDING)]
    for tx_id in pending:
        broker.send_half(Message(TOPIC, BODY), producer_group=GROUP, transaction_id=tx_id)
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    for tx_id in pending:
        broker.end_transaction(tx_id, Resolution.COMMIT, producer_group=GROUP)
    return statistics.median(times)


def _latency_window(broker: EmbeddedBroker, run: int, seconds: float, writers: int, rate: float,
                    snapshot_every: float) -> dict[str, Any]:
    """Send_half+END latencies from ``writers`` threads, together ``rate`` tx/s (0: as fast
    as they can), while snapshots are written."""
    latencies: list[list[float]] = [[] for _ in range(writers)]
    snapshot_calls: list[float] = []
    stop = time.perf_counter() + seconds
    write_snapshots = getattr(broker, "write_snapshots", None)

    def snapshots() -> None:
        while write_snapshots is not None and time.perf_counter() + snapshot_every < stop:
            time.sleep(snapshot_every)
            begun = time.perf_counter()
            write_snapshots()
            snapshot_calls.append(time.perf_counter() - begun)

    def writer(index: int) -> None:
        interval = writers / rate if rate else 0.0
        n, next_at = 0, time.perf_counter() + index * interval / writers
        while time.perf_counter() < stop:
            time.sleep(max(0.0, next_at - time.perf_counter()))
            begun = time.perf_counter()
            transaction(broker, f"window-{run}-{index}-{n}")
            latencies[index].append(time.perf_counter() - begun)
            next_at = max(next_at + interval, begun)  # after a stall, no burst to catch up
            n += 1

    snapshotter = threading.Thread(target=snapshots)
    snapshotter.start()
    started = time.perf_counter()
    in_threads(writers, writer)
    elapsed = time.perf_counter() - started
    snapshotter.join()
    merged = [x for per_thread in latencies for x in per_thread]
    return {"p50_s": percentile(merged, 0.5), "p99_s": percentile(merged, 0.99), "worst_s": max(merged),
            "window_tx_s": len(merged) / elapsed, "window_tx": len(merged), "snapshot_call_s": max(snapshot_calls, default=None),
            "snapshots_in_window": len(snapshot_calls)}


def snapshot_bytes(data_dir: Path) -> int:
    """Total size of the files named like snapshots anywhere under ``data_dir``."""
    return sum(p.stat().st_size for p in data_dir.rglob("*snapshot*") if p.is_file())


def measure(data_dir: Path, history: int, rss_empty: int, run: int, seconds: float, writers: int,
            rate: float, snapshot_every: float) -> None:
    """Restart on ``data_dir`` and measure a broker holding ``history`` transactions."""
    start = time.perf_counter()
    broker = EmbeddedBroker(data_dir, BrokerConfig())
    restart_s = time.perf_counter() - start
    gc.collect()
    result: dict[str, Any] = {"restart_s": restart_s,
                              "rss_after_restart_per_tx": (rss_bytes() - rss_empty) / history}
    result["check_round_s"] = _time_check_round(broker, run)
    result.update(_latency_window(broker, run, seconds, writers, rate, snapshot_every))
    result["snapshot_bytes"] = snapshot_bytes(data_dir)
    start = time.perf_counter()
    broker.close()
    result["close_s"] = time.perf_counter() - start
    report(result)


# -- parent ---------------------------------------------------------------------------------
def child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this script as a child with ``args``; its reported figures."""
    done = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True,
                          timeout=timeout, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    return dict(json.loads(lines[-1][len(RESULT):]))


def one_size(size: int, args: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    """Build ``size`` transactions, then measure ``args.runs`` times; samples per figure."""
    data_dir = work / f"h{size}"
    print(f"{size:,} transactions: building", file=sys.stderr, flush=True)
    built = child(["--child", "build", str(data_dir), str(size), str(args.build_threads),
                   str(int(args.max_rss_gib * 2**30))], args.child_timeout)
    samples: dict[str, list[float]] = {key: [float(built[key])] for key in ("build_tx_s", "rss_per_tx")}
    if built["aborted_at"] is not None:
        print(f"  aborted at {built['aborted_at']:,}: RSS over {args.max_rss_gib} GiB", file=sys.stderr)
        samples["aborted_at"] = [float(built["aborted_at"])]
        return samples
    history = size
    for run in range(args.runs):
        measured = child(["--child", "measure", str(data_dir), str(history), str(built["rss_empty"]), str(run),
                          str(args.window), str(args.writers), str(args.rate), str(args.snapshot_every)],
                         args.child_timeout)
        history += measured["window_tx"] + PENDING
        print(f"  run {run + 1}: {json.dumps(measured)}", file=sys.stderr, flush=True)
        for key, value in measured.items():
            if value is not None:
                samples.setdefault(key, []).append(float(value))
    shutil.rmtree(data_dir, ignore_errors=True)
    return samples


def print_table(results: dict[int, dict[str, list[float]]], args: argparse.Namespace) -> None:
    sizes = list(results)
    print(f"transaction history in one broker: median of {args.runs} runs (min-max); build and live RSS once "
          f"per size; latency window {args.window:g} s, {args.writers} writers, {args.rate:,.0f} tx/s offered "
          f"(0 = unpaced), write_snapshots() every {args.snapshot_every:g} s")
    print(f"{'figure':<38}" + "".join(f"{f'{size:,} tx':>30}" for size in sizes) + f"{'target':>16}")
    for label, key, fmt, target, scale in ROWS:
        cells = "".join(f"{summary([v * scale for v in results[size].get(key, [])], fmt):>30}" for size in sizes)
        print(f"{label:<38}{cells}{target:>16}")
    for size in sizes:
        if "aborted_at" in results[size]:
            print(f"{size:,} tx: build aborted at {results[size]['aborted_at'][0]:,.0f} (RSS limit)")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, data_dir, *rest = sys.argv[2:]
        if kind == "build":
            build(Path(data_dir), int(rest[0]), int(rest[1]), int(rest[2]))
        else:
            measure(Path(data_dir), int(rest[0]), int(rest[1]), int(rest[2]), float(rest[3]), int(rest[4]),
                    float(rest[5]), float(rest[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--10m", dest="ten_million", action="store_true", help="add 10,000,000 to --sizes")
    parser.add_argument("--runs", type=int, default=3, help="measure runs (restarts) per size")
    parser.add_argument("--window", type=float, default=6.0, help="latency window (s)")
    parser.add_argument("--writers", type=int, default=4, help="threads in the latency window")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="tx/s offered in the latency window, all writers together (0: unpaced)")
    parser.add_argument("--snapshot-every", type=float, default=1.5, help="write_snapshots() period (s)")
    parser.add_argument("--build-threads", type=int, default=2)
    parser.add_argument("--max-rss-gib", type=float, default=12.0, help="abort a build above this RSS")
    parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds per child process")
    parser.add_argument("--dir", help="parent of the data directories (default: a new temp dir)")
    args = parser.parse_args()
    sizes = [*args.sizes, *([10_000_000] if args.ten_million else [])]
    if min(sizes) <= WARM_UP:
        parser.error(f"sizes must exceed the {WARM_UP:,} warm-up transactions")
    work = Path(tempfile.mkdtemp(prefix="hm-txhistory-", dir=args.dir))
    try:
        results = {size: one_size(size, args, work) for size in sizes}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(results, args)


if __name__ == "__main__":
    main()
