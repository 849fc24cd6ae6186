"""Requests that arrive whole while their connection waits for bytes are served where they
arrive (``BrokerServer.serve_inline``), not by the connection's task; they behave as those
it reads: each answered once, and a request that closes the connection closes it, the
requests after it unserved."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from broker_embedded.errors import AuthenticationError
from broker_embedded.wire.auth import credentials
from broker_embedded.wire.protocol import Kind, RequestCode, encode_frame, unwrap_response
from tests.server.test_limits import answers, raw, requests
from tests.server.test_unauthenticated import KEYS

STATS = RequestCode.GET_BROKER_RUNTIME_INFO


def authenticated(port: int) -> socket.socket:
    """A raw connection through the challenge handshake (request ids 1 and 2)."""
    sock = raw(port)
    sock.settimeout(10)
    sock.sendall(encode_frame(RequestCode.AUTHENTICATE, 1, Kind.REQUEST, {}))
    read = answers(sock)
    _, challenge = next(read)
    sock.sendall(encode_frame(RequestCode.AUTHENTICATE, 2, Kind.REQUEST,
                              credentials("ak", "sk", unwrap_response(challenge))))
    request_id, body = next(read)
    assert request_id == 2 and unwrap_response(body) is None
    return sock


def test_a_refused_authenticate_closes_the_connection_before_the_requests_after_it(thread_server) -> None:
    server = thread_server(**KEYS)
    with authenticated(server.server.port) as sock:
        assert dict(answers_of(sock, encode_frame(STATS, 3, Kind.REQUEST, {})))[3]  # served: it is open
        wrong = {"access_key": "ak", "signature": "0" * 64}
        got = dict(answers_of(sock, encode_frame(RequestCode.AUTHENTICATE, 4, Kind.REQUEST, wrong)
                              + encode_frame(STATS, 5, Kind.REQUEST, {}), until_closed=True))
    with pytest.raises(AuthenticationError):
        unwrap_response(got[4])
    assert 5 not in got


@pytest.mark.parametrize("count", [1, 40, 300])
def test_requests_in_one_chunk_are_each_answered_once(thread_server, count: int) -> None:
    """Within ``max_requests_in_flight`` (64) a chunk is served where it arrives; past it,
    by the connection's task, which waits for room."""
    server = thread_server(**KEYS)
    with authenticated(server.server.port) as sock:
        got = list(answers_of(sock, requests(STATS, {}, count), expect=count))
    assert sorted(request_id for request_id, _ in got) == list(range(1, count + 1))


def answers_of(sock: socket.socket, data: bytes, *, expect: int = 1,
               until_closed: bool = False) -> list[tuple[int, Any]]:
    """Send ``data`` at once; the ``(request_id, body)`` answers: ``expect`` of them, or every
    one until the server closes the connection (a timeout fails the test)."""
    sock.sendall(data)
    got: list[tuple[int, Any]] = []
    for answer in answers(sock):
        got.append(answer)
        if not until_closed and len(got) == expect:
            break
    return got
