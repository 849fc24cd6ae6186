"""A captured AUTHENTICATE is worthless on another connection (issue 10, finding 9).

A recording TCP relay sits between a real client and the server and keeps every byte the
client sent; those frames are then replayed, byte for byte, on a new raw connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import threading
import time
from typing import Any

import pytest

from broker_embedded import AsyncBrokerClient, BrokerClient
from broker_embedded.errors import AuthenticationError
from broker_embedded.wire.protocol import (
    LENGTH,
    FrameBuffer,
    Kind,
    RequestCode,
    encode_frame,
    unwrap_response,
)
from tests.server.wire import decode_frame

STATS = 999  # the request id of the request that follows a replayed handshake


class RecordingRelay:
    """Relays TCP connections to ``127.0.0.1:target_port``, keeping what clients send."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.sent = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    with self.lock:
                        self.sent += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def captured(self) -> list[bytes]:
        """The frames (length prefix included) clients sent through the relay, in order."""
        with self.lock:
            payloads = list(FrameBuffer().feed(bytes(self.sent)))
        return [LENGTH.pack(len(payload)) + payload for payload in payloads]

    def close(self) -> None:
        self.listener.close()


def _use_client(kind: str, url: str) -> None:
    """Authenticate with a real client through ``url`` and make one request."""
    if kind == "sync":
        with BrokerClient(url, access_key="ak", secret_key="sk") as client:
            client.stats()
        return

    async def scenario() -> None:
        async with AsyncBrokerClient(url, access_key="ak", secret_key="sk") as client:
            await client.stats()

    asyncio.run(scenario())


def _answers(port: int, frames: list[bytes]) -> dict[int, Any]:
    """Send ``frames`` on a new connection; the response bodies by request id, read until
    the server closes the connection (or goes quiet for two seconds)."""
    answers: dict[int, Any] = {}
    buffer = FrameBuffer()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"".join(frames))
        sock.settimeout(2)
        try:
            while data := sock.recv(65536):
                for payload in buffer.feed(data):
                    _, request_id, kind, body = decode_frame(payload)
                    if kind is Kind.RESPONSE:
                        answers[request_id] = body
        except TimeoutError:
            answers[-1] = "the connection stayed open"
    return answers


def _stats_request() -> bytes:
    return encode_frame(RequestCode.GET_BROKER_RUNTIME_INFO, STATS, Kind.REQUEST, {})


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_captured_authenticate_is_refused_on_a_new_connection(thread_server, kind: str) -> None:
    server = thread_server(access_key="ak", secret_key="sk")
    relay = RecordingRelay(server.server.port)
    try:
        _use_client(kind, f"tcp://127.0.0.1:{relay.port}")
        frames = relay.captured()
    finally:
        relay.close()
    handshake = [frame for frame in frames if decode_frame(frame[LENGTH.size:])[0] == RequestCode.AUTHENTICATE]
    assert handshake, "the client authenticated through the relay"
    signed_id = decode_frame(handshake[-1][LENGTH.size:])[1]

    answers = _answers(server.server.port, [*handshake, _stats_request()])

    with pytest.raises(AuthenticationError):
        unwrap_response(answers[signed_id])
    assert STATS not in answers, "a replayed handshake must not open the connection"
    assert -1 not in answers, "the server closes a connection whose credentials are wrong"


def test_the_old_clock_signed_credentials_get_a_typed_error_that_says_why(thread_server) -> None:
    server = thread_server(access_key="ak", secret_key="sk")
    stamp, nonce = int(time.time() * 1000), "0123456789abcdef"
    signature = hmac.new(b"sk", f"ak:{stamp}:{nonce}".encode(), hashlib.sha256).hexdigest()
    old_style = {"access_key": "ak", "timestamp_ms": stamp, "nonce": nonce, "signature": signature}

    answers = _answers(server.server.port, [encode_frame(RequestCode.AUTHENTICATE, 1, Kind.REQUEST, old_style),
                                            _stats_request()])

    with pytest.raises(AuthenticationError, match="challenge"):
        unwrap_response(answers[1])
    assert STATS not in answers and -1 not in answers


def test_keys_also_work_against_a_server_without_authentication(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url, access_key="ak", secret_key="sk") as client:
        assert client.stats().topics == ()
