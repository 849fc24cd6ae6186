"""A seeded, bounded fuzzer against a real server process.

For every request code it sends random bytes, frames cut short, frames near the size limit,
bodies of the wrong shape and mutations of valid bodies, pipelined on one connection, plus
frames that break the framing on connections of their own; meanwhile a legitimate client
sends, receives and acks. It checks that the server stays up, that every frame gets
exactly one answer (with its request id when that is readable) and none fails inside the
server (no traceback in its log), that the legitimate client never fails and its messages are all stored intact, and that the server's RSS stays
bounded. ``FUZZ_SEED`` and ``FUZZ_SECONDS`` (default 20) repeat or lengthen a run.
"""

from __future__ import annotations

import copy
import functools
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_embedded import BrokerClient, Message
from broker_embedded.errors import BrokerError
from broker_embedded.wire.protocol import LENGTH, MAX_FRAME_BYTES, Kind, RequestCode

from .conftest import ServerProcess
from .wire import RawConnection, envelope, framed, pack

SEED = int(os.environ.get("FUZZ_SEED", "20261123"))
SECONDS = float(os.environ.get("FUZZ_SECONDS", "20"))
#: The server's resident memory may not grow past this (it starts at about 60 MiB and
#: stays under 80 MiB in a 20 s run).
RSS_LIMIT_BYTES = 256 * 1024 * 1024
#: Request ids of fuzz frames start here: random bytes cannot pass for one by chance.
FIRST_ID = 10**9
WINDOW = 32

MESSAGE = {"topic": "fuzz", "body": b"fuzz", "keys": ["k"], "tag": "t", "properties": {"p": "v"}}
#: A valid body for every request code. EXPORT_MESSAGES never gets a usable out_dir: an
#: export would write wherever a mutation points it.
SAMPLES: dict[RequestCode, dict[str, Any]] = {
    RequestCode.SEND_MESSAGE: {"message": MESSAGE},
    RequestCode.SEND_BATCH_MESSAGE: {"messages": [MESSAGE, MESSAGE]},
    RequestCode.PULL_MESSAGE: {"topic": "fuzz", "queue_id": 0, "offset": 0, "max_messages": 4},
    RequestCode.QUERY_MESSAGE: {"topic": "fuzz", "key": "k", "max_messages": 4},
    RequestCode.UPDATE_AND_CREATE_TOPIC: {"topic": "fuzz", "queues": 2},
    RequestCode.GET_ALL_TOPIC_CONFIG: {},
    RequestCode.GET_BROKER_RUNTIME_INFO: {},
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: {"topic": "fuzz", "queue_id": 0, "timestamp_ms": 0},
    RequestCode.VIEW_MESSAGE_BY_ID: {"message_id": "m"},
    RequestCode.HEART_BEAT: {"producer_group": "pg"},
    RequestCode.UNREGISTER_CLIENT: {"producer_group": "pg"},
    RequestCode.END_TRANSACTION: {"transaction_id": "t", "resolution": "commit", "producer_group": "pg"},
    RequestCode.CHECK_TRANSACTION_STATE: {"producer_group": "pg", "transaction_id": "t"},
    RequestCode.POP_MESSAGE: {"group": "fg", "topic": "fuzz", "max_messages": 4, "wait_s": 0},
    RequestCode.ACK_MESSAGE: {"group": "fg", "receipt_handle": "fuzz|fuzz|0|0|x"},
    RequestCode.ACK_MESSAGE_BATCH: {"group": "fg", "receipt_handles": ["fuzz|fuzz|0|0|x", "x"]},
    RequestCode.CHANGE_INVISIBLE_DURATION: {"group": "fg", "receipt_handle": "x", "invisible_duration_s": 1.0},
    RequestCode.DEAD_LETTER_MESSAGE: {"group": "fg", "receipt_handle": "fuzz|fuzz|0|0|x"},
    RequestCode.SEND_HALF_MESSAGE: {"message": MESSAGE, "producer_group": "pg", "transaction_id": "t"},
    RequestCode.RELAY_COMMITTED: {"messages": [MESSAGE], "producer_group": "pg", "transaction_id": "r"},
    RequestCode.RECALL_MESSAGE: {"topic": "fuzz", "recall_handle": "x"},
    RequestCode.GET_TRANSACTION_STATE: {"transaction_id": "t"},
    RequestCode.LIST_PARKED_TRANSACTIONS: {},
    RequestCode.LIST_OPEN_TRANSACTIONS: {"producer_group": "pg"},
    RequestCode.RESOLVE_PARKED_TRANSACTION: {"transaction_id": "t", "resolution": "rollback"},
    RequestCode.RECHECK_PARKED_TRANSACTION: {"transaction_id": "t"},
    RequestCode.LIST_DLQ_MESSAGES: {"group": "fg", "max_messages": 4},
    RequestCode.RESEND_DLQ_MESSAGE: {"group": "fg", "message_id": "m"},
    RequestCode.DELETE_SUBSCRIPTIONGROUP: {"group": "fg"},
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: {"group": "fg", "topic": "fuzz", "timestamp_ms": 0},
    RequestCode.AUTHENTICATE: {"access_key": "a", "signature": "s"},
    RequestCode.EXPORT_MESSAGES: {"out_dir": 0},
}
TEXTS = ["", "fuzz", "k", "é", "\x00", "a b", "%DLQ%fg", "RMQ_SYS_X", "x" * 200, "💥" * 3, "fuzz|fuzz|0|0|x"]
NUMBERS = [0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 0.5, -0.0, 1e300, float("inf"), float("nan")]


