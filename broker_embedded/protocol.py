"""The native wire protocol: length-prefixed msgpack frames with RocketMQ's request codes.

A frame is a 4-byte big-endian length followed by a msgpack array
``[code, request_id, kind, body]``:

* ``kind`` REQUEST: ``body`` is a map of the method's keyword arguments;
* ``kind`` RESPONSE: ``body`` is ``{"ok": result}`` or ``{"error": [code, message]}``
  (a typed ``BrokerError`` code, see ``errors.error_for_code``);
* ``kind`` PUSH: the server calls a client (CHECK_TRANSACTION_STATE), no reply.

Requests are pipelined: a client may have many in flight on one connection and answers
come back as they finish, matched by ``request_id``. Argument and result types are taken
from :class:`broker_embedded.api.BrokerAPI`'s type hints, so both ends agree by
construction.
"""

from __future__ import annotations

import enum
import struct
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from .api import BrokerAPI
from .errors import BrokerError, MalformedFrameError, error_for_code

LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024
READ_CHUNK = 256 * 1024


class Kind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    PUSH = 2


class RequestCode(enum.IntEnum):
    """Request codes; the numbers of RocketMQ's ``RequestCode`` where one exists."""

    SEND_MESSAGE = 10
    SEND_BATCH_MESSAGE = 320
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    END_TRANSACTION = 37
    CHECK_TRANSACTION_STATE = 39
    POP_MESSAGE = 200050  # RocketMQ 5 receive
    ACK_MESSAGE = 200051
    CHANGE_INVISIBLE_DURATION = 200053
    # halfmoon's own
    SEND_HALF_MESSAGE = 900010
    GET_TRANSACTION_STATE = 900011
    LIST_PARKED_TRANSACTIONS = 900012
    RESOLVE_PARKED_TRANSACTION = 900013
    RECHECK_PARKED_TRANSACTION = 900014
    LIST_DLQ_MESSAGES = 900015
    RESEND_DLQ_MESSAGE = 900016
    AUTHENTICATE = 900017
    EXPORT_MESSAGES = 900018


#: Which ``BrokerAPI`` method each request code calls.
METHODS: dict[RequestCode, str] = {
    RequestCode.SEND_MESSAGE: "send",
    RequestCode.SEND_HALF_MESSAGE: "send_half",
    RequestCode.END_TRANSACTION: "end_transaction",
    RequestCode.GET_TRANSACTION_STATE: "transaction_state",
    RequestCode.POP_MESSAGE: "receive",
    RequestCode.ACK_MESSAGE: "ack",
    RequestCode.CHANGE_INVISIBLE_DURATION: "change_invisible_duration",
    RequestCode.PULL_MESSAGE: "read",
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: "offset_for_timestamp",
    RequestCode.VIEW_MESSAGE_BY_ID: "query_by_id",
    RequestCode.QUERY_MESSAGE: "query_by_key",
    RequestCode.UPDATE_AND_CREATE_TOPIC: "create_topic",
    RequestCode.GET_ALL_TOPIC_CONFIG: "list_topics",
    RequestCode.GET_BROKER_RUNTIME_INFO: "stats",
    RequestCode.LIST_PARKED_TRANSACTIONS: "list_parked",
    RequestCode.RESOLVE_PARKED_TRANSACTION: "resolve_parked",
    RequestCode.RECHECK_PARKED_TRANSACTION: "recheck_parked",
    RequestCode.LIST_DLQ_MESSAGES: "list_dlq",
    RequestCode.RESEND_DLQ_MESSAGE: "resend_dlq",
}
CODES: dict[str, RequestCode] = {method: code for code, method in METHODS.items()}


@dataclass(frozen=True)
class Signature:
    """Argument and return types of one ``BrokerAPI`` method."""

    arguments: dict[str, Any]
    result: Any


SIGNATURES: dict[str, Signature] = {}
for _method in METHODS.values():
    _hints = typing.get_type_hints(getattr(BrokerAPI, _method))
    _result = _hints.pop("return")
    SIGNATURES[_method] = Signature(_hints, _result)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_frame(code: int, request_id: int, kind: Kind, body: Any) -> bytes:
    """One frame, length prefix included."""
    payload = _encoder.encode((code, request_id, int(kind), body))
    return LENGTH.pack(len(payload)) + payload


class FrameBuffer:
    """Cuts a byte stream into frame payloads, however the bytes arrive."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The payloads completed by ``data``, in order; a length over ``MAX_FRAME_BYTES``
        raises ``MalformedFrameError`` when reached (the stream cannot be trusted past it)."""
        self._data += data
        position = 0
        try:
            while len(self._data) - position >= LENGTH.size:
                (length,) = LENGTH.unpack_from(self._data, position)
                if length > MAX_FRAME_BYTES:
                    raise MalformedFrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
                end = position + LENGTH.size + length
                if len(self._data) < end:
                    return  # the rest of the frame is still on its way
                payload = bytes(self._data[position + LENGTH.size:end])
                position = end
                yield payload
        finally:
            del self._data[:position]


def decode_frame(payload: bytes) -> tuple[int, int, Kind, Any]:
    """``(code, request_id, kind, body)`` of a frame payload; ``MalformedFrameError`` if not."""
    try:
        code, request_id, kind, body = _decoder.decode(payload)
        return int(code), int(request_id), Kind(kind), body
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise MalformedFrameError(f"undecodable frame: {exc}") from None


def convert_arguments(method: str, raw: Any) -> dict[str, Any]:
    """Typed keyword arguments for ``method`` from a request body."""
    if not isinstance(raw, dict):
        raise MalformedFrameError(f"{method}: arguments must be a map")
    signature = SIGNATURES[method]
    unknown = set(raw) - set(signature.arguments)
    if unknown:
        raise MalformedFrameError(f"{method}: unknown arguments {sorted(unknown)}")
    try:
        return {name: msgspec.convert(value, signature.arguments[name]) for name, value in raw.items()}
    except msgspec.ValidationError as exc:
        raise MalformedFrameError(f"{method}: {exc}") from None


def convert_result(method: str, raw: Any) -> Any:
    """The typed result of ``method`` from a response body."""
    return msgspec.convert(raw, SIGNATURES[method].result)


def to_wire(value: Any) -> Any:
    """Plain msgpack-able data for a dataclass, enum or container (bytes stay binary)."""
    return msgspec.to_builtins(value, builtin_types=(bytes,))


def unwrap_response(body: Any) -> Any:
    """The ``ok`` value of a response body, or its typed error raised."""
    if not isinstance(body, dict):
        raise MalformedFrameError("a response body must be a map")
    if "error" in body:
        error_code, message = body["error"]
        raise error_for_code(str(error_code), str(message))
    return body.get("ok")


def outcome_to_wire(outcome: Any) -> dict[str, Any]:
    """One item of a batch answer: ``{"ok": result}`` or ``{"error": [code, message]}``."""
    if isinstance(outcome, BrokerError):
        return {"error": [outcome.code, str(outcome)]}
    return {"ok": to_wire(outcome)}


def outcome_from_wire(item: Any, result_type: Any) -> Any:
    """The result (converted to ``result_type``) or the typed error of a batch answer item."""
    try:
        return msgspec.convert(unwrap_response(item), result_type)
    except BrokerError as exc:
        return exc
