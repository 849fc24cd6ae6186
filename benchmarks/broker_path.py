"""Broker CPU per sequential transaction (issue 24): what a ``@transactional_message``
call costs the broker, one SEND_HALF_MESSAGE and one END_TRANSACTION (COMMIT) of a 256 B
message, sync flush, at one client.

Three measures, each CPU time (robust to the shared machine's load), of two checkouts
(``--old``, default /work/main, and ``--new``, default this one), each in its own
long-lived child process, in alternating rounds; medians and per-round ratios:

- ``store+broker``: ``EmbeddedBroker.produce([HalfCall])`` then ``produce([EndCall])`` in a
  loop, ``time.process_time`` per transaction (every thread: the fsync included);
- ``+frames``: the same with the TCP server's per-request work around it: the request frame
  read and decoded, the write call built, the reply encoded;
- ``server``: a real ``halfmoon-broker serve`` process driven over TCP by this process (frames
  built beforehand) as a decorated call drives it: the half message waited for, the END
  not, the next call's half ``--gap-us`` after it (the caller's work between two calls);
  the server process's CPU per transaction from
  /proc (its background threads' ticks included), and ``server loop`` its event loop
  thread's alone.

Each checkout's END is sent as its producer sends it: ``oneway`` (no fsync of its own, the
next write's covers it) where the checkout has it.

``--client`` measures the other end instead: ``outbox.Producer`` over ``BrokerClient`` (sync,
over TCP) of each checkout, each in its own child process, against one server (this
checkout's), as a decorated call uses it without its database: ``start_half``, then
``await_halves`` (where the commit would follow), then ``finish`` (END COMMIT, oneway, not
waited for); from one thread and from ``--client-threads`` threads sharing the client. The client
process's CPU per call (every thread of it) and calls per second; ``--profile`` then profiles
the one-thread loop of each checkout.

``--profile`` prints the top functions per transaction of the ``+frames`` loop for both
checkouts. Run: ``python benchmarks/broker_path.py [--rounds 9] [--tx 1000] [--profile]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    alternating_rounds,
    code_env,
    cpu_seconds,
    halfmoon_process,
    machine_load,
    print_profile,
    ratios,
    summary,
)

HERE = Path(__file__).resolve().parent
NEW = HERE.parent
TOPIC = "bench-path"
GROUP = "bench-path-producers"
BODY = b"x" * 256


def _child() -> None:
    """A child running the checkout under test (first on its path): a broker on a scratch
    directory; each line on stdin (``core N``, ``frames N``, ``nosync N``: ``core`` with every
    fdatasync skipped, or ``profile N PATH``) runs N transactions and prints their CPU seconds per transaction as a JSON line."""
    import cProfile

    from broker_embedded.broker.facade import EmbeddedBroker
    from broker_embedded.broker.writes import EndCall, HalfCall
    from broker_embedded.message import Message, Resolution
    from broker_embedded.server.tcp import _batch_item
    from broker_embedded.wire.protocol import METHODS, FrameBuffer, encode_reply, read_frame
    from broker_embedded.wire.requests import decode_request
    from broker_embedded.wire.session import ClientSession

    session = ClientSession.__new__(ClientSession)  # only its request builders are used (no connection)
    fields = getattr(EndCall, "__struct_fields__", None) or getattr(EndCall, "__dataclass_fields__", ())
    oneway = {"oneway": True} if "oneway" in fields else {}  # as a decorated call sends it
    buffer = FrameBuffer()
    numbers = iter(range(1, 1 << 62))

    def serve(broker: EmbeddedBroker, data: bytes) -> None:
        """What the TCP server does with one request's bytes, the batch on the loop."""
        replies = []
        for payload in buffer.feed(data):
            frame = read_frame(payload)
            request = decode_request(frame.code, frame.body)
            outcome = broker.produce([_batch_item(METHODS[frame.code], request)])[0]
            if isinstance(outcome, Exception):
                raise outcome
            replies.append(encode_reply(frame.code, frame.request_id, outcome))
        b"".join(replies)

    def run(broker: EmbeddedBroker, count: int, frames: bool) -> float:
        batch = [next(numbers) for _ in range(count)]
        if frames:
            built = [(session.send_half(Message(TOPIC, BODY), producer_group=GROUP, transaction_id=f"tx-{n}")
                      .frame(2 * n), session.end_transaction(f"tx-{n}", Resolution.COMMIT, producer_group=GROUP, **oneway)
                      .frame(2 * n + 1)) for n in batch]
            began = time.process_time()
            for half, end in built:
                serve(broker, half)
                serve(broker, end)
            return (time.process_time() - began) / count
        calls = [(HalfCall(Message(TOPIC, BODY), GROUP, f"tx-{n}"),
                  EndCall(f"tx-{n}", Resolution.COMMIT, GROUP, **oneway)) for n in batch]
        began = time.process_time()
        for half, end in calls:
            for outcome in (broker.produce([half])[0], broker.produce([end])[0]):
                if isinstance(outcome, Exception):
                    raise outcome
        return (time.process_time() - began) / count

    with tempfile.TemporaryDirectory() as data_dir, EmbeddedBroker(data_dir) as broker:
        broker.create_topic(TOPIC, 4)
        run(broker, 300, True)  # warm-up: caches, segment, queue files
        for line in sys.stdin:
            command, count, *path = line.split()
            profile = cProfile.Profile(time.thread_time) if path else None
            if profile is not None:
                profile.enable()
            if command == "nosync":  # the path's own CPU: every fdatasync skipped (a measure only)
                synced, os.fdatasync = os.fdatasync, lambda fd: None
                try:
                    per_tx = run(broker, int(count), False)
                finally:
                    os.fdatasync = synced
            else:
                per_tx = run(broker, int(count), command != "core")
            if profile is not None:
                profile.disable()
                profile.dump_stats(path[0])
            print(json.dumps({"per_tx": per_tx}), flush=True)


