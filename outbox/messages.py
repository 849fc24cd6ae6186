"""Messages: ``broker_embedded.Message`` plus JSON helpers.

Bodies are compact UTF-8 JSON written with a ``json.JSONEncoder`` subclass:
``OutboxJSONEncoder`` by default (``Decimal`` and ``UUID`` as strings, dates and times in
ISO 8601), or any other, such as Django's ``DjangoJSONEncoder``. A value the encoder
cannot write raises ``BodyNotSerializableError``, and so do NaN and the infinities,
which are not JSON.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

from broker_embedded import Message

from .errors import BodyNotSerializableError


class OutboxJSONEncoder(json.JSONEncoder):
    """JSON plus the ordinary values of business code: ``Decimal`` and ``UUID`` as strings,
    ``datetime``, ``date`` and ``time`` in ISO 8601. Anything else is refused."""

    def default(self, o: Any) -> Any:
        if isinstance(o, decimal.Decimal | uuid.UUID):
            return str(o)
        if isinstance(o, datetime.date | datetime.time):  # datetime is a date
            return o.isoformat()
        return super().default(o)


def to_json_bytes(value: Any, encoder: type[json.JSONEncoder] | None = None) -> bytes:
    """Compact UTF-8 JSON written with ``encoder`` (``OutboxJSONEncoder`` unless given), or
    ``BodyNotSerializableError``."""
    try:
        text = json.dumps(value, cls=encoder or OutboxJSONEncoder, separators=(",", ":"), sort_keys=True,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BodyNotSerializableError(f"message body is not JSON-serialisable: {exc}") from None
    return text.encode()


def json_message(topic: str, value: Any, encoder: type[json.JSONEncoder] | None = None, **fields: Any) -> Message:
    """A message whose body is ``value`` as JSON (``fields``: keys, tag, properties, ...)."""
    keys = fields.pop("keys", ())
    return Message(topic, to_json_bytes(value, encoder), keys=tuple(keys), **fields)


def message_json(message: Message) -> Any:
    """The JSON value of a message's body."""
    return json.loads(message.body)