class Fuzzer:
    """Random frames from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def value(self, depth: int = 0) -> Any:
        """A random msgpack value, sometimes nested."""
        rng = self.rng
        kind = rng.randrange(9 if depth < 3 else 6)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.choice(NUMBERS)
        if kind == 2:
            return rng.randint(-(2**63), 2**64 - 1)
        if kind == 3:
            return rng.choice(TEXTS)
        if kind == 4:
            return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(12)))
        if kind == 5:
            return rng.randbytes(rng.randrange(16))
        if kind == 6:
            return [self.value(depth + 1) for _ in range(rng.randrange(4))]
        if kind == 7:
            return {rng.choice(TEXTS): self.value(depth + 1) for _ in range(rng.randrange(4))}
        return {rng.randrange(100): self.value(depth + 1)}

    def mutated(self, code: RequestCode) -> Any:
        """The sample body of ``code`` with up to three random changes."""
        body: Any = copy.deepcopy(SAMPLES[code])
        for _ in range(self.rng.randint(0, 3)):
            body = self._mutate(body)
        if code is RequestCode.POP_MESSAGE and isinstance(body, dict):
            wait = body.get("wait_s")
            if isinstance(wait, int | float) and 0 < wait < float("inf"):
                body["wait_s"] = min(wait, 0.5)  # long polls would hold the window up
        if code is RequestCode.EXPORT_MESSAGES and isinstance(body, dict) and "out_dir" in body:
            body["out_dir"] = 0
        return body

    def _mutate(self, value: Any) -> Any:
        rng = self.rng
        if isinstance(value, dict) and value and rng.random() < 0.7:
            key = rng.choice(list(value))
            action = rng.randrange(4)
            if action == 0:
                del value[key]
            elif action == 1:
                value[key] = self._mutate(value[key])
            elif action == 2:
                value[rng.choice(TEXTS)] = self.value()
            else:
                value[key] = self.value()
            return value
        if isinstance(value, list) and value and rng.random() < 0.7:
            index = rng.randrange(len(value))
            value[index] = self._mutate(value[index])
            return value
        return self.value()

    def frame(self, request_id: int) -> tuple[str, bytes, int | None]:
        """A fuzz frame's kind, its payload and the request id its answer must carry (None:
        any)."""
        rng = self.rng
        code = rng.choice(list(RequestCode))
        head_length = len(envelope(code, request_id, 0, b""))
        kind = rng.randrange(10)
        if kind <= 3:
            return "mutated body", envelope(code, request_id, 0, pack(self.mutated(code))), request_id
        if kind == 4:
            return "body of another shape", envelope(code, request_id, 0, pack(self.value())), request_id
        if kind == 5:
            return "random body bytes", envelope(code, request_id, 0, rng.randbytes(rng.randrange(64))), request_id
        if kind == 6:
            nested = b"\x91" * rng.randrange(1, 200_000) + pack(self.value())
            return "nesting", envelope(code, request_id, 0, b"\x81\xa7message" + nested), request_id
        if kind == 7:
            payload = envelope(code, request_id, 0, pack(SAMPLES[code]))
            cut = rng.randrange(len(payload))
            id_end = 1 + len(pack(code)) + len(pack(request_id))
            return "cut short", payload[:cut], request_id if cut >= id_end else 0
        if kind == 8:
            envelope_value = [self.value() for _ in range(rng.randrange(6))]
            return "envelope of another shape", pack(envelope_value), None
        if rng.random() < 0.5:
            return "random bytes", rng.randbytes(rng.randrange(256)), None
        filler = rng.choice([b"\x90", b"\xa0", b"\xc0", b"\x91\x90"])
        count = (MAX_FRAME_BYTES - head_length - 5 - rng.randrange(8)) // len(filler)
        huge = b"\xdd" + count.to_bytes(4, "big") + filler * count
        return "near the size limit", envelope(code, request_id, 0, huge), request_id


def broken_framing(port: int, rng: random.Random) -> str | None:
    """A connection whose framing breaks: a length over the limit (answered with
    MalformedFrameError, then closed) or a frame cut off by a hang-up. A problem, or None."""
    if rng.random() < 0.5:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(LENGTH.pack(rng.randrange(100, 10_000)) + rng.randbytes(rng.randrange(100)))
        sock.close()
        return None
    connection = RawConnection(port, timeout_s=10)
    try:
        connection.sock.sendall(LENGTH.pack(rng.randrange(MAX_FRAME_BYTES + 1, 2**32)) + rng.randbytes(16))
        _, request_id, _, body = connection.reply()
        if request_id != 0 or "error" not in body or not connection.closed_by_server():
            return f"over-long frame: {request_id} {body}"
        return None
    finally:
        connection.close()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class LegitimateClient(threading.Thread):
    """Sends numbered messages and receives and acks some, recording every failure."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = BrokerClient(url, timeout_s=10)
        self.stop = threading.Event()
        self.sent: dict[str, bytes] = {}
        self.failures: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            self._attempt(functools.partial(self._send, f"legitimate {n} ".encode() * (n % 50 + 1)))
            if n % 5 == 0:
                self._attempt(self._receive_and_ack)

    def _send(self, body: bytes) -> None:
        self.sent[self.client.send(Message("orders", body)).message_id] = body

    def _receive_and_ack(self) -> None:
        for received in self.client.receive("legitimate", "orders", max_messages=8):
            self.client.ack("legitimate", received.receipt_handle)

    def _attempt(self, call: Callable[[], None]) -> None:
        try:
            call()
        except BrokerError as exc:
            self.failures.append(repr(exc))