def _client_child(port: int) -> None:
    """A child running checkout under test's ``BrokerClient`` against the server on ``port``;
    each line on stdin (``calls N THREADS``, or ``profile N PATH``: one thread under cProfile)
    runs N decorated-call-like calls spread over THREADS threads sharing the client and prints
    the process's CPU seconds per call (every thread's) and the calls per second."""
    import cProfile
    import threading

    from broker_embedded import BrokerClient
    from broker_embedded.message import Message, Resolution
    from outbox.producer import Producer

    client = BrokerClient(f"tcp://127.0.0.1:{port}")
    producer = Producer(client, GROUP)
    numbers = iter(range(1, 1 << 62))

    def calls(count: int) -> None:
        for _ in range(count):
            transaction_id = f"c{os.getpid()}-{next(numbers)}"
            producer.start_half(Message(TOPIC, BODY), transaction_id)
            producer.await_halves(transaction_id)
            producer.finish(transaction_id, Resolution.COMMIT)

    calls(300)  # warm-up: the connection, the topic
    for line in sys.stdin:
        command, count, argument = line.split()
        if command == "profile":
            profile = cProfile.Profile(time.thread_time)
            profile.runcall(calls, int(count))
            profile.dump_stats(argument)
            print(json.dumps({"per_tx": 0.0, "per_s": 0.0}), flush=True)
            continue
        threads = int(argument)
        workers = [threading.Thread(target=calls, args=(int(count) // threads,)) for _ in range(threads)]
        began, cpu_began = time.perf_counter(), time.process_time()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        print(json.dumps({"per_tx": cpu / int(count), "per_s": int(count) / wall}), flush=True)
    producer.close()


class _Child:
    """A ``_child`` process of checkout ``code`` (or a ``_client_child`` of the server on ``port``)."""

    def __init__(self, code: Path, port: int | None = None) -> None:
        mode = ["--child"] if port is None else ["--client-child", str(port)]
        self.process = subprocess.Popen([sys.executable, str(HERE / "broker_path.py"), *mode],
                                        env=code_env(code), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.per_s = 0.0

    def run(self, command: str, transactions: int, profile_to: Path | str | None = None) -> float:
        """Microseconds of CPU per transaction of ``transactions`` run by ``command`` (a
        client child: their calls per second in ``per_s``)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command} {transactions} {profile_to or ''}\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        self.per_s = float(answer.get("per_s", 0.0))
        return float(answer["per_tx"]) * 1e6

    def calls(self, count: int, threads: int) -> tuple[float, float]:
        """A client child's ``count`` calls over ``threads`` threads: CPU us per call, calls/s."""
        return self.run("calls", count, str(threads)), self.per_s

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


class _Driver:
    """A sequential client of one server as a decorated call uses it: the half message and
    its answer, then the END (COMMIT) not waited for, the next call's half right after it;
    the END is ``oneway`` if the server's checkout knows it (``oneway``)."""

    def __init__(self, port: int, oneway: bool, gap_s: float) -> None:
        from broker_embedded.message import Message, Resolution
        from broker_embedded.wire.session import ClientSession

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.session = ClientSession.__new__(ClientSession)
        self.message, self.commit = Message, Resolution.COMMIT
        self.oneway = {"oneway": True} if oneway else {}
        self.gap_s = gap_s
        self.sent = 0
        self.buffer = b""
        self.run(self.frames(1))  # the topic exists (auto-created) before the rounds

    def frames(self, count: int) -> list[tuple[int, bytes, int, bytes]]:
        """Per transaction: the half's request id and frame, the END's."""
        built = []
        for _ in range(count):
            n = self.sent = self.sent + 1
            half = self.session.send_half(self.message(TOPIC, BODY), producer_group=GROUP, transaction_id=f"t{n}")
            end = self.session.end_transaction(f"t{n}", self.commit, producer_group=GROUP, **self.oneway)
            built.append((2 * n, half.frame(2 * n), 2 * n + 1, end.frame(2 * n + 1)))
        return built

    def run(self, built: list[tuple[int, bytes, int, bytes]]) -> None:
        """The transactions of ``built`` in turn; returns once every answer is in."""
        for half_id, half, _, end in built:
            self.sock.sendall(half)
            self._until(half_id)
            self.sock.sendall(end)
            busy_until = time.perf_counter() + self.gap_s  # the caller's work until its next call
            while time.perf_counter() < busy_until:
                pass
        self._until(built[-1][2])

    def _until(self, request_id: int) -> None:
        """Read answers (the ENDs' among them) until the one to ``request_id``."""
        from broker_embedded.wire.protocol import read_frame

        while True:
            while len(self.buffer) < 4 or len(self.buffer) < 4 + int.from_bytes(self.buffer[:4], "big"):
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection")
                self.buffer += chunk
            size = int.from_bytes(self.buffer[:4], "big")
            payload, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
            if b"error" in payload:
                raise RuntimeError(payload)
            if read_frame(payload).request_id == request_id:
                return


def _knows_oneway(code: Path) -> bool:
    """Whether checkout ``code``'s broker takes oneway ENDs (written without their own fsync)."""
    return "oneway: bool" in (code / "broker_embedded" / "broker" / "writes.py").read_text()


def _thread_cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of the main thread of process ``pid`` (the server's
    event loop), from /proc/<pid>/task/<pid>/stat."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_run(pid: int, driver: _Driver, transactions: int) -> tuple[float, float]:
    """The server's CPU microseconds per transaction over ``transactions`` sequential
    ones: the whole process's (its background threads' ticks included) and its event
    loop thread's."""
    built = driver.frames(transactions)
    began, loop_began = cpu_seconds(pid), _thread_cpu_seconds(pid)
    driver.run(built)
    return ((cpu_seconds(pid) - began) / transactions * 1e6,
            (_thread_cpu_seconds(pid) - loop_began) / transactions * 1e6)


def fdatasync_cpu(appends: int = 2000) -> dict[str, float]:
    """CPU microseconds of a 300-byte ``pwrite`` + ``fdatasync`` on this disk: appended to a
    growing file (as the commit log does: the file size changes) and written over a
    file already that long (preallocated), each in a fresh file next to this checkout."""
    costs = {}
    with tempfile.TemporaryDirectory(dir=NEW.parent) as scratch:
        for mode in ("append", "preallocated"):
            path = Path(scratch) / mode
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if mode == "preallocated":
                    os.pwrite(fd, bytes(300 * appends), 0)
                    os.fsync(fd)
                began = time.process_time()
                for n in range(appends):
                    os.pwrite(fd, b"x" * 300, 300 * n)
                    os.fdatasync(fd)
                costs[mode] = (time.process_time() - began) / appends * 1e6
            finally:
                os.close(fd)
    return costs


def profile_each(children: dict[str, _Child], scratch: Path, title: str, operations: int) -> None:
    """Each checkout's child profiles ``operations`` of its work; print its top functions."""
    for name, child in children.items():
        path = scratch / f"{name}.prof"
        child.run("profile", operations, path)
        print_profile(path, f"{name}: {title}", operations)


def client_main(args: argparse.Namespace) -> None:
    """``--client``: both checkouts' clients against one server of this checkout, alternating."""
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    print(machine_load("at start"))
    print(f"old: {checkouts['old']}, new: {checkouts['new']}; clients against one server ({NEW}); {args.tx} calls "
          f"per round, {args.rounds} alternating rounds; a call: Producer.start_half (256 B) + await_halves + "
          "finish (END COMMIT, oneway, not waited for); client process CPU (all its threads) per call")
    measured: dict[int, dict[str, list[tuple[float, float]]]] = {}
    with tempfile.TemporaryDirectory() as scratch, halfmoon_process(Path(scratch) / "server", code=NEW) as (_, port):
        children = {name: _Child(code, port) for name, code in checkouts.items()}
        try:
            for threads in (1, args.client_threads):
                measured[threads] = alternating_rounds(args.rounds, {
                    name: functools.partial(child.calls, args.tx, threads) for name, child in children.items()})
            if args.profile:
                profile_each(children, Path(scratch), "one thread's calls, per call (the calling thread only)", args.tx)
        finally:
            for child in children.values():
                child.close()
    print(f"\n{'measure':<26} {'old':>24} {'new':>24} {'new/old (per round)':>20}")
    for threads, results in measured.items():
        for kind, label in enumerate(("client CPU us/call", "calls/s")):
            old, new = ([run[kind] for run in results[name]] for name in ("old", "new"))
            print(f"{f'{threads} thread(s): {label}':<26} {summary(old):>24} {summary(new):>24} "
                  f"{statistics.median(ratios(new, old)):>20.3f}")
    print(machine_load("at end"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, default=Path("/work/main"), help="the checkout to compare with")
    parser.add_argument("--new", type=Path, default=NEW, help="the checkout measured (default: this one)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tx", type=int, default=1000, help="transactions per round and measure")
    parser.add_argument("--profile", action="store_true", help="top 10 functions per transaction, both checkouts")
    parser.add_argument("--no-server", action="store_true", help="skip the TCP server measure")
    parser.add_argument("--gap-us", type=float, default=150.0,
                        help="server measure: the caller's work between an END and its next half message")
    parser.add_argument("--no-core", action="store_true", help="skip the in-process measures")
    parser.add_argument("--breakdown", action="store_true",
                        help="also the path without its fdatasyncs, and an fdatasync's CPU appending vs preallocated")
    parser.add_argument("--client", action="store_true",
                        help="measure the checkouts' BrokerClient (CPU per call, calls/s) instead of the broker")
    parser.add_argument("--client-threads", type=int, default=8, help="--client: threads sharing one client")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child()
        return
    if args.client_child:
        _client_child(args.client_child)
        return
    if args.client:
        client_main(args)
        return
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    print(machine_load("at start"))
    print(f"old: {checkouts['old']}, new: {checkouts['new']}; {args.tx} tx per round, {args.rounds} alternating rounds, "
          "256 B body, sync flush; CPU microseconds per transaction (half message + END COMMIT)")
    results: dict[str, list[float]] = {}
    children = {name: _Child(code) for name, code in checkouts.items()}
    try:
        for round_number in range(0 if args.no_core else args.rounds):
            measures = [("core", "store+broker"), ("frames", "+frames")]
            if args.breakdown:
                measures.append(("nosync", "no fdatasync"))
            for command, label in measures:
                for name in (["old", "new"] if round_number % 2 == 0 else ["new", "old"]):
                    results.setdefault(f"{label} {name}", []).append(children[name].run(command, args.tx))
        if args.profile:
            with tempfile.TemporaryDirectory() as scratch:
                profile_each(children, Path(scratch), "+frames, per transaction", args.tx)
    finally:
        for child in children.values():
            child.close()
    if not args.no_server:
        with tempfile.TemporaryDirectory() as scratch:
            with halfmoon_process(Path(scratch) / "old", code=checkouts["old"]) as (old_server, old_port), \
                    halfmoon_process(Path(scratch) / "new", code=checkouts["new"]) as (new_server, new_port):
                gap_s = args.gap_us / 1e6
                drivers = {"old": (old_server.pid, _Driver(old_port, _knows_oneway(checkouts["old"]), gap_s)),
                           "new": (new_server.pid, _Driver(new_port, _knows_oneway(checkouts["new"]), gap_s))}
                for pid, driver in drivers.values():
                    server_run(pid, driver, 300)  # warm-up
                for round_number in range(args.rounds):
                    for name in (["old", "new"] if round_number % 2 == 0 else ["new", "old"]):
                        pid, driver = drivers[name]
                        process, loop = server_run(pid, driver, args.tx)
                        results.setdefault(f"server {name}", []).append(process)
                        results.setdefault(f"server loop {name}", []).append(loop)
                for _, driver in drivers.values():
                    driver.sock.close()
    print(f"{'measure':<14} {'old us/tx':>24} {'new us/tx':>24} {'new/old (per round)':>22}")
    for label in ("store+broker", "+frames", "no fdatasync", "server", "server loop"):
        old, new = results.get(f"{label} old"), results.get(f"{label} new")
        if old and new:
            print(f"{label:<14} {summary(old):>24} {summary(new):>24} "
                  f"{statistics.median(ratios(new, old)):>22.3f}")
    if args.breakdown:
        rounds = [fdatasync_cpu() for _ in range(3)]
        print("pwrite 300 B + fdatasync, CPU us per call (3 rounds, median): " + ", ".join(
            f"{mode} {statistics.median(r[mode] for r in rounds):.1f}" for mode in rounds[0]))
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
