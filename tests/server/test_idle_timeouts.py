"""The server's deadlines on simulated time (issue 27): idle connections, connections that
do not authenticate, requests that never arrive whole, long polls and producers waiting
for check-backs.

A real server on a real loopback socket, over an ``EmbeddedBroker`` on a real disk; only
time is simulated. The broker's clock (``StoreConfig.clock``) is a ``SimClock``, which the
server's deadlines read too (``BrokerServer.clock``); a test moves it and runs one sweep of
the server (``close_overdue``) and one round of the broker's timers (``run_timers``)
itself, so hours of idleness take no time and no test sleeps. Each deadline is held at
its edge: nothing is closed at it, and the connection is closed a millisecond past it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message, ServerLimits
from broker_embedded.message import CheckRequest, Resolution, TransactionState
from broker_embedded.store.config import StoreConfig
from broker_embedded.wire.auth import credentials
from broker_embedded.wire.protocol import LENGTH, Kind, RequestCode, encode_frame
from tests.server.conftest import ThreadServer
from tests.server.test_limits import closed_by_server, eventually, raw, take
from tests.server.test_unauthenticated import KEYS
from tests.sim.clock import SimClock

LIMITS = ServerLimits()
#: A millisecond: the clock's step past a deadline.
PAST = 0.001
LIST_TOPICS = encode_frame(RequestCode.GET_ALL_TOPIC_CONFIG, 1, Kind.REQUEST, {})


@dataclasses.dataclass
class SimServer:
    """A served broker whose clock the test moves."""

    served: ThreadServer
    clock: SimClock

    @property
    def port(self) -> int:
        return self.served.server.port

    @property
    def url(self) -> str:
        return self.served.url

    def later(self, seconds: float) -> int:
        """Move the clock ``seconds`` on and sweep the server once: the connections closed."""
        self.clock.advance(seconds)

        async def sweep() -> int:
            return self.served.server.close_overdue()

        return asyncio.run_coroutine_threadsafe(sweep(), self.served.loop).result(30)


@pytest.fixture
def sim_server(thread_server: Callable[..., ThreadServer]) -> Callable[..., SimServer]:
    def start(**server_options: Any) -> SimServer:
        clock = SimClock()
        # the broker's service thread never acts: the test runs its timers
        config = BrokerConfig(store=StoreConfig(clock=clock), service_tick_s=1e6)
        served = thread_server(config, **server_options)
        assert served.server.clock is clock, "the server does not read the broker's clock"
        return SimServer(served, clock)

    return start


def authenticated(port: int) -> socket.socket:
    """A raw connection that has authenticated with ``KEYS`` (its last request answered)."""
    sock = raw(port)
    sock.sendall(encode_frame(RequestCode.AUTHENTICATE, 1, Kind.REQUEST, {}))
    [(_, challenge)] = take(sock, 1)
    signed = credentials(KEYS["access_key"], KEYS["secret_key"], challenge["ok"])
    sock.sendall(encode_frame(RequestCode.AUTHENTICATE, 2, Kind.REQUEST, signed))
    assert take(sock, 1) == [(2, {"ok": None})]
    return sock


def test_an_idle_authenticated_connection_is_closed_at_its_idle_timeout(sim_server) -> None:
    server = sim_server(**KEYS)
    sock = authenticated(server.port)
    assert server.later(LIMITS.auth_timeout_s + PAST) == 0, "an authenticated connection held to the auth deadline"
    sock.sendall(LIST_TOPICS)
    assert take(sock, 1) == [(1, {"ok": []})]
    assert server.later(LIMITS.idle_timeout_s) == 0, "closed at its idle timeout, not past it"
    assert server.later(PAST) == 1
    assert closed_by_server(sock)


def test_an_unauthenticated_connection_is_closed_at_its_shorter_deadline(sim_server) -> None:
    server = sim_server(**KEYS)
    waiting = raw(server.port)
    for request_id in (1, 2):  # asking for challenges is no activity
        waiting.sendall(encode_frame(RequestCode.AUTHENTICATE, request_id, Kind.REQUEST, {}))
        [(answered, challenge)] = take(waiting, 1)
        assert answered == request_id and "challenge" in challenge["ok"]
        assert server.later(LIMITS.auth_timeout_s / 2) == 0
    assert server.later(PAST) == 1
    assert closed_by_server(waiting)


def test_a_request_that_never_arrives_whole_is_closed_at_the_frame_deadline(sim_server) -> None:
    server = sim_server()
    slow = raw(server.port)
    # one write: a whole request, then the first bytes of a 1000-byte one. The answer to the
    # first goes out after the server has read both (it runs as a task of its own)
    slow.sendall(LIST_TOPICS + LENGTH.pack(1000) + b"\x94\x0a")
    assert take(slow, 1) == [(1, {"ok": []})]
    assert server.later(LIMITS.frame_timeout_s) == 0
    assert server.later(PAST) == 1, "a half-sent request kept its connection past the frame deadline"
    assert closed_by_server(slow)


def test_a_long_poll_is_not_idle_and_its_answer_is_activity(sim_server) -> None:
    server = sim_server()
    broker = server.served.broker
    broker.create_topic("polled", 1)
    polling = raw(server.port)
    poll = {"group": "g", "topic": "polled", "wait_s": 600.0}  # real seconds: the message ends it
    polling.sendall(LIST_TOPICS + encode_frame(RequestCode.POP_MESSAGE, 2, Kind.REQUEST, poll))
    assert take(polling, 1)[0][0] == 1  # both requests read: the receive waits
    assert server.later(3 * LIMITS.idle_timeout_s) == 0, "a connection waiting in a long poll was closed as idle"
    broker.send(Message("polled", b"at last"))
    [(request_id, answer)] = take(polling, 1)
    assert request_id == 2 and [m["message"]["body"] for m in answer["ok"]] == [b"at last"]
    assert server.later(LIMITS.idle_timeout_s) == 0
    assert server.later(PAST) == 1
    assert closed_by_server(polling)


def test_a_producer_closed_while_idle_reconnects_and_answers_check_backs(sim_server) -> None:
    server = sim_server(**KEYS)
    broker = server.served.broker
    checked: list[CheckRequest] = []
    answered = threading.Semaphore(0)
    with BrokerClient(server.url, timeout_s=30, **KEYS) as producer:

        def on_check(request: CheckRequest) -> None:
            producer.end_transaction(request.transaction_id, Resolution.COMMIT, producer_group="pg", from_check=True)
            checked.append(request)
            answered.release()

        producer.create_topic("orders", 1)
        producer.send_half(Message("orders", b"first"), producer_group="pg", transaction_id="tx1")
        assert server.later(LIMITS.idle_timeout_s + PAST) == 1  # not registered yet: idle
        # the client learns of the close when its reader sees it (a call before then fails)
        assert eventually(lambda: producer._current() is None)
        producer.register_producer("pg", on_check)  # reconnects, authenticates, registers
        server.clock.advance(broker.config.transaction_timeout_s)
        broker.run_timers()
        assert answered.acquire(timeout=30), "the check-back did not reach the reconnected producer"
        assert broker.transaction_state("tx1") is TransactionState.COMMITTED
        # waiting for check-backs is not idleness, however long
        assert server.later(12 * 3600.0) == 0
        producer.send_half(Message("orders", b"second"), producer_group="pg", transaction_id="tx2")
        assert server.later(LIMITS.idle_timeout_s + PAST) == 0
        broker.run_timers()
        assert answered.acquire(timeout=30), "the check-back after hours of quiet was not answered"
        assert [request.transaction_id for request in checked] == ["tx1", "tx2"]
        assert broker.transaction_state("tx2") is TransactionState.COMMITTED
