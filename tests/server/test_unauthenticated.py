"""With keys, connections that never authenticate cannot lock the right keys out (issue 21,
finding 5): they have a deadline to authenticate (a challenge is not activity) and a cap of
their own, well below ``max_connections``; past the cap the oldest of them is closed."""

from __future__ import annotations

import resource
import socket
import threading
import time

import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message, ServerLimits
from broker_embedded.wire.protocol import Kind, RequestCode, encode_frame
from tests.server.test_limits import closed_by_server, raw

KEYS = {"access_key": "ak", "secret_key": "sk"}
CHALLENGE = encode_frame(RequestCode.AUTHENTICATE, 1, Kind.REQUEST, {})
#: A lock-out lasts until the attackers' authentication deadline (``auth_timeout_s``, 10 s by
#: default) closes them; a served client is far below half of it even on a loaded machine. The
#: issue's 1 s figure is a measurement: ``benchmarks/abuse.py`` prints it.
BOUND_S = ServerLimits().auth_timeout_s / 2


def keyed_client(url: str) -> BrokerClient:
    return BrokerClient(url, timeout_s=30, **KEYS)


def test_a_challenge_is_not_activity(thread_server) -> None:
    server = thread_server(BrokerConfig(limits=ServerLimits(auth_timeout_s=0.5)), **KEYS)
    stalling = raw(server.server.port)
    stop = threading.Event()

    def ask_for_challenges() -> None:
        while not stop.wait(0.1):
            try:
                stalling.sendall(CHALLENGE)
            except OSError:
                return

    asking = threading.Thread(target=ask_for_challenges)
    asking.start()
    try:
        assert closed_by_server(stalling), "a connection asking for challenges was kept past its deadline"
    finally:
        stop.set()
        asking.join()
        stalling.close()
    # that an authenticated connection is not held to the deadline: test_idle_timeouts.py,
    # on simulated time (no sleep)


def test_unauthenticated_connections_cannot_take_every_slot(thread_server) -> None:
    server = thread_server(BrokerConfig(limits=ServerLimits(max_connections=64, max_unauthenticated=16)), **KEYS)
    waiting = [raw(server.server.port) for _ in range(100)]
    try:
        for sock in waiting:
            sock.sendall(CHALLENGE)
        for _ in range(20):
            with keyed_client(server.url) as client:
                client.list_topics()
        assert server.server.connections <= 16 + 1
    finally:
        for sock in waiting:
            sock.close()


def attackers(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each ask for a challenge and never answer it."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(CHALLENGE)
        socks.append(sock)
    return socks


def raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        pytest.skip(f"needs {wanted} open files")


def timed(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started


@pytest.mark.slow
def test_two_thousand_unauthenticated_connections_never_delay_the_keys(server_factory) -> None:
    raise_open_files(5000)
    server = server_factory("--access-key", "ak", "--secret-key", "sk")

    def connect_and_send() -> None:
        with keyed_client(server.url) as client:
            client.send(Message("attacked", b"still served"))

    connect_and_send()
    attack: list[socket.socket] = []
    durations = []
    try:
        for _ in range(4):  # 4 waves of 500 connections, measuring after each
            attack += attackers(server.port, 500)
            durations.append(timed(connect_and_send))
    finally:
        for sock in attack:
            sock.close()
    assert max(durations) < BOUND_S, f"connect and send took {max(durations):.2f}s under attack"
