"""RocketMQ 5's ``MQv2-HMAC-SHA1`` request signature, checked with the broker's access key
and secret (the same pair as the native protocol's), before a call's request is read.

Every call carries ``x-mq-date-time`` and ``authorization: MQv2-HMAC-SHA1
Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the
date-time under the secret key>``. Only the date-time is signed: not the method, not the
request. The official clients (Python, Java, Node, Go) write their *local* time with a "Z"
suffix, so the date is checked against the broker's clock in every time zone the clients may
run in (by default every UTC offset in use): a signature is good within ``window_s`` of the
moment it was made, in its client's zone, and nowhere else (``19700101T000000Z`` never is).
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ...errors import AuthenticationError
from ...wire.auth import RateLimitedLog

log = logging.getLogger(__name__)

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
#: How far a signed date may be from the broker's clock (in the client's zone), either way.
DEFAULT_WINDOW_S = 300.0
#: Every UTC offset in use (minutes; tz database): whole hours from -12:00 to +14:00 and
#: the half and three-quarter hours of Newfoundland, Marquesas, India, Iran, Afghanistan,
#: Nepal, Myanmar, Eucla, central Australia, Lord Howe and Chatham (daylight time included).
UTC_OFFSETS_MIN: tuple[int, ...] = tuple(sorted(
    {hours * 60 for hours in range(-12, 15)}
    | {-570, -210, -150, 210, 270, 330, 345, 390, 525, 570, 630, 765, 825}))
_OFFSET = re.compile(r"([+-])(\d{1,2})(?::?(\d{2}))?")


def sign(secret_key: str, date_time: str) -> str:
    """The signature of ``date_time`` under ``secret_key`` (hex HMAC-SHA1, as the clients make it)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def parse_utc_offsets(value: str) -> tuple[int, ...]:
    """The offsets (minutes) of ``--grpc-client-utc-offsets +08:00,-05:00,+00:00``
    (``ValueError`` if malformed or beyond -12:00..+14:00)."""
    offsets = []
    for text in value.split(","):
        match = _OFFSET.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"a UTC offset is written +HH:MM or -HH:MM, not {text.strip()!r}")
        sign_, hours, minutes = match.groups()
        offset = (1 if sign_ == "+" else -1) * (int(hours) * 60 + int(minutes or 0))
        if not -12 * 60 <= offset <= 14 * 60:
            raise ValueError(f"UTC offset {text.strip()} is beyond -12:00..+14:00")
        offsets.append(offset)
    return tuple(sorted(set(offsets)))


def _fields(authorization: str) -> dict[str, str]:
    """``Credential``, ``SignedHeaders`` and ``Signature`` of an ``authorization`` value."""
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthenticationError(f"the authorization is not {ALGORITHM}")
    fields = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if equals:
            fields[name] = value
    return fields


def _seconds(date_time: str) -> int:
    """``date_time`` (``yyyyMMddTHHmmssZ``, read as if UTC) in seconds since the epoch."""
    try:
        return calendar.timegm(time.strptime(date_time, DATE_FORMAT))
    except ValueError:
        raise AuthenticationError(f"{DATE_HEADER} {date_time[:32]!r} is not yyyyMMddTHHmmssZ") from None


@dataclass(frozen=True)
class SignatureVerifier:
    """Checks the signature of each call against one access key and secret, and its date
    against the clock: within ``window_s`` of now in one of ``utc_offsets`` (minutes)."""

    access_key: str
    secret_key: str
    window_s: float = DEFAULT_WINDOW_S
    utc_offsets: Sequence[int] = UTC_OFFSETS_MIN

    def verify(self, metadata: Mapping[str, Any], now: float | None = None) -> None:
        """Return if the call's metadata is signed with the secret at a time that is now in
        one of the accepted zones; ``AuthenticationError`` if not."""
        authorization, date_time = metadata.get("authorization"), metadata.get(DATE_HEADER)
        if not isinstance(authorization, str) or not isinstance(date_time, str) or not authorization or not date_time:
            raise AuthenticationError(f"the call is not signed (authorization and {DATE_HEADER} are needed)")
        fields = _fields(authorization)
        credential, signature = fields.get("Credential", ""), fields.get("Signature", "")
        if DATE_HEADER not in fields.get("SignedHeaders", "").split(";"):
            raise AuthenticationError(f"the signature does not cover {DATE_HEADER}")
        access_key = credential.split("/")[0]
        if not (hmac.compare_digest(access_key.encode(), self.access_key.encode())
                and hmac.compare_digest(signature.lower().encode(), sign(self.secret_key, date_time).encode())):
            raise AuthenticationError("access key or signature is wrong")
        skew = _seconds(date_time) - (time.time() if now is None else now)
        if not any(abs(skew - offset * 60) <= self.window_s for offset in self.utc_offsets):
            raise AuthenticationError(
                f"{DATE_HEADER} {date_time} is not within {self.window_s:g}s of now in any accepted time zone "
                "(an old signature, or a client clock that is wrong)")


class SignatureFirst(grpc.aio.ServerInterceptor):
    """Checks each call's signature from its headers, before its request is read: a call
    that fails is answered UNAUTHENTICATED at once (one rate-limited log line, whatever
    the flood), its request never decoded."""

    def __init__(self, verifier: SignatureVerifier) -> None:
        self.verifier = verifier
        self.refusals = RateLimitedLog(log)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        try:
            self.verifier.verify(dict(handler_call_details.invocation_metadata or ()))  # type: ignore[attr-defined]
        except AuthenticationError as exc:
            self.refusals.warning("gRPC call %s refused: %s", handler_call_details.method, exc)  # type: ignore[attr-defined]
            return _refusal(str(exc))
        return await continuation(handler_call_details)


def _refusal(reason: str) -> grpc.RpcMethodHandler:
    """A handler that answers UNAUTHENTICATED without reading the request (a streaming one
    reads nothing, whatever the method's kind)."""
    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    return grpc.stream_stream_rpc_method_handler(refuse)
