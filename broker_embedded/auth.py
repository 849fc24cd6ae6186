"""Access-key/secret authentication, RocketMQ ACL style.

A client proves it knows the secret without sending it: the first request on a connection
is AUTHENTICATE with the access key, a timestamp, a random nonce and an HMAC-SHA256 of
the three under the secret key. The server accepts it when the key matches, the signature
verifies and the timestamp is within ``MAX_SKEW_MS`` of its clock.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

from .errors import AuthenticationError

MAX_SKEW_MS = 5 * 60 * 1000


def sign(secret_key: str, access_key: str, timestamp_ms: int, nonce: str) -> str:
    """HMAC-SHA256 (hex) of ``access_key:timestamp_ms:nonce`` under ``secret_key``."""
    message = f"{access_key}:{timestamp_ms}:{nonce}".encode()
    return hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()


def credentials(access_key: str, secret_key: str) -> dict[str, Any]:
    """The body of a fresh AUTHENTICATE request."""
    stamp, nonce = int(time.time() * 1000), secrets.token_hex(8)
    return {"access_key": access_key, "timestamp_ms": stamp, "nonce": nonce,
            "signature": sign(secret_key, access_key, stamp, nonce)}


@dataclass(frozen=True)
class Authenticator:
    """The server side: checks AUTHENTICATE bodies against one access key and secret."""

    access_key: str
    secret_key: str

    def verify(self, body: Any) -> None:
        """Return if ``body`` proves the secret; raise ``AuthenticationError`` if not."""
        try:
            access_key, timestamp_ms, nonce, signature = (
                str(body["access_key"]), int(body["timestamp_ms"]), str(body["nonce"]), str(body["signature"])
            )
        except (KeyError, TypeError, ValueError):
            raise AuthenticationError("malformed credentials") from None
        if abs(time.time() * 1000 - timestamp_ms) > MAX_SKEW_MS:
            raise AuthenticationError("credentials are stale (check the clocks)")
        expected = sign(self.secret_key, self.access_key, timestamp_ms, nonce)
        if not (hmac.compare_digest(access_key, self.access_key) and hmac.compare_digest(signature, expected)):
            raise AuthenticationError("access key or signature is wrong")
