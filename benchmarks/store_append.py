"""Message store append throughput and recovery time, next to a raw write+fsync peer.

    .venv/bin/python benchmarks/store_append.py [--seconds 3] [--recovery-mib 1024]

Rows, for 256 B and 1 KiB bodies:

* raw fsync peer: one ``os.write`` + ``os.fsync`` per record on a plain file (what a
  store without group commit could at best do sequentially);
* sync, N putters: ``put`` from N threads, each acknowledged after an fsync covering it
  (group commit lets concurrent putters share fsyncs);
* sync put_batch: batches of 64 records, one fsync each;
* async: ``put`` from one thread, fsync every ``async_flush_interval_s``.

Recovery: a child process writes ``--recovery-mib`` of 256 B records, is SIGKILLed after
its last periodic checkpoint, and the parent times the reopen.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord

SIZES = (256, 1024)
BATCH = 64
#: (label, threads, flush mode or "raw" for the peer, records per put call)
CASES = (
    ("raw write+fsync peer, 1 thread", 1, "raw", 1),
    ("sync put, 1 putter", 1, "sync", 1),
    ("sync put, 8 putters", 8, "sync", 1),
    ("sync put, 64 putters", 64, "sync", 1),
    (f"sync put_batch({BATCH}), 1 thread", 1, "sync", BATCH),
    ("async put, 1 thread", 1, "async", 1),
)


def _record(body: bytes, n: int) -> StoredRecord:
    return StoredRecord(topic="bench", queue_id=n % 8, body=body, properties={"UNIQ_KEY": f"m{n}"})


def _timed(seconds: float, threads: int, work: Callable[[int, threading.Event], int]) -> float:
    """Run ``work(worker, stop)`` in ``threads`` threads for ``seconds``; records/s."""
    stop = threading.Event()
    counts = [0] * threads

    def run(worker: int) -> None:
        counts[worker] = work(worker, stop)

    pool = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in pool:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def raw_fsync_peer(directory: Path, size: int, seconds: float) -> float:
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    payload = os.urandom(size)

    def work(_worker: int, stop: threading.Event) -> int:
        done = 0
        while not stop.is_set():
            os.write(fd, payload)
            os.fsync(fd)
            done += 1
        return done

    try:
        return _timed(seconds, 1, work)
    finally:
        os.close(fd)


def store_rate(
    directory: Path, size: int, seconds: float, threads: int, mode: str, batch: int = 1
) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--recovery-mib", type=int, default=1024)
    args = parser.parse_args()
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        base = Path(tmp)
        for size in SIZES:
            for label, threads, mode, batch in CASES:
                directory = base / f"{size}-{len(rows)}"
                directory.mkdir()
                if mode == "raw":
                    rate = raw_fsync_peer(directory, size, args.seconds)
                else:
                    rate = store_rate(directory, size, args.seconds, threads, mode, batch)
                rows.append((label, size, rate))
                print(f"{label:<34} {size:>5} B  {rate:>12,.0f} records/s", flush=True)
                subprocess.run(["rm", "-rf", str(directory)], check=True)
        records, seconds, indexed = recovery(base / "recovery", args.recovery_mib)
    print()
    print(f"{'case':<34} {'body':>7}  {'records/s':>12}")
    for label, size, rate in rows:
        print(f"{label:<34} {size:>5} B  {rate:>12,.0f}")
    print(f"recovery after SIGKILL: {args.recovery_mib} MiB, {records:,} records: open {seconds:.2f} s, "
          f"index loaded {indexed:.2f} s")


if __name__ == "__main__":
    main()
