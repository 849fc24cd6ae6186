"""Broker CPU per sequential transaction (issue 24): what a ``@transactional_message``
call costs the broker, one SEND_HALF_MESSAGE and one END_TRANSACTION (COMMIT) of a 256 B
message, sync flush, at one client.

Three measures, each CPU time (robust to the shared machine's load), of two checkouts
(``--old``, default /work/main, and this one) in alternating rounds, medians and per-round
ratios:

- ``store+broker``: ``EmbeddedBroker.produce([HalfCall])`` then ``produce([EndCall])`` in a
  loop, ``time.process_time`` per transaction (every thread: the fsync included);
- ``+frames``: the same with the TCP server's per-request work around it: the request frame
  read and decoded, the write call built, the reply encoded;
- ``server``: a real ``halfmoon-broker serve`` process driven over TCP by this process (frames
  built beforehand), the server process's CPU per transaction from /proc.

``--profile`` prints the top functions per transaction of the ``+frames`` loop for both
checkouts. Run: ``python benchmarks/broker_path.py [--rounds 5] [--tx 2000] [--profile]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
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


def _core(transactions: int, frames: bool, profile_to: str | None) -> float:
    """In a child (the checkout under test first on its path): CPU seconds per transaction."""
    from broker_embedded.broker.config import BrokerConfig
    from broker_embedded.broker.facade import EmbeddedBroker
    from broker_embedded.message import Message, Resolution
    from broker_embedded.server.tcp import _batch_item
    from broker_embedded.wire.protocol import METHODS, FrameBuffer, encode_reply, read_frame
    from broker_embedded.wire.requests import decode_request
    from broker_embedded.wire.session import ClientSession

    codes = {method: code for code, method in METHODS.items()}
    session = ClientSession.__new__(ClientSession)  # only its request builders are used (no connection)

    def frames_of(count: int, start: int) -> list[tuple[bytes, bytes]]:
        built = []
        for n in range(start, start + count):
            half = session.send_half(Message(TOPIC, BODY), producer_group=GROUP, transaction_id=f"tx-{n}")
            end = session.end_transaction(f"tx-{n}", Resolution.COMMIT, producer_group=GROUP)
            built.append((half.frame(2 * n + 1), end.frame(2 * n + 2)))
        return built

    def serve(broker: EmbeddedBroker, buffer: FrameBuffer, data: bytes) -> bytes:
        """What the TCP server does with one request's bytes, the batch on the loop."""
        replies = []
        for payload in buffer.feed(data):
            frame = read_frame(payload)
            request = decode_request(frame.code, frame.body)
            outcome = broker.produce([_batch_item(METHODS[frame.code], request)])[0]
            replies.append(encode_reply(frame.code, frame.request_id, outcome))
        return b"".join(replies)

    with tempfile.TemporaryDirectory() as data_dir, EmbeddedBroker(data_dir, BrokerConfig()) as broker:
        broker.create_topic(TOPIC, 4)
        buffer = FrameBuffer()
        assert codes["send_half"] and codes["end_transaction"]

        def run(count: int, start: int) -> float:
            built = frames_of(count, start)
            if not frames:
                from broker_embedded.broker.writes import EndCall, HalfCall
                calls = [(HalfCall(Message(TOPIC, BODY), GROUP, f"tx-{n}"),
                          EndCall(f"tx-{n}", Resolution.COMMIT, GROUP)) for n in range(start, start + count)]
                began = time.process_time()
                for half, end in calls:
                    for outcome in (broker.produce([half])[0], broker.produce([end])[0]):
                        if isinstance(outcome, Exception):
                            raise outcome
                return (time.process_time() - began) / count
            began = time.process_time()
            for half, end in built:
                serve(broker, buffer, half)
                serve(broker, buffer, end)
            return (time.process_time() - began) / count

        run(300, 0)  # warm-up: caches, segment, queue files
        if profile_to is None:
            return run(transactions, 1_000_000)
        import cProfile
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        per_tx = run(transactions, 1_000_000)
        profile.disable()
        profile.dump_stats(profile_to)
        return per_tx


def core_run(code: Path, transactions: int, frames: bool, profile_to: Path | None = None) -> float:
    """``_core`` of checkout ``code`` in a fresh interpreter; microseconds per transaction."""
    command = [sys.executable, str(HERE / "broker_path.py"), "--child", str(transactions)]
    if frames:
        command.append("--frames")
    if profile_to is not None:
        command += ["--profile-to", str(profile_to)]
    out = subprocess.run(command, env=code_env(code), check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.splitlines()[-1])["per_tx"]) * 1e6


