"""Access-key/secret authentication by challenge and response (RocketMQ ACL-style keys).

A client proves it knows the secret without sending it, and the proof is good on one
connection only. It first sends AUTHENTICATE without a signature; the server answers with
a fresh random challenge that it keeps on that connection. The client then sends
AUTHENTICATE with the access key and an HMAC-SHA256 of the access key and the challenge
under the secret key. The server checks it against the challenge it issued (each challenge
is good for one attempt), so a captured AUTHENTICATE frame is refused on any other
connection, where the challenge differs. No clocks are involved.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthenticationError

#: The body of an AUTHENTICATE request that asks for a challenge.
CHALLENGE_REQUEST: dict[str, Any] = {}
#: Sets these signatures apart from any other HMAC made with the same secret
#: (the clock-based signatures of older versions included).
_CONTEXT = "halfmoon-auth-challenge-v1"


def new_challenge() -> str:
    """A random challenge for one connection (128 bits, hex)."""
    return secrets.token_hex(16)


def sign(secret_key: str, access_key: str, challenge: str) -> str:
    """HMAC-SHA256 (hex) of the access key and the server's challenge under ``secret_key``."""
    message = f"{_CONTEXT}:{access_key}:{challenge}".encode()
    return hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()


def is_challenge_request(body: Any) -> bool:
    """True for an AUTHENTICATE body that asks for a challenge (it carries no signature)."""
    return not (isinstance(body, dict) and "signature" in body)


def credentials(access_key: str, secret_key: str, challenge_reply: Any) -> dict[str, Any]:
    """The body of the second AUTHENTICATE, answering the server's reply to the first."""
    challenge = challenge_reply.get("challenge") if isinstance(challenge_reply, dict) else None
    if not isinstance(challenge, str) or not challenge:
        raise AuthenticationError("the server sent no authentication challenge")
    return {"access_key": access_key, "signature": sign(secret_key, access_key, challenge)}


@dataclass(frozen=True)
class Authenticator:
    """The server side: checks AUTHENTICATE bodies against one access key and secret."""

    access_key: str
    secret_key: str

    def verify(self, body: Any, challenge: str | None) -> None:
        """Return if ``body`` signs ``challenge`` (the one this connection was given) with
        the secret; raise ``AuthenticationError`` if not."""
        if challenge is None:
            raise AuthenticationError(
                "no challenge was issued on this connection: send AUTHENTICATE without a signature "
                "first (clients without the challenge handshake must be upgraded)"
            )
        access_key, signature = body.get("access_key"), body.get("signature")
        if not isinstance(access_key, str) or not isinstance(signature, str):
            raise AuthenticationError("malformed credentials")
        expected = sign(self.secret_key, self.access_key, challenge)
        if not (hmac.compare_digest(access_key.encode(), self.access_key.encode())
                and hmac.compare_digest(signature.encode(), expected.encode())):
            raise AuthenticationError("access key or signature is wrong")


@dataclass
class RateLimitedLog:
    """Log lines about what unauthenticated or malformed clients do, at most one per
    ``interval_s`` (each saying how many were left out since the last), so a flood of them
    never floods the log."""

    logger: logging.Logger
    interval_s: float = 10.0
    _next_at: float = 0.0
    _left_out: int = field(default=0)

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next_at:
            self._left_out += 1
            return
        if self._left_out:
            message += f" (and {self._left_out} more like it in the last {self.interval_s:g}s)"
        self.logger.warning(message, *args)
        self._next_at, self._left_out = now + self.interval_s, 0
