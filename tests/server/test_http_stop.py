"""``HttpPort.stop`` owns the one close of each of the port's descriptors: the I/O thread
closes the sockets it polls once its loop ends, ``stop`` closes the wake-up pipe once no
thread can write to it. waitress closed the pipe together with the listening socket, also
when the socket failed, and then ``stop`` wrote to a closed descriptor (EBADF, or another
file's under the same number)."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from broker_embedded.http.port import HttpPort, StartResponse


def open_descriptors() -> set[str]:
    """What each open descriptor of this process is (``socket:[inode]``, ``pipe:[inode]``...)."""
    links = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{name}"))
        except FileNotFoundError:  # closed meanwhile (the listing's own descriptor, another thread's)
            pass
    return links


def port_descriptors(port: HttpPort) -> tuple[str, str]:
    """What the port's listening socket and its wake-up pipe are, as ``open_descriptors`` shows them."""
    server = port._server
    assert server is not None
    return (os.readlink(f"/proc/self/fd/{server.socket.fileno()}"),
            os.readlink(f"/proc/self/fd/{server.trigger.trigger}"))


def waiting_for_the_client() -> bool:
    """Whether a waitress worker waits for the I/O thread to send what it buffered."""
    for frame in sys._current_frames().values():
        if frame.f_code.co_name == "wait" and frame.f_back is not None \
                and frame.f_back.f_code.co_name == "_flush_outbufs_below_high_watermark":
            return True
    return False


def waitress_threads() -> int:
    return sum(thread.name.startswith("waitress-") for thread in threading.enumerate())


def answered(port: HttpPort) -> http.client.HTTPConnection:
    """A kept-alive connection that had one answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port.port, timeout=10)
    connection.request("GET", "/healthz")
    answer = connection.getresponse()
    assert (answer.status, answer.read()) == (200, b"ok\n")
    return connection


def closed_by_server(sock: socket.socket | None) -> bool:
    assert sock is not None
    sock.settimeout(10)
    return sock.recv(1) == b""


def test_stop_after_the_listening_socket_failed(caplog: pytest.LogCaptureFixture) -> None:
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None)
    port.start()
    listening, pipe = port_descriptors(port)
    kept_alive = answered(port)
    assert port._server is not None
    port._server.socket.shutdown(socket.SHUT_RDWR)  # the I/O thread polls POLLHUP on it: waitress closes it
    deadline = time.monotonic() + 10
    while listening in open_descriptors():
        assert time.monotonic() < deadline, "the I/O thread did not close the failed socket"
        time.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="broker_embedded"):
        port.stop()  # wrote to the wake-up pipe waitress had closed with the socket: EBADF
        port.stop()
    assert [record.getMessage() for record in caplog.records if record.name.startswith("broker_embedded")] == []
    assert closed_by_server(kept_alive.sock)
    kept_alive.close()
    assert {listening, pipe} & open_descriptors() == set()


def held_port(entered: threading.Event, release: threading.Event, wait_s: float) -> HttpPort:
    """A started port whose app sets ``entered``, then answers once ``release`` is set (or
    ``wait_s`` passed)."""

    def held(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        entered.set()
        release.wait(wait_s)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "4")])
        return [b"late"]

    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None, {"/": held})
    port.start()
    return port


def test_the_wake_up_pipe_outlives_the_workers_still_answering() -> None:
    entered, release = threading.Event(), threading.Event()
    port = held_port(entered, release, 10)
    listening, pipe = port_descriptors(port)
    client = http.client.HTTPConnection("127.0.0.1", port.port, timeout=10)
    client.request("GET", "/slow")
    assert entered.wait(10)
    stopping = threading.Thread(target=port.stop)
    stopping.start()
    try:
        with pytest.raises(http.client.RemoteDisconnected):  # stop closed the connection
            client.getresponse()
        open_now = open_descriptors()
        # The worker still answering may write to the pipe (waitress wakes the I/O thread
        # with it): closed, its number could be another file's by then.
        assert listening not in open_now and pipe in open_now
    finally:
        release.set()
        stopping.join(10)
    client.close()
    assert pipe not in open_descriptors()


def test_stop_wakes_a_worker_waiting_for_a_client_that_does_not_read() -> None:
    generator_closed = threading.Event()

    def large(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])

        def body() -> Iterator[bytes]:
            try:
                for _ in range(256):
                    yield b"x" * (1 << 20)
            finally:
                generator_closed.set()

        return body()

    threads = waitress_threads()
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None, {"/": large})
    port.start()
    client = socket.create_connection(("127.0.0.1", port.port), timeout=10)
    try:
        client.sendall(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")  # and reads nothing
        deadline = time.monotonic() + 10
        while not waiting_for_the_client():  # past the 16 MiB that waitress buffers
            assert time.monotonic() < deadline, "the worker never waited"
            time.sleep(0.05)
        started = time.monotonic()
        port.stop()
        assert time.monotonic() - started < 2.0, "stop waited for the worker"
        assert generator_closed.wait(1) and waitress_threads() <= threads
    finally:
        client.close()


def test_a_worker_still_answering_after_5_s_keeps_the_wake_up_pipe(caplog: pytest.LogCaptureFixture) -> None:
    entered, release = threading.Event(), threading.Event()
    port = held_port(entered, release, 30)
    _, pipe = port_descriptors(port)
    client = socket.create_connection(("127.0.0.1", port.port), timeout=10)
    try:
        client.sendall(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")
        assert entered.wait(10)
        with caplog.at_level(logging.WARNING, logger="broker_embedded"):
            port.stop()  # gives the worker 5 s
        assert "threads still running after 5 s" in caplog.text
        assert pipe in open_descriptors()  # the worker may still write to it: left open, never closed under it
    finally:
        release.set()
        client.close()
