"""The HTTP port under connections that never finish (issue 21, finding 8): unfinished
requests hold no thread of their own, a normal request still answers, and connections that
say nothing are closed after the timeout."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from broker_embedded.http.port import HttpLimits, HttpPort

#: The unfinished requests held open at once.
SLOW_CONNECTIONS = 600


def healthz(port: HttpPort) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    finally:
        connection.close()


def test_unfinished_requests_hold_no_thread_and_a_normal_request_still_answers() -> None:
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None)
    port.start()
    held: list[socket.socket] = []
    try:
        assert healthz(port) == 200
        threads = threading.active_count()
        for _ in range(SLOW_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", port.port), timeout=10))
            held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: broker\r\n")  # no blank line: never finished
        started = time.monotonic()
        assert healthz(port) == 200  # accepted after every slow one (the listen queue is in order)
        assert time.monotonic() - started < 5.0, "a normal request waited behind the unfinished ones"
        assert threading.active_count() <= threads, "the unfinished requests took threads of their own"
    finally:
        for sock in held:
            sock.close()
        port.stop()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (EOF) within 20 s."""
    sock.settimeout(20)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False


def test_idle_and_unfinished_connections_are_closed_after_the_timeout() -> None:
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None, limits=HttpLimits(timeout_s=1))
    port.start()
    try:
        unfinished = socket.create_connection(("127.0.0.1", port.port), timeout=10)
        unfinished.sendall(b"GET /healthz HTTP/1.1\r\n")
        silent = socket.create_connection(("127.0.0.1", port.port), timeout=10)
        kept_alive = http.client.HTTPConnection("127.0.0.1", port.port, timeout=10)
        kept_alive.request("GET", "/healthz")
        answer = kept_alive.getresponse()
        assert (answer.status, answer.read()) == (200, b"ok\n")
        assert kept_alive.sock is not None
        for sock in (unfinished, silent, kept_alive.sock):
            assert closed_by_server(sock)
        unfinished.close()
        silent.close()
        kept_alive.close()
    finally:
        port.stop()


def test_limits_are_checked() -> None:
    for bad in ({"threads": 0}, {"max_connections": 0}, {"timeout_s": 0}):
        with pytest.raises(ValueError):
            HttpLimits(**bad)  # type: ignore[arg-type]