class _Driver:
    """A sequential client of one server: half message, its answer, END, its answer."""

    def __init__(self, port: int) -> None:
        from broker_embedded.message import Message, Resolution
        from broker_embedded.wire.session import ClientSession

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.session = ClientSession.__new__(ClientSession)
        self.message, self.commit = Message, Resolution.COMMIT
        self.sent = 0
        self.exchange(*self.frames(1)[0])  # the topic exists (auto-created) before the rounds

    def frames(self, count: int) -> list[tuple[bytes, bytes]]:
        built = []
        for _ in range(count):
            n = self.sent = self.sent + 1
            half = self.session.send_half(self.message(TOPIC, BODY), producer_group=GROUP, transaction_id=f"t{n}")
            end = self.session.end_transaction(f"t{n}", self.commit, producer_group=GROUP)
            built.append((half.frame(2 * n), end.frame(2 * n + 1)))
        return built

    def exchange(self, *frames: bytes) -> None:
        for frame in frames:
            self.sock.sendall(frame)
            head = self._read(4)
            body = self._read(int.from_bytes(head, "big"))
            if b"error" in body:
                raise RuntimeError(body)

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data


def server_run(pid: int, driver: _Driver, transactions: int) -> float:
    """The server's CPU microseconds per transaction over ``transactions`` sequential ones."""
    built = driver.frames(transactions)
    began = cpu_seconds(pid)
    for half, end in built:
        driver.exchange(half, end)
    return (cpu_seconds(pid) - began) / transactions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, default=Path("/work/main"), help="the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tx", type=int, default=2000, help="transactions per round and measure")
    parser.add_argument("--profile", action="store_true", help="top 10 functions per transaction, both checkouts")
    parser.add_argument("--no-server", action="store_true", help="skip the TCP server measure")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--frames", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps({"per_tx": _core(args.child, args.frames, args.profile_to)}))
        return
    checkouts = {"old": args.old.resolve(), "new": NEW}
    print(machine_load("at start"))
    print(f"old: {checkouts['old']}, new: {NEW}; {args.tx} tx per round, {args.rounds} alternating rounds, "
          "256 B body, sync flush; CPU microseconds per transaction (half message + END COMMIT)")
    results: dict[str, list[float]] = {}
    for frames in (False, True):
        label = "+frames" if frames else "store+broker"
        for round_number in range(args.rounds):
            for name in (["old", "new"] if round_number % 2 == 0 else ["new", "old"]):
                results.setdefault(f"{label} {name}", []).append(
                    core_run(checkouts[name], args.tx, frames))
    if not args.no_server:
        with tempfile.TemporaryDirectory() as scratch:
            with halfmoon_process(Path(scratch) / "old", code=checkouts["old"]) as (old_server, old_port), \
                    halfmoon_process(Path(scratch) / "new", code=NEW) as (new_server, new_port):
                drivers = {"old": (old_server.pid, _Driver(old_port)), "new": (new_server.pid, _Driver(new_port))}
                for pid, driver in drivers.values():
                    server_run(pid, driver, 300)  # warm-up
                for round_number in range(args.rounds):
                    for name in (["old", "new"] if round_number % 2 == 0 else ["new", "old"]):
                        pid, driver = drivers[name]
                        results.setdefault(f"server {name}", []).append(server_run(pid, driver, args.tx))
                for _, driver in drivers.values():
                    driver.sock.close()
    print(f"{'measure':<14} {'old us/tx':>24} {'new us/tx':>24} {'new/old (per round)':>22}")
    for label in ("store+broker", "+frames", "server"):
        old, new = results.get(f"{label} old"), results.get(f"{label} new")
        if old and new:
            print(f"{label:<14} {summary(old):>24} {summary(new):>24} "
                  f"{statistics.median(ratios(new, old)):>22.3f}")
    if args.profile:
        with tempfile.TemporaryDirectory() as scratch:
            for name, code in checkouts.items():
                path = Path(scratch) / f"{name}.prof"
                core_run(code, args.tx, True, path)
                print_profile(path, f"{name}: +frames, per transaction", args.tx)
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
