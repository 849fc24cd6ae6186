"""RocketMQ 5's ``MQv2-HMAC-SHA1`` request signature, checked with the broker's access key
and secret (the same pair as the native protocol's).

Every call carries ``x-mq-date-time`` and ``authorization: MQv2-HMAC-SHA1
Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the
date-time under the secret key>``. The date-time is not compared with the server's clock:
the clients write local time with a "Z" suffix, so it cannot be.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import AuthenticationError

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"


def sign(secret_key: str, date_time: str) -> str:
    """The signature of ``date_time`` under ``secret_key`` (hex HMAC-SHA1, as the clients make it)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


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


@dataclass(frozen=True)
class SignatureVerifier:
    """Checks the signature of each call against one access key and secret."""

    access_key: str
    secret_key: str

    def verify(self, metadata: Mapping[str, str]) -> None:
        """Return if the call's metadata is signed with the secret; ``AuthenticationError`` if not."""
        authorization, date_time = metadata.get("authorization"), metadata.get(DATE_HEADER)
        if not authorization or not date_time:
            raise AuthenticationError(f"the call is not signed (authorization and {DATE_HEADER} are needed)")
        fields = _fields(authorization)
        credential, signature = fields.get("Credential", ""), fields.get("Signature", "")
        if DATE_HEADER not in fields.get("SignedHeaders", "").split(";"):
            raise AuthenticationError(f"the signature does not cover {DATE_HEADER}")
        access_key = credential.split("/")[0]
        if not (hmac.compare_digest(access_key.encode(), self.access_key.encode())
                and hmac.compare_digest(signature.lower().encode(), sign(self.secret_key, date_time).encode())):
            raise AuthenticationError("access key or signature is wrong")
