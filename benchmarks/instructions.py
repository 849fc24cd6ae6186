"""Instructions per request (issue 24), counted by callgrind, next to Redis's: CPU work without the machine's noise.

Valgrind's callgrind counts the same within about 1 % from run to run, whatever else the
machine runs (the PostgreSQL rows within 2-6 %: whole processes of SQLAlchemy and psycopg,
whose start-up varies): a measure for judging a change to the hot paths where seconds only
show noise.

Each figure is user-space instructions per operation: a process run under callgrind for
1 operation and for ``--ops`` + 1 operations, the difference divided by ``--ops`` (start-up
and imports cancel out). Kernel work (system calls, the fsync itself) is not counted: it
is the same for both sides of a comparison and is most of what Redis spends.

- server, sequential send: the broker server (``python -m broker_embedded serve``, sync
  flush, no background scrub: its reads are paced in MiB per second, so a run slowed down
  by valgrind would count more of them per operation) under callgrind, a ``BrokerClient`` sending 256 B messages one at a time; next to
  Redis (``appendonly yes, appendfsync always``) doing XADD of 256 B under callgrind, the
  issue's peer;
- server, transaction: SEND_HALF_MESSAGE then END_TRANSACTION (COMMIT), both waited for;
- server, receive + ack: a topic of ``--ops`` messages drained by a consumer group, 256 a
  receive and one ``ack_many`` each (the count of the same run without the drain taken
  off), next to Redis's XREADGROUP of 256 and XACK of their ids, counted the same way;
- client, sequential send: the calling process (every thread) of those sends under
  callgrind, against a server running normally;
- client, receive + ack: the consumer's process of that drain (the count of the same
  process without the drain taken off), against a server running normally;
- client, producer transaction: ``outbox.Producer`` as a decorated call uses it without its
  database: ``start_half``, ``await_halves``, ``finish`` (the oneway END);
- client, the transactions of ``outbox_overhead`` on PostgreSQL (a scratch database): a bare
  INSERT+COMMIT, the table outbox's (the same plus an outbox row) and the decorated call
  (defaults), each the whole calling process: SQLAlchemy, psycopg and the outbox. What the
  table outbox and the decorated call add over the bare transaction is printed after the
  table: the issue's comparison on the client's side (a difference of two such counts:
  compare it between checkouts of one run, and only for changes of ~10 % or more).

``--baseline DIR`` counts another checkout the same way (``git archive <rev> | tar -x -C
DIR``), printed next to this one with the ratio. Run:
``python benchmarks/instructions.py [--ops 500] [--baseline DIR] [--only receive]``. Needs valgrind (on
every machine here) and redis-server; takes a few minutes.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import (
    code_env,
    free_port,
    halfmoon_process,
    machine_load,
    redis_command,
    scratch_postgres,
    serve_arguments,
    wait_port,
)
from outbox_overhead import app
from sqlalchemy import create_engine

from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata

ROOT = Path(__file__).resolve().parent.parent
BODY_BYTES = 256
#: valgrind runs a program some 50x slower: the servers' start-up takes seconds.
START_TIMEOUT_S = 120.0
CALLGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]

#: The client side's operations, run as ``python -c CLIENT_CODE <port> <ops> <workload>
#: <database url> <benchmarks folder>`` from the checkout measured.
CLIENT_CODE = r"""
import sys, uuid
from broker_embedded import BrokerClient, Message, Resolution
port, ops, workload, database, benchmarks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
url, body = f"tcp://127.0.0.1:{port}", b"x" * 256
if workload in TRANSACTIONS:
    sys.path.insert(0, benchmarks)
    import outbox_overhead
    variants = outbox_overhead.Variants(database, url, topic_prefix="instructions")
    call = variants.calls[TRANSACTIONS[workload]]
    for _ in range(ops):
        call()
    variants.flush()
    variants.close()
elif workload in ("fill", "drain"):
    client = BrokerClient(url, timeout_s=600)
    client.create_topic("instructions.drain", 4)
    for start in range(0, ops, 256):
        client.send_batch([Message("instructions.drain", body) for _ in range(min(256, ops - start))])
    while workload == "drain" and (batch := client.receive("instructions", "instructions.drain", max_messages=256)):
        assert not any(client.ack_many("instructions", [message.receipt_handle for message in batch]))
    client.close()
elif workload == "producer":
    from outbox import Producer
    producer = Producer(url, "instructions")
    for _ in range(ops):
        transaction_id = uuid.uuid4().hex
        producer.start_half(Message("instructions.tx", body), transaction_id)
        producer.await_halves(transaction_id)
        producer.finish(transaction_id, Resolution.COMMIT)
    producer.flush()
    producer.close()
