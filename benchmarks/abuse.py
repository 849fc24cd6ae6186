"""The server under attack: its memory and a legitimate client's latency, beside no attack.

    ./dev bench abuse [--seconds 10] [--repeat 1] [--only NAME ...]

Each scenario starts a fresh ``python -m broker_embedded serve`` (async flush, so the
figures are the server's and not the disk's), connects the legitimate client in a process
of its own, then runs one attack from this process for ``--seconds`` while the client
loops: send 256 B, receive with ``wait_s=0``, ack what came (one loop = one latency).

* none: no attack, the baseline of the same run;
* pipelined-reads: 2 connections each write 150 PULL_MESSAGE of a 4 MiB queue in one
  ~9 KB write and never read the answers;
* big-frames: one connection sends 8 MiB frames of empty msgpack arrays, one at a time;
* slowloris: 48 connections each send all but the last byte of an 8 MiB frame, then wait;
* idle-connections: 2,000 connections that send nothing;
* long-poll-flood: one connection sends 3,000 receives with ``wait_s=600`` and hangs up;
* request-flood: 2 connections write 100 B sends as fast as the server takes them and
  never read the answers;
* big-send-flood: the same with sends of 4 MiB bodies.

Printed per scenario: the server's RSS above its idle RSS (sampled every 50 ms: the peak
during the attack, and 2 s after the attackers hung up), the client's p50 and p99 with
their ratio to the no-attack run, its loops and errors. With ``--repeat N`` every figure
is the median of N runs. Targets: RSS <= 256 MiB above idle, p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import halfmoon_process, percentile

from broker_embedded import BrokerClient, Message
from broker_embedded.errors import BrokerError
from broker_embedded.wire.protocol import (
    LENGTH,
    MAX_FRAME_BYTES,
    FrameBuffer,
    Kind,
    RequestCode,
    encode_frame,
)

MIB = 1024 * 1024
RSS_TARGET_MIB = 256
P99_TARGET_MS = 100
BULK_TOPIC = "bulk"
BULK_MESSAGES = 16  # x 256 KiB: a 4 MiB queue


def rss_of(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for {pid}")


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def write_all(socks: list[socket.socket], data: bytes, stop: threading.Event) -> None:
    """Write ``data`` on every socket without waiting on any one of them; gives up on a
    socket the server closes, and on all of them once ``stop`` is set."""
    left: dict[socket.socket, memoryview] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_WRITE)
            left[sock] = memoryview(data)
        while left and not stop.is_set():
            for key, _ in selector.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    left[sock] = left[sock][sock.send(left[sock]):]
                except OSError:
                    left[sock] = left[sock][:0]
                if not left[sock]:
                    selector.unregister(sock)
                    del left[sock]


def still_open(sock: socket.socket) -> bool:
    """True if the server has neither closed ``sock`` nor sent anything on it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def await_answer(sock: socket.socket) -> None:
    """Block until one whole frame arrives on ``sock``, or it closes."""
    frames = FrameBuffer()
    while chunk := sock.recv(65536):
        for _ in frames.feed(chunk):
            return


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


# -- attacks: each runs until ``stop`` is set, hangs up, and returns a note ---------------
Attack = Callable[[int, threading.Event], str]


def pipelined_reads(port: int, stop: threading.Event) -> str:
    read = {"topic": BULK_TOPIC, "queue_id": 0, "offset": 0, "max_messages": 32}
    burst = b"".join(encode_frame(RequestCode.PULL_MESSAGE, i, Kind.REQUEST, read) for i in range(1, 151))
    socks = [connect(port) for _ in range(2)]
    write_all(socks, burst, stop)
    stop.wait()
    close_all(socks)
    return f"2 x 150 reads in {len(burst):,} B"


def big_frames(port: int, stop: threading.Event) -> str:
    count = MAX_FRAME_BYTES - 9  # the array header and the other three fields fill the rest
    payload = bytes([0x94, RequestCode.SEND_MESSAGE, 1, Kind.REQUEST, 0xDD]) + count.to_bytes(4, "big")
    frame = LENGTH.pack(MAX_FRAME_BYTES) + payload + b"\x90" * count
    sent = 0
    while not stop.is_set():
        with connect(port) as sock:
            sock.sendall(frame)
            sent += 1
            await_answer(sock)
    return f"{sent} frames sent"


def slowloris(port: int, stop: threading.Event) -> str:
    socks = [connect(port) for _ in range(48)]
    write_all(socks, LENGTH.pack(MAX_FRAME_BYTES) + bytes(MAX_FRAME_BYTES - 1), stop)
    stop.wait()
    held = sum(still_open(sock) for sock in socks)
    close_all(socks)
    return f"{held} of 48 held to the end"


def idle_connections(port: int, stop: threading.Event) -> str:
    socks: list[socket.socket] = []
    for _ in range(2000):
        if stop.is_set():
            break
        try:
            socks.append(connect(port))
        except OSError:
            pass
    stop.wait()
    held = sum(still_open(sock) for sock in socks)
    close_all(socks)
    return f"{held:,} of 2,000 held to the end"


def long_poll_flood(port: int, stop: threading.Event) -> str:
    poll = {"group": "flood", "topic": "flood", "wait_s": 600.0}
    burst = b"".join(encode_frame(RequestCode.POP_MESSAGE, i, Kind.REQUEST, poll) for i in range(1, 3001))
    with connect(port) as sock:
        write_all([sock], burst, stop)
    stop.wait()
    return "3,000 polls, then hung up"


