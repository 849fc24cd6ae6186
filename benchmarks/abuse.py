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

These scenarios measure a legitimate client of their own (one loop = one latency):

* unauthenticated-flood: the server has keys (``--access-key/--secret-key``); 1,300
  connections each ask for a challenge every 3 s and never authenticate (one the server
  closes is opened again at the next round); the client opens a connection with the keys
  and sends 256 B, each loop;
* http-slow-requests: the server has ``--http-port``; 600 connections to it each send half
  a request's headers and wait (reopened like the above, checked every second); the client
  GETs ``/healthz`` on a new connection;
* sign-in-flood: keys and ``--http-port``; one attacker from 127.0.0.2 posts wrong keys to
  the console's sign-in form in a loop; the operator, from 127.0.0.1, signs in with the
  right keys (the form, then the post), each loop.

The first two measure once every attacking connection was opened (the client waits,
warmed up, up to 60 s), the others from the attack's start.

Printed per scenario: the server's RSS above its idle RSS (sampled every 50 ms: the peak
during the attack, and 2 s after the attackers hung up), its peak thread count, the client's
p50 and p99 (failed loops included) with their ratio to the no-attack run (for the
scenarios whose client is the no-attack run's), the share of its loops that succeeded, its
loops and errors. With ``--repeat N`` every figure is the median of N runs. Targets: RSS <=
256 MiB above idle, p99 <= 100 ms.

``--code DIR`` starts the server from the checkout DIR (first on its PYTHONPATH; the
benchmark's own clients and attacks stay this checkout's), so one benchmark measures two
versions of the server. Every flag the scenarios give the server is one the server has had
since before issue 21.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import re
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from _common import code_env, free_port, halfmoon_process, percentile, wait_port

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
KEYS = {"access_key": "abuse-ak", "secret_key": "abuse-sk"}
#: Asks the server for an authentication challenge (what a client does first, with keys).
CHALLENGE = encode_frame(RequestCode.AUTHENTICATE, 1, Kind.REQUEST, {})
#: The headers of a request without the blank line that ends them: never finished.
HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: broker\r\n"
CSRF_FIELD = re.compile(r'name="csrf" value="([0-9a-f]+)"')
ATTACKER_ADDRESS = "127.0.0.2"
#: Set by ``hold`` once every connection it keeps was opened once: a scenario with
#: ``in_place`` starts measuring then (or after ``IN_PLACE_WAIT_S``), not while it ramps up.
IN_PLACE = threading.Event()
IN_PLACE_WAIT_S = 60


def status_of(pid: int, name: str) -> int:
    """The number in field ``name`` of ``/proc/<pid>/status`` (``VmRSS`` is in KiB)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    raise ValueError(f"no {name} for {pid}")


def rss_of(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (``VmRSS``)."""
    return status_of(pid, "VmRSS") * 1024


def connect(port: int, timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
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


def drained(sock: socket.socket) -> bool:
    """Read and drop what the server sent on the non-blocking ``sock``; False once it closed."""
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def hold(port: int, count: int, opening: bytes, every_s: float, again: bytes, stop: threading.Event) -> str:
    """Keep ``count`` connections to ``port`` open until ``stop``: each sends ``opening``
    when it opens and ``again`` (if any) every ``every_s``, reading nothing of use; one the
    server closed is opened again at the next round. Says how many were open at the end."""
    socks: list[socket.socket | None] = [None] * count
    opened = 0
    started = time.monotonic()
    ramp_s: float | None = None
    while not stop.is_set():
        round_end = time.monotonic() + every_s
        for i, sock in enumerate(socks):
            if stop.is_set():
                break
            if sock is not None and not drained(sock):
                sock.close()
                sock = None
            try:
                if sock is None:
                    opened += 1
                    sock = connect(port, timeout=5)
                    sock.sendall(opening)
                    sock.setblocking(False)
                elif again:
                    sock.send(again)
            except OSError:
                if sock is not None:
                    sock.close()
                sock = None
            socks[i] = sock
        if ramp_s is None and not stop.is_set():
            ramp_s = time.monotonic() - started
            IN_PLACE.set()
        stop.wait(max(0.0, round_end - time.monotonic()))
    live = [sock for sock in socks if sock is not None]
    held = sum(drained(sock) for sock in live)
    close_all(live)
    ramp = f"the first {count:,} in {ramp_s:.1f} s" if ramp_s is not None else "never all"
    return f"{held:,} of {count:,} open at the end, {opened:,} opened ({ramp})"


def sign_in_form(connection: http.client.HTTPConnection) -> tuple[str, str]:
    """The console's sign-in form as a browser gets it: its cookie and its CSRF token."""
    connection.request("GET", "/sign-in")
    page = connection.getresponse()
    body = page.read().decode()
    token = CSRF_FIELD.search(body)
    cookie = page.getheader("Set-Cookie")
    if page.status != 200 or token is None or cookie is None:
        raise Refused(f"sign-in form: {page.status}")
    return cookie.split(";")[0], token.group(1)


def post_sign_in(connection: http.client.HTTPConnection, form: tuple[str, str], access_key: str,
                 secret_key: str) -> int:
    """Post the sign-in ``form`` (cookie, token) with these keys; the answer's status (303
    when signed in)."""
    cookie, token = form
    connection.request("POST", "/sign-in", urlencode({"csrf": token, "access_key": access_key,
                                                      "secret_key": secret_key}),
                       {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
    answer = connection.getresponse()
    answer.read()
    return answer.status


def http_connection(port: int, source: str = "127.0.0.1") -> http.client.HTTPConnection:
    """A connection to the HTTP port from ``source`` (a 127/8 address); it reopens itself
    when the server closes it after an answer."""
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))


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


def unauthenticated_flood(port: int, stop: threading.Event) -> str:
    return hold(port, 1300, CHALLENGE, 3.0, CHALLENGE, stop)


def http_slow_requests(http_port: int, stop: threading.Event) -> str:
    return hold(http_port, 600, HALF_REQUEST, 1.0, b"", stop)


def sign_in_flood(http_port: int, stop: threading.Event) -> str:
    """Wrong keys posted from 127.0.0.2 as fast as the console answers, one form per 100 posts."""
    posted = refused = 0
    connection = http_connection(http_port, ATTACKER_ADDRESS)
    try:
        while not stop.is_set():
            form = sign_in_form(connection)
            for _ in range(100):
                if stop.is_set():
                    break
                posted += 1
                refused += post_sign_in(connection, form, "guess", f"guess-{posted}") == 429
    finally:
        connection.close()
    return f"{posted:,} wrong sign-ins from {ATTACKER_ADDRESS}, {refused:,} answered 429"


def no_attack(port: int, stop: threading.Event) -> str:
    stop.wait()
    return ""


# -- the legitimate clients ---------------------------------------------------------------
class Refused(Exception):
    """The server answered a legitimate client's request with a refusal."""


@dataclass(frozen=True)
class Target:
    """Where a legitimate client finds the server, and the keys it has (if any)."""

    url: str
    http_port: int | None
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, timeout_s: float = 60, connect_timeout_s: float = 5) -> BrokerClient:
        """A client of the TCP port, with the keys if there are."""
        return BrokerClient(self.url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                            access_key=self.keys.get("access_key"), secret_key=self.keys.get("secret_key"))


def measure(step: Callable[[], object], failures: tuple[type[Exception], ...], seconds: float,
            ready: Any, go: Any, out: Any) -> None:
    """A second of warm-up of ``step``, then ``seconds`` of it measured once ``go`` is set
    (a step raising one of ``failures`` is an error, 10 ms of pause after it); puts
    (latencies in seconds, errors) on ``out``."""
    warm_up = time.perf_counter() + 1
    while time.perf_counter() < warm_up:
        step()
    ready.set()
    go.wait()
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        try:
            step()
        except failures:
            errors += 1
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
            continue
        latencies.append(time.perf_counter() - start)
    out.put((latencies, errors))


def legitimate(target: Target, seconds: float, ready: Any, go: Any, out: Any) -> None:
    """send 256 B + receive(wait_s=0) + acks on one connection"""
    client = target.client()

    def loop() -> None:
        client.send(Message("legit", b"l" * 256))
        for received in client.receive("legit", "legit", max_messages=16):
            client.ack("legit", received.receipt_handle)

    client.create_topic("legit", 1)
    measure(loop, (BrokerError,), seconds, ready, go, out)
    client.close()


def keyed_connect_and_send(target: Target, seconds: float, ready: Any, go: Any, out: Any) -> None:
    """a new connection with the keys (connect, authenticate) + send 256 B"""
    def loop() -> None:
        with target.client(timeout_s=10) as client:
            client.send(Message("legit", b"l" * 256))

    with target.client() as client:
        client.create_topic("legit", 1)
    measure(loop, (BrokerError, OSError), seconds, ready, go, out)


def healthz(target: Target, seconds: float, ready: Any, go: Any, out: Any) -> None:
    """GET /healthz on a new connection, 200 expected"""
    assert target.http_port is not None

    def loop() -> None:
        connection = http_connection(target.http_port)  # type: ignore[arg-type]
        try:
            connection.request("GET", "/healthz")
            answer = connection.getresponse()
            answer.read()
        finally:
            connection.close()
        if answer.status != 200:
            raise Refused(f"/healthz: {answer.status}")

    measure(loop, (OSError, http.client.HTTPException, Refused), seconds, ready, go, out)


def operator_sign_in(target: Target, seconds: float, ready: Any, go: Any, out: Any) -> None:
    """console sign-in from 127.0.0.1 with the right keys: the form, then the post; 303 expected"""
    assert target.http_port is not None

    def loop() -> None:
        connection = http_connection(target.http_port)  # type: ignore[arg-type]
        try:
            status = post_sign_in(connection, sign_in_form(connection), **target.keys)
        finally:
            connection.close()
        if status != 303:
            raise Refused(f"sign-in: {status}")

    measure(loop, (OSError, http.client.HTTPException, Refused), seconds, ready, go, out)


Probe = Callable[[Target, float, Any, Any, Any], None]


@dataclass(frozen=True)
class Scenario:
    """An attack, the legitimate client measured during it, and what the server needs:
    keys, and an HTTP port (which the attack then gets instead of the TCP port). With
    ``in_place`` the measuring starts once the attack is (``IN_PLACE``), else with it."""

    attack: Attack
    probe: Probe = legitimate
    keys: bool = False
    http: bool = False
    in_place: bool = False


SCENARIOS: dict[str, Scenario] = {
    "none": Scenario(no_attack),
    "pipelined-reads": Scenario(pipelined_reads),
    "big-frames": Scenario(big_frames),
    "slowloris": Scenario(slowloris),
    "idle-connections": Scenario(idle_connections),
    "long-poll-flood": Scenario(long_poll_flood),
    "request-flood": Scenario(request_flood),
    "big-send-flood": Scenario(big_send_flood),
    "unauthenticated-flood": Scenario(unauthenticated_flood, keyed_connect_and_send, keys=True, in_place=True),
    "http-slow-requests": Scenario(http_slow_requests, healthz, http=True, in_place=True),
    "sign-in-flood": Scenario(sign_in_flood, operator_sign_in, keys=True, http=True),
}


def fill_bulk_queue(target: Target) -> None:
    with target.client() as client:
        client.create_topic(BULK_TOPIC, 1)
        for _ in range(BULK_MESSAGES):
            client.send(Message(BULK_TOPIC, b"b" * (256 * 1024)))


def describe_code(code: Path) -> str:
    """Which ``broker_embedded`` a server run from checkout ``code`` imports, and its commit."""
    imported = subprocess.run([sys.executable, "-c", "import broker_embedded; print(broker_embedded.__file__)"],
                              env=code_env(code), cwd=code, capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "not a git checkout"
    return f"{imported} (commit {commit})"


def run_scenario(name: str, seconds: float, work: Path, code: Path) -> dict[str, Any]:
    """One fresh server, the legitimate client, one attack; the figures of this run."""
    context = mp.get_context("spawn")
    scenario = SCENARIOS[name]
    keys = KEYS if scenario.keys else {}
    extra = ["--flush", "async", *(f"--{key.replace('_', '-')}={value}" for key, value in keys.items())]
    http_port = free_port() if scenario.http else None
    if http_port is not None:
        extra += ["--http-port", str(http_port)]
    with halfmoon_process(work / name, *extra, code=code) as (server, port):
        url = f"tcp://127.0.0.1:{port}"
        if http_port is not None:
            wait_port(http_port)
        target = Target(url, http_port, keys)
        fill_bulk_queue(target)
        ready, go, out = context.Event(), context.Event(), context.Queue()
        client = context.Process(target=scenario.probe, args=(target, seconds, ready, go, out))
        client.start()
        assert ready.wait(60), "the legitimate client did not start"
        idle = rss_of(server.pid)
        peak = idle
        threads = idle_threads = status_of(server.pid, "Threads")
        stop = threading.Event()
        sampling = threading.Event()

        def sample() -> None:
            nonlocal peak, threads
            while not sampling.wait(0.05):
                peak = max(peak, rss_of(server.pid))
                threads = max(threads, status_of(server.pid, "Threads"))

        sampler = threading.Thread(target=sample)
        sampler.start()
        note: list[str] = []
        attacked = http_port if http_port is not None else port
        attacker = threading.Thread(target=lambda: note.append(scenario.attack(attacked, stop)))
        IN_PLACE.clear()
        attacker.start()
        if scenario.in_place:
            IN_PLACE.wait(IN_PLACE_WAIT_S)
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
        "threads": threads, "idle threads": idle_threads,
        "p50": percentile(latencies, 0.5) * 1000, "p99": percentile(latencies, 0.99) * 1000,
        "loops": len(latencies), "errors": errors, "note": note[0] if note else "attack failed",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each attack")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="scenarios to run (none always runs)")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout the server runs (default: this one)")
    args = parser.parse_args()
    print(f"server code: {describe_code(args.code)}", flush=True)
    names = ["none", *[n for n in SCENARIOS if n != "none" and (not args.only or n in args.only)]]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
        for run in range(args.repeat):
            for name in names:
                print(f"run {run + 1}/{args.repeat}: {name}", file=sys.stderr, flush=True)
                runs[name].append(run_scenario(name, args.seconds, Path(tmp) / f"run{run}", args.code))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def ratio(name: str, key: str) -> str:
        same_client = SCENARIOS[name].probe is SCENARIOS["none"].probe
        return f"{median(name, key) / median('none', key):,.1f}" if same_client else "-"

    for figures in runs.values():
        for r in figures:
            r["ok"] = 100 * (r["loops"] - r["errors"]) / r["loops"] if r["loops"] else float("nan")
    print(f"{args.seconds:.0f} s per attack, medians of {args.repeat} run(s); idle server RSS "
          f"{median('none', 'idle'):.0f} MiB, threads {median('none', 'idle threads'):.0f}")
    header = ("scenario", "RSS peak +MiB", "RSS after +MiB", "threads peak", "p50 ms", "p99 ms", "p50 x", "p99 x",
              "ok %", "loops", "errors", "attack")
    rows = [header]
    for name in names:
        rows.append((
            name, f"{median(name, 'peak'):,.0f}", f"{median(name, 'after'):,.0f}", f"{median(name, 'threads'):,.0f}",
            f"{median(name, 'p50'):,.1f}", f"{median(name, 'p99'):,.1f}", ratio(name, "p50"), ratio(name, "p99"),
            f"{median(name, 'ok'):.1f}", f"{median(name, 'loops'):,.0f}", f"{median(name, 'errors'):,.0f}",
            runs[name][-1]["note"],
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) if i in (0, len(header) - 1) else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(row, widths, strict=True))))
    print(f"targets: RSS peak <= {RSS_TARGET_MIB} MiB above idle, p99 <= {P99_TARGET_MS} ms")
    print("the legitimate client of each scenario (one loop):")
    for probe in dict.fromkeys(SCENARIOS[name].probe for name in names):
        users = ", ".join(name for name in names if SCENARIOS[name].probe is probe)
        print(f"  {users}: {(probe.__doc__ or '').strip()}")


if __name__ == "__main__":
    main()