else:
    client = BrokerClient(url, timeout_s=600)
    for _ in range(ops):
        if workload == "send":
            client.send(Message("instructions.send", body))
        else:
            transaction_id = uuid.uuid4().hex
            client.send_half(Message("instructions.tx", body), producer_group="instructions",
                             transaction_id=transaction_id)
            client.end_transaction(transaction_id, Resolution.COMMIT, producer_group="instructions")
    client.close()
"""
#: The database transactions of ``outbox_overhead`` counted on the client side, by the
#: workload names ``CLIENT_CODE`` takes.
TRANSACTIONS = {"bare": "bare INSERT+COMMIT", "table": "table outbox", "decorator": "decorator, defaults"}


def fixed_hashes(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (None: this one's) with string hashing fixed: a seed of its own per process
    would change dict and set layouts, and with them the counts, from run to run."""
    return {**(os.environ if env is None else env), "PYTHONHASHSEED": "0"}


def collected(stderr: str) -> int:
    """The instruction count callgrind prints at exit."""
    match = re.search(r"Collected : (\d+)", stderr)
    if match is None:
        raise RuntimeError(f"callgrind printed no count:\n{stderr[-2000:]}")
    return int(match.group(1))


def per_op(count: Callable[[int], int], ops: int) -> float:
    """Instructions per operation: the count for ``ops`` + 1 operations less the count for 1."""
    return (count(ops + 1) - count(1)) / ops


