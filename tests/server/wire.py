"""A raw protocol connection for tests that send frames no client would."""

from __future__ import annotations

import socket
from collections import deque
from typing import Any

import msgspec

from broker_embedded.wire.protocol import (
    LENGTH,
    READ_CHUNK,
    FrameBuffer,
    Kind,
    decode_body,
    encode_frame,
    read_frame,
)

#: msgpack of a frame's contents (a whole payload, or a body to splice into one).
pack = msgspec.msgpack.Encoder().encode


def decode_frame(payload: bytes) -> tuple[int, int, Kind, Any]:
    """``(code, request_id, kind, body)`` of a frame payload, its body decoded as it is."""
    frame = read_frame(payload)
    return frame.code, frame.request_id, frame.kind, decode_body(frame.body)


def framed(payload: bytes) -> bytes:
    """``payload`` behind its length prefix."""
    return LENGTH.pack(len(payload)) + payload


def envelope(code: Any, request_id: Any, kind: Any, body: bytes) -> bytes:
    """The payload ``[code, request_id, kind, body]`` with ``body`` already msgpack."""
    return b"\x94" + pack(code) + pack(request_id) + pack(kind) + body


class RawConnection:
    """A TCP connection to a broker server that sends bytes as given and reads frames."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.frames = FrameBuffer()
        self.ready: deque[bytes] = deque()

    def send(self, payload: bytes) -> None:
        """Send one frame with ``payload`` as its contents."""
        self.sock.sendall(framed(payload))

    def request(self, code: int, request_id: int, body: Any) -> None:
        """Send a well-formed request frame."""
        self.sock.sendall(encode_frame(code, request_id, Kind.REQUEST, body))

    def reply(self) -> tuple[int, int, Kind, Any]:
        """The next frame from the server (``ConnectionError`` if it closed, ``TimeoutError``)."""
        while not self.ready:
            data = self.sock.recv(READ_CHUNK)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.ready.extend(self.frames.feed(data))
        return decode_frame(self.ready.popleft())

    def closed_by_server(self) -> bool:
        """True if the server closed the connection (after any frames still unread)."""
        try:
            while True:
                self.reply()
        except ConnectionError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()
