"""Messages: ``broker_embedded.Message`` plus JSON helpers."""

from __future__ import annotations

import json
from typing import Any

from broker_embedded import Message

from .errors import BodyNotSerializableError


def to_json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON, or ``BodyNotSerializableError``."""
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=_reject).encode()
    except (TypeError, ValueError) as exc:
        raise BodyNotSerializableError(f"message body is not JSON-serialisable: {exc}") from None


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def json_message(topic: str, value: Any, **fields: Any) -> Message:
    """A message whose body is ``value`` as JSON (``fields``: keys, tag, properties, ...)."""
    keys = fields.pop("keys", ())
    return Message(topic, to_json_bytes(value), keys=tuple(keys), **fields)


def message_json(message: Message) -> Any:
    """The JSON value of a message's body."""
    return json.loads(message.body)
