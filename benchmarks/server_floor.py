"""The floor of a durable request in Python, next to halfmoon's and Redis's, in one run.

    ./dev bench server_floor [--seconds 3] [--rounds 5] [--baseline DIR]

Sequential durable sends of 256 B from one client, one at a time (issue 24's "sequential
send"), to three servers, in alternating rounds:

* ``halfmoon``: ``python -m broker_embedded serve``, ``BrokerClient.send``;
* ``python floor``: the least any Python server can do per request: an asyncio
  protocol on uvloop that takes a length-prefixed frame, appends it to a file, fdatasyncs
  and answers 8 bytes (no record, no index, no validation), from a raw-socket client;
* ``redis``: XADD with ``appendfsync always`` through redis-py.

Prints each one's requests per second, server and client CPU per request (medians of the
rounds), and the per-round ratios to Redis: how far a broker written in Python can get at
all, and how much of halfmoon's gap is its own work. ``--baseline DIR`` adds halfmoon from
another checkout (server and client), e.g. ``git archive <commit> broker_embedded | tar -x -C
DIR``, in the same rounds: before and after a change.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import (
    alternating_rounds,
    code_env,
    cpu_seconds,
    free_port,
    halfmoon_process,
    listening,
    machine_load,
    ratios,
    redis_process,
    repeat,
    timed,
)

from broker_embedded import BrokerClient, Message

BODY = b"x" * 256
FRAME = struct.Struct(">I")
REPLY = b"\0" * 8


def floor_server(port: int, path: str) -> None:
    """Serve the floor protocol on ``port``, appending to ``path`` (run in its own process)."""
    import asyncio

    import uvloop

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    class Floor(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while len(self.buffer) >= FRAME.size:
                (size,) = FRAME.unpack_from(self.buffer)
                if len(self.buffer) < FRAME.size + size:
                    return
                frame, self.buffer = self.buffer[FRAME.size:FRAME.size + size], self.buffer[FRAME.size + size:]
                os.write(fd, frame)
                os.fdatasync(fd)
                self.transport.write(REPLY)  # type: ignore[attr-defined]

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(serve())


@contextmanager
def floor_process(folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A ``floor_server`` process; yields it and its port, ends it on exit."""
    port = free_port()
    folder.mkdir(parents=True)
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--floor-server", str(port),
                               str(folder / "log")])
    with listening(server, port):
        yield server, port


def _floor_send(sock: socket.socket) -> None:
    sock.sendall(FRAME.pack(len(BODY)) + BODY)
    got = b""
    while len(got) < len(REPLY):
        chunk = sock.recv(len(REPLY) - len(got))
        if not chunk:
            raise ConnectionError("the floor server closed")
        got += chunk


Sample = tuple[float, float, float]


def measured(pid: int, seconds: float, call: Callable[[], object]) -> Sample:
    """Requests per second of ``call`` in a loop, and server ``pid``'s and this process's
    CPU µs per request."""
    call()  # the server's first request (topic creation, page faults) is not the workload
    start, cpu_start, client_start = time.perf_counter(), cpu_seconds(pid), os.times()
    rate = timed(seconds, repeat(call))
    client_end = os.times()
    requests = rate * (time.perf_counter() - start)  # the loop ends with its last call, past ``seconds``
    client = client_end.user - client_start.user + client_end.system - client_start.system
    return rate, (cpu_seconds(pid) - cpu_start) / requests * 1e6, client / requests * 1e6


def halfmoon_run(seconds: float) -> Sample:
    """Sequential sends to a fresh ``serve`` process (of the code this process imports)."""
    with tempfile.TemporaryDirectory(prefix="hm-floor-") as folder:
        with halfmoon_process(Path(folder) / "broker") as (server, port):
            with BrokerClient(f"tcp://127.0.0.1:{port}", timeout_s=30) as client:
                return measured(server.pid, seconds, functools.partial(client.send, Message(topic="floor", body=BODY)))


def one_round(work: Path, seconds: float, baseline: Path | None) -> dict[str, Callable[[], Sample]]:
    """Each server's run: a fresh server, ``seconds`` of sequential sends."""
    import redis

    def halfmoon(code: Path | None) -> Sample:
        # in ``code``'s folder: ``python -m broker_embedded`` puts the working directory first
        run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--halfmoon-run", str(seconds)],
                             check=True, capture_output=True, text=True, env=code_env(code) if code else None,
                             cwd=code)
        rate, server_cpu, client_cpu = json.loads(run.stdout)
        return rate, server_cpu, client_cpu

    def python_floor() -> Sample:
        with floor_process(Path(tempfile.mkdtemp(dir=work)) / "floor") as (server, port):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return measured(server.pid, seconds, functools.partial(_floor_send, sock))

    def redis_xadd() -> Sample:
        with redis_process(Path(tempfile.mkdtemp(dir=work)) / "redis") as (server, port):
            client = redis.Redis(port=port)
            try:
                return measured(server.pid, seconds, functools.partial(client.xadd, "floor", {"b": BODY}))
            finally:
                client.close()

    runs = {"halfmoon": functools.partial(halfmoon, None)}
    if baseline is not None:
        runs["baseline"] = functools.partial(halfmoon, baseline)
    return {**runs, "python floor": python_floor, "redis": redis_xadd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout's halfmoon, in the same rounds")
    parser.add_argument("--floor-server", nargs=2, metavar=("PORT", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--halfmoon-run", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        floor_server(int(args.floor_server[0]), args.floor_server[1])
        return
    if args.halfmoon_run:
        print(json.dumps(halfmoon_run(args.halfmoon_run)))
        return
    print(machine_load("at start"), flush=True)
    with tempfile.TemporaryDirectory(prefix="hm-floor-") as folder:
        results = alternating_rounds(args.rounds, one_round(Path(folder), args.seconds, args.baseline))
    print(machine_load("at end"))
    print(f"sequential durable sends, 256 B, one client; medians of {args.rounds} alternating rounds of {args.seconds} s")
    print(f"{'server':>14}{'requests/s':>12}{'server CPU µs':>15}{'client CPU µs':>15}{'x redis (per round)':>22}")
    redis_rates = [rate for rate, _, _ in results["redis"]]
    for name, samples in results.items():
        rates = [rate for rate, _, _ in samples]
        print(f"{name:>14}{statistics.median(rates):>12,.0f}{statistics.median(s[1] for s in samples):>15.1f}"
              f"{statistics.median(s[2] for s in samples):>15.1f}{statistics.median(ratios(rates, redis_rates)):>22.2f}")


if __name__ == "__main__":
    main()