def test_fuzzed_frames_harm_neither_the_server_nor_other_clients(server_factory) -> None:
    assert set(SAMPLES) == set(RequestCode), "every request code needs a sample body"
    server: ServerProcess = server_factory()
    assert server.proc is not None
    rng = random.Random(SEED)
    fuzzer = Fuzzer(rng)
    legitimate = LegitimateClient(server.url)
    legitimate.client.create_topic("orders", 2)
    legitimate.start()
    problems: list[str] = []
    counts: dict[str, int] = {}
    max_rss = rss_bytes(server.proc.pid)
    connection = RawConnection(server.port, timeout_s=15)
    request_id = FIRST_ID
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline and len(problems) < 10:
            window = []
            for _ in range(WINDOW):
                request_id += 1
                kind, payload, expected = fuzzer.frame(request_id)
                counts[kind] = counts.get(kind, 0) + 1
                connection.sock.sendall(framed(payload))
                window.append((kind, payload, expected))
            replies: list[int] = []
            while len(replies) < len(window):
                try:
                    _, replied_id, frame_kind, _ = connection.reply()
                except (TimeoutError, ConnectionError) as exc:
                    problems.append(f"{type(exc).__name__} after {len(replies)} of {len(window)} answers")
                    break
                if frame_kind is not Kind.PUSH:
                    replies.append(replied_id)
            unread_ids = sum(expected == 0 for _, _, expected in window)
            if replies.count(0) < unread_ids:
                problems.append(f"{replies.count(0)} answers with id 0 to {unread_ids} frames without a readable id")
            for kind, payload, expected in window:
                if expected and replies.count(expected) != 1:
                    problems.append(f"{kind} {payload[:60]!r}: {replies.count(expected)} answers with id {expected}")
            if problems:
                break
            if rng.random() < 0.2:
                problem = broken_framing(server.port, rng)
                problems += [problem] if problem else []
            max_rss = max(max_rss, rss_bytes(server.proc.pid))
    finally:
        legitimate.stop.set()
        legitimate.join(30)
        connection.close()
    context = f"seed {SEED}, frames {counts}"
    assert not problems, f"{context}: {problems}"
    assert server.proc.poll() is None, "the server is up"
    assert "Traceback" not in server.log.read_text(errors="replace"), f"{context}: the server failed inside"
    assert not legitimate.failures, f"{context}: legitimate requests failed: {legitimate.failures[:5]}"
    assert len(legitimate.sent) > 20, "the legitimate client got work done"
    with BrokerClient(server.url) as client:
        for message_id, body in legitimate.sent.items():
            stored = client.query_by_id(message_id)
            assert stored is not None and stored.message.body == body, f"{context}: message {message_id}"
    assert max_rss < RSS_LIMIT_BYTES, f"{context}: server RSS {max_rss / 2**20:.0f} MiB"
    print(f"{context}; legitimate sends {len(legitimate.sent)}; server RSS up to {max_rss / 2**20:.0f} MiB")