def send_flood(port: int, stop: threading.Event, body_bytes: int, per_write: int) -> str:
    """2 connections writing sends of ``body_bytes`` (``per_write`` to a write) as fast as
    the server takes them, never reading the answers."""
    send = {"message": {"topic": "flood", "body": b"f" * body_bytes}}
    chunk = b"".join(encode_frame(RequestCode.SEND_MESSAGE, i, Kind.REQUEST, send) for i in range(1, per_write + 1))
    socks = [connect(port) for _ in range(2)]
    rounds = 0
    while not stop.is_set():
        write_all(socks, chunk, stop)
        rounds += 1
    close_all(socks)
    return f"~{rounds * 2 * per_write:,} sends written"


def request_flood(port: int, stop: threading.Event) -> str:
    return send_flood(port, stop, 100, 1000)


def big_send_flood(port: int, stop: threading.Event) -> str:
    return send_flood(port, stop, 4 * MIB - 1024, 1)


def no_attack(port: int, stop: threading.Event) -> str:
    stop.wait()
    return ""


SCENARIOS: dict[str, Attack] = {
    "none": no_attack,
    "pipelined-reads": pipelined_reads,
    "big-frames": big_frames,
    "slowloris": slowloris,
    "idle-connections": idle_connections,
    "long-poll-flood": long_poll_flood,
    "request-flood": request_flood,
    "big-send-flood": big_send_flood,
}


# -- the legitimate client ----------------------------------------------------------------
def legitimate(url: str, seconds: float, ready: Any, go: Any, out: Any) -> None:
    """Loop send + receive(wait_s=0) + acks: a second of warm-up, then ``seconds`` measured
    once ``go`` is set; puts (latencies in seconds, errors) on ``out``."""
    client = BrokerClient(url, timeout_s=60)

    def loop() -> None:
        client.send(Message("legit", b"l" * 256))
        for received in client.receive("legit", "legit", max_messages=16):
            client.ack("legit", received.receipt_handle)

    client.create_topic("legit", 1)
    warm_up = time.perf_counter() + 1
    while time.perf_counter() < warm_up:
        loop()
    ready.set()
    go.wait()
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        try:
            loop()
        except BrokerError:
            errors += 1
        latencies.append(time.perf_counter() - start)
    client.close()
    out.put((latencies, errors))


def fill_bulk_queue(url: str) -> None:
    with BrokerClient(url, timeout_s=60) as client:
        client.create_topic(BULK_TOPIC, 1)
        for _ in range(BULK_MESSAGES):
            client.send(Message(BULK_TOPIC, b"b" * (256 * 1024)))


def run_scenario(name: str, seconds: float, work: Path) -> dict[str, Any]:
    """One fresh server, the legitimate client, one attack; the figures of this run."""
    context = mp.get_context("spawn")
    with halfmoon_process(work / name, "--flush", "async") as (server, port):
        url = f"tcp://127.0.0.1:{port}"
        fill_bulk_queue(url)
        ready, go, out = context.Event(), context.Event(), context.Queue()
        client = context.Process(target=legitimate, args=(url, seconds, ready, go, out))
        client.start()
        assert ready.wait(60), "the legitimate client did not start"
        idle = rss_of(server.pid)
        peak = idle
        stop = threading.Event()
        sampling = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not sampling.wait(0.05):
                peak = max(peak, rss_of(server.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        note: list[str] = []
        attacker = threading.Thread(target=lambda: note.append(SCENARIOS[name](port, stop)))
        attacker.start()
        go.set()
        latencies, errors = out.get(timeout=seconds + 600)
        client.join()
        stop.set()
        attacker.join()
        time.sleep(2)
        sampling.set()
        sampler.join()
        after = rss_of(server.pid)
    return {
        "peak": (peak - idle) / MIB, "after": (after - idle) / MIB, "idle": idle / MIB,
        "p50": percentile(latencies, 0.5) * 1000, "p99": percentile(latencies, 0.99) * 1000,
        "loops": len(latencies), "errors": errors, "note": note[0] if note else "attack failed",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each attack")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="scenarios to run (none always runs)")
    args = parser.parse_args()
    names = ["none", *[n for n in SCENARIOS if n != "none" and (not args.only or n in args.only)]]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
        for run in range(args.repeat):
            for name in names:
                print(f"run {run + 1}/{args.repeat}: {name}", file=sys.stderr, flush=True)
                runs[name].append(run_scenario(name, args.seconds, Path(tmp) / f"run{run}"))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"{args.seconds:.0f} s per attack, medians of {args.repeat} run(s); idle server RSS "
          f"{median('none', 'idle'):.0f} MiB")
    header = ("scenario", "RSS peak +MiB", "RSS after +MiB", "p50 ms", "p99 ms", "p50 x", "p99 x",
              "loops", "errors", "attack")
    rows = [header]
    for name in names:
        rows.append((
            name, f"{median(name, 'peak'):,.0f}", f"{median(name, 'after'):,.0f}",
            f"{median(name, 'p50'):,.1f}", f"{median(name, 'p99'):,.1f}",
            f"{median(name, 'p50') / median('none', 'p50'):,.1f}",
            f"{median(name, 'p99') / median('none', 'p99'):,.1f}",
            f"{median(name, 'loops'):,.0f}", f"{median(name, 'errors'):,.0f}", runs[name][-1]["note"],
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) if i in (0, 9) else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(row, widths, strict=True))))
    print(f"targets: RSS peak <= {RSS_TARGET_MIB} MiB above idle, p99 <= {P99_TARGET_MS} ms")


if __name__ == "__main__":
    main()
