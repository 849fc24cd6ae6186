"""A new transaction's cost as the retained log grows, and what opening the index costs.

    ./dev bench index_history [--files 1 4 16 64] [--transactions 1000] [--baseline DIR] [--open-full]

The first half message of a transaction asks the index whether its id is an ended
transaction's (a late half of one is refused). The index keeps a file for every
``index_entries`` entries of the retained log, so that lookup must not cost more per file.

For this checkout and ``--baseline``'s (another checkout, e.g. ``git archive <rev> | tar -x
-C DIR``), each in a child process with its tree first on the path: an ``EmbeddedBroker`` in
process with the store in async flush mode (the CPU, not the disk), index files of 1,024
slots and 4,096 entries (the defaults' 1 : 4, at 1/1024 of their size), transactions of
one 256 B message (send_half + END COMMIT, 250 to a ``produce`` batch) until the index has
each of ``--files`` files; there, ``--transactions`` more, measured: preads of index files
(a counting file layer) and process CPU time per transaction. Each child then checks that
a late half of its first transaction is still refused.

``--open-full``: this checkout alone, one default-size index file (4M entries) filled to
its last thousand entries with a checkpoint every 262,144, then opened after a clean close,
as a crash leaves it (the filter a checkpoint wrote, up to an eighth of the file before:
the keys of the entries since are added) and without a filter file (an older version's, or
a crash before any checkpoint wrote one: built from all its entries).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import code_env

ROOT = Path(__file__).resolve().parents[1]
RESULT = "RESULT "
BATCH = 250
SLOTS, ENTRIES = 1024, 4096


def child(files: list[int], transactions: int) -> None:
    """Print a RESULT line: per index file count, index preads (slots, chains; a filter is
    memory-mapped) and CPU µs per transaction."""
    from broker_embedded import EmbeddedBroker, Message, Resolution
    from broker_embedded.broker.config import BrokerConfig
    from broker_embedded.broker.writes import EndCall, HalfCall
    from broker_embedded.store.config import StoreConfig
    from broker_embedded.store.filesystem import OsFileSystem

    class IndexReads(OsFileSystem):
        def __init__(self) -> None:
            self.reads = 0
            self.index_fds: set[int] = set()

        def open(self, path: Path, *, create: bool = False, truncate: bool = False, read_only: bool = False) -> int:
            fd = super().open(path, create=create, truncate=truncate, read_only=read_only)
            (self.index_fds.add if path.parent.name == "index" else self.index_fds.discard)(fd)
            return fd

        def pread(self, fd: int, length: int, position: int) -> bytes:
            self.reads += fd in self.index_fds
            return super().pread(fd, length, position)

    layer = IndexReads()
    store = StoreConfig(flush_mode="async", index_slots=SLOTS, index_entries=ENTRIES, filesystem=layer)
    done = 0

    def run(count: int) -> None:
        nonlocal done
        for start in range(done, done + count, BATCH):
            ids = [f"tx-{n}" for n in range(start, start + BATCH)]
            halves = broker.produce([HalfCall(Message("orders", b"h" * 256, keys=(i,)), "bench", i) for i in ids])
            ends = broker.produce([EndCall(i, Resolution.COMMIT, "bench") for i in ids])
            assert not [o for o in halves + ends if isinstance(o, Exception)]
        done += count

    rows = []
    with tempfile.TemporaryDirectory() as data, EmbeddedBroker(Path(data), BrokerConfig(store=store)) as broker:
        index = Path(data) / "index"
        for wanted in files:
            while len([p for p in index.iterdir() if p.name.isdigit()]) < wanted:
                run(BATCH * 4)
            layer.reads = 0
            cpu = time.process_time()
            run(transactions)
            rows.append({"files": len([p for p in index.iterdir() if p.name.isdigit()]),
                         "reads": layer.reads / transactions,
                         "cpu_us": (time.process_time() - cpu) / transactions * 1e6})
        [late] = broker.produce([HalfCall(Message("orders", b"late"), "bench", "tx-0")])
        assert isinstance(late, Exception), "a late half of an ended transaction was taken"
    print(RESULT + json.dumps(rows), flush=True)


def open_full() -> None:
    """Time opening a default-size index file nearly full: after a clean close, as a crash
    leaves it (its filter written by a checkpoint up to an eighth of the file before), and
    without a filter file."""
    from broker_embedded.store.config import StoreConfig
    from broker_embedded.store.index import MessageIndex
    from broker_embedded.store.index_filter import filter_path

    config = StoreConfig()
    with tempfile.TemporaryDirectory() as data:
        clean, crashed, unfiltered = (Path(data) / name for name in ("clean", "crashed", "unfiltered"))
        index = MessageIndex(clean, config.index_slots, config.index_entries)
        offset, batch = 0, 4096
        while offset + batch < config.index_entries - 1000:
            index.add_many([("orders", f"m-{offset + n}", [], offset + n) for n in range(batch)])
            offset += batch
            if offset // batch % 64 == 0:  # a checkpoint about every 262,000 entries
                index.persist(index.unpersisted())
        index.persist(index.unpersisted())
        shutil.copytree(clean, crashed)  # as a SIGKILL leaves it: nothing closed
        index.close()
        shutil.copytree(crashed, unfiltered)
        newest = filter_path(sorted(p for p in unfiltered.iterdir() if p.name.isdigit())[-1])
        newest.unlink()
        timings = {}
        for how, directory in (("after a clean close", clean), ("after a crash", crashed),
                               ("without a filter file", unfiltered)):
            started = time.perf_counter()
            index = MessageIndex(directory, config.index_slots, config.index_entries)
            timings[how] = time.perf_counter() - started
            index.close()
    print(f"\nopening an index file of {offset:,} entries (the default 4M-entry file):")
    for how, seconds in timings.items():
        print(f"  {how:<22} {seconds * 1000:>10,.0f} ms")


def measure(tree: Path, files: list[int], transactions: int) -> list[dict[str, float]]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--files", *map(str, files), "--transactions", str(transactions)],
        env=code_env(tree), capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith(RESULT))[len(RESULT):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--transactions", type=int, default=1000, help="measured at each size")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured the same way")
    parser.add_argument("--open-full", action="store_true", help="also time opening a full default-size file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.files, args.transactions)
        return
    trees = {"halfmoon": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    results = {name: measure(tree, args.files, args.transactions) for name, tree in trees.items()}
    print(f"a new transaction (send_half + END COMMIT) as index files accumulate, {args.transactions} measured at each:")
    print(f"{'index files':>12}" + "".join(f"{name + ' reads':>18}{name + ' µs CPU':>18}" for name in results))
    for n, row in enumerate(results["halfmoon"]):
        print(f"{row['files']:>12}" + "".join(
            f"{results[name][n]['reads']:>18.1f}{results[name][n]['cpu_us']:>18.0f}" for name in results))
    if args.open_full:
        open_full()


if __name__ == "__main__":
    main()
