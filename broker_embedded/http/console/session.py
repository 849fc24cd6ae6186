"""Who may use the console: sign-in with the broker's keys, a signed session cookie,
CSRF tokens bound to the session, and a brake on guessing per client address.

The cookie is ``<expiry>.<nonce>.<signature>``, an HMAC-SHA256 under a key derived from the
broker's secret key; nothing is stored on the server, so sessions end when they expire
(or when the secret key changes). A form's CSRF token is an HMAC of the session's nonce;
the sign-in form, before there is a session, uses a nonce of its own cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from .wsgi import cookies

#: Signatures made here differ from any other HMAC under the same secret (the TCP handshake's).
_CONTEXT = b"halfmoon-console-session-v1"

#: The cookie that carries a console session (``/metrics`` accepts it too).
SESSION_COOKIE = "halfmoon_console"

#: Failed sign-ins allowed from one client address per ``FAILURE_WINDOW_S`` before its
#: wrong keys are answered 429 for the rest of it.
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
#: Client addresses whose failures are remembered; the least recently failed is forgotten first.
MAX_THROTTLED_CLIENTS = 4096


class SignInThrottle:
    """Failed sign-ins per client address, in a table of at most ``max_clients`` addresses
    (least recently failed forgotten first), so a flood from one address slows only that
    address and memory stays bounded whatever addresses a flood comes from."""

    def __init__(self, max_clients: int = MAX_THROTTLED_CLIENTS) -> None:
        if max_clients < 1:
            raise ValueError(f"max_clients must be at least 1, got {max_clients!r}")
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def throttled(self, client: str) -> bool:
        """True while ``client`` failed ``MAX_FAILURES`` times within ``FAILURE_WINDOW_S``."""
        with self._lock:
            failures = self._failures.get(client)
            return (failures is not None and len(failures) == MAX_FAILURES
                    and time.monotonic() - failures[0] <= FAILURE_WINDOW_S)

    def failed(self, client: str) -> None:
        """Count a failed sign-in from ``client``."""
        with self._lock:
            failures = self._failures.pop(client, None) or deque(maxlen=MAX_FAILURES)
            failures.append(time.monotonic())
            self._failures[client] = failures
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)


class Sessions:
    """Issues and checks the console's session cookies and CSRF tokens."""

    def __init__(self, access_key: str, secret_key: str, ttl_s: float) -> None:
        if not access_key or not secret_key:
            raise ValueError("the console needs both an access key and a secret key to allow actions")
        if ttl_s <= 0:
            raise ValueError(f"session_ttl_s must be positive, got {ttl_s!r}")
        self._access_key = access_key.encode()
        self._secret_key = secret_key.encode()
        self._key = hmac.new(self._secret_key, _CONTEXT, hashlib.sha256).digest()
        self.ttl_s = ttl_s
        self.throttle = SignInThrottle()

    def _sign(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    # -- signing in -----------------------------------------------------------------------
    def keys_match(self, access_key: str, secret_key: str) -> bool:
        """Whether the keys are the broker's, compared in constant time (both always)."""
        access_ok = hmac.compare_digest(access_key.encode(), self._access_key)
        secret_ok = hmac.compare_digest(secret_key.encode(), self._secret_key)
        return access_ok and secret_ok

    # -- sessions -------------------------------------------------------------------------
    def new_session(self) -> str:
        """A session cookie value good for ``ttl_s`` at least (its expiry is a whole second, rounded up)."""
        payload = f"{math.ceil(time.time() + self.ttl_s)}.{secrets.token_hex(16)}"
        return f"{payload}.{self._sign('session', payload)}"

    def session_id(self, cookie: str | None) -> str | None:
        """The session's nonce when ``cookie`` is a valid, unexpired session; else None."""
        if not cookie or cookie.count(".") != 2:
            return None
        expiry, nonce, signature = cookie.split(".")
        if not hmac.compare_digest(signature.encode(), self._sign("session", f"{expiry}.{nonce}").encode()):
            return None
        return nonce if expiry.isdigit() and int(expiry) > time.time() else None

    def signed_in(self, environ: dict[str, Any]) -> bool:
        """Whether the WSGI request ``environ`` carries a valid session cookie."""
        return self.session_id(cookies(environ.get("HTTP_COOKIE", "")).get(SESSION_COOKIE)) is not None

    # -- CSRF -----------------------------------------------------------------------------
    @staticmethod
    def new_nonce() -> str:
        """A nonce for the sign-in form's own cookie."""
        return secrets.token_hex(16)

    @staticmethod
    def is_nonce(value: str) -> bool:
        """Whether ``value`` looks like a nonce this class made (32 hex digits)."""
        return len(value) == 32 and all(c in "0123456789abcdef" for c in value)

    def csrf_token(self, nonce: str) -> str:
        """The token forms carry for the session (or sign-in form) with this nonce."""
        return self._sign("csrf", nonce)

    def csrf_ok(self, nonce: str | None, token: str) -> bool:
        return nonce is not None and hmac.compare_digest(token.encode(), self.csrf_token(nonce).encode())