def run_client(code: Path, port: int, ops: int, workload: str, under_callgrind: bool, database: str = "") -> str:
    """Run ``CLIENT_CODE`` from checkout ``code``; its stderr."""
    source = f"TRANSACTIONS = {TRANSACTIONS!r}\n{CLIENT_CODE}"
    command = [*(CALLGRIND if under_callgrind else []), sys.executable, "-c", source, str(port), str(ops),
               workload, database, str(Path(__file__).resolve().parent)]
    done = subprocess.run(command, cwd=code, env=fixed_hashes(code_env(code)), capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise RuntimeError(f"the client failed:\n{done.stderr[-2000:]}")
    return done.stderr


@contextmanager
def counted_server(command: list[str], port: int, code: Path | None = None) -> Iterator[list[int]]:
    """A server started under callgrind; yields a list that holds its count once it has
    stopped (SIGTERM at the end of the block)."""
    server = subprocess.Popen([*CALLGRIND, *command], cwd=code, env=fixed_hashes(code_env(code) if code else None),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    count: list[int] = []
    try:
        wait_port(port, START_TIMEOUT_S)
        yield count
    finally:
        server.send_signal(signal.SIGTERM)
        stderr = server.communicate(timeout=600)[1]
    count.append(collected(stderr))


def broker_server(code: Path, workload: str, ops: int) -> int:
    """The broker server's count for ``ops`` operations of ``workload`` from a normal client."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hm-instructions-") as folder:
        command = [sys.executable, "-m", "broker_embedded",
                   # at WARNING, as the counts in benchmarks/results were taken
                   *serve_arguments(Path(folder) / "data", port, "--scrub-rate", "0", "--log-level", "WARNING")]
        with counted_server(command, port, code) as count:
            run_client(code, port, ops, workload, under_callgrind=False)
    return count[0]


@contextmanager
def counted_redis() -> Iterator[tuple[Any, list[int]]]:
    """A private Redis (``redis_command``) under callgrind and a client of it; the list holds
    its count once the block has ended and it has stopped."""
    import redis

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hm-instructions-redis-") as folder:
        with counted_server(redis_command(Path(folder), port), port) as count:
            client = redis.Redis(port=port)
            try:
                yield client, count
            finally:
                client.close()


def redis_server(ops: int) -> int:
    """Redis's count for ``ops`` XADDs of a 256 B field, one at a time, every write fsync'd."""
    with counted_redis() as (client, count):
        for _ in range(ops):
            client.xadd("instructions", {"body": b"x" * BODY_BYTES})
    return count[0]


def redis_drain(ops: int, drain: bool) -> int:
    """Redis's count for a stream of ``ops`` 256 B entries, then (``drain``) read by a
    consumer group 256 at a time (XREADGROUP) and acked (XACK of their ids)."""
    with counted_redis() as (client, count):
        pipeline = client.pipeline(transaction=False)
        for _ in range(ops):
            pipeline.xadd("drain", {"body": b"x" * BODY_BYTES})
        pipeline.execute()
        client.xgroup_create("drain", "instructions", id="0")
        while drain:
            read: Any = client.xreadgroup("instructions", "reader", {"drain": ">"}, count=256)
            if not read:
                break
            client.xack("drain", "instructions", *(entry_id for entry_id, _ in read[0][1]))
    return count[0]


def drained(count: Callable[[bool], int], ops: int) -> float:
    """Instructions per message drained: the count with the drain less the count without."""
    return (count(True) - count(False)) / ops


def client_side(code: Path, workload: str, ops: int, database: str = "") -> int:
    """The client process's count for ``ops`` operations of ``workload`` against a server
    running normally (this checkout's), on ``database`` for a transaction."""
    with tempfile.TemporaryDirectory(prefix="hm-instructions-") as folder:
        with halfmoon_process(Path(folder) / "data") as (_, port):
            return collected(run_client(code, port, ops, workload, under_callgrind=True, database=database))


def transaction(workload: str, database: str, code: Path, ops: int) -> float:
    """Instructions per transaction on the client's side, one of ``TRANSACTIONS`` on ``database``."""
    return per_op(lambda count: client_side(code, workload, count, database), ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=500, help="operations per count (the 1-operation run is subtracted)")
    parser.add_argument("--baseline", type=Path, help="another checkout, counted the same way")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--only", help="only the rows whose name contains this (Redis's are always counted)")
    args = parser.parse_args()
    print(machine_load("at start"))
    trees = {"halfmoon": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with scratch_postgres(args.postgres) as database:
        engine = create_engine(database)
        app.create_all(engine)
        outbox_metadata.create_all(engine)
        engine.dispose()
        measures: dict[str, Callable[[Path, int], float]] = {
            "server, sequential send": lambda code, ops: per_op(functools.partial(broker_server, code, "send"), ops),
            "server, send_half + END": lambda code, ops: per_op(functools.partial(broker_server, code, "tx"), ops),
            "server, receive + ack, per message": lambda code, ops: drained(
                lambda drain: broker_server(code, "drain" if drain else "fill", ops), ops),
            "client, sequential send": lambda code, ops: per_op(functools.partial(client_side, code, "send"), ops),
            "client, receive + ack, per message": lambda code, ops: drained(
                lambda drain: client_side(code, "drain" if drain else "fill", ops), ops),
            "client, producer transaction": lambda code, ops: per_op(
                functools.partial(client_side, code, "producer"), ops),
            **{f"client, {TRANSACTIONS[name]}": functools.partial(transaction, name, database) for name in TRANSACTIONS},
        }
        table(trees, measures, args)
    print(machine_load("at end"))


def table(trees: dict[str, Path], measures: dict[str, Callable[[Path, int], float]],
          args: argparse.Namespace) -> None:
    """Count every measure for every checkout and print them next to Redis's count."""
    xadd = per_op(redis_server, args.ops)
    xreadgroup = drained(functools.partial(redis_drain, args.ops), args.ops)
    rows: dict[str, dict[str, float]] = {}
    header = f"{'instructions per operation (callgrind)':<40}" + "".join(f"{name:>14}" for name in trees)
    print(f"\n{header}{'ours/baseline' if args.baseline else '':>15}{'ours/Redis':>12}")
    print(f"{'Redis XADD, appendfsync always':<40}{xadd:>14,.0f}")
    print(f"{'Redis XREADGROUP + XACK, per message':<40}{xreadgroup:>14,.0f}")
    for name, measure in measures.items():
        if args.only is not None and args.only not in name:
            continue
        counts = {tree: measure(code, args.ops) for tree, code in trees.items()}
        ours = counts["halfmoon"]
        line = f"{name:<40}" + "".join(f"{count:>14,.0f}" for count in counts.values())
        line += f"{ours / counts['baseline']:>15.2f}" if args.baseline else f"{'':>15}"
        redis = xreadgroup if "receive" in name else xadd
        print(line + (f"{ours / redis:>12.1f}" if name.startswith("server") else ""))
        rows[name] = counts
    if not all(f"client, {TRANSACTIONS[name]}" in rows for name in TRANSACTIONS):
        return
    bare, table_outbox, decorated = (rows[f"client, {TRANSACTIONS[name]}"] for name in TRANSACTIONS)
    for tree in trees:
        print(f"{tree}: over a bare transaction, the table outbox adds {table_outbox[tree] - bare[tree]:,.0f} "
              f"and the decorated call {decorated[tree] - bare[tree]:,.0f} client instructions")
    print(f"\n({args.ops} operations per count; {os.cpu_count()} cores; the counts do not depend on the load)")


if __name__ == "__main__":
    main()
