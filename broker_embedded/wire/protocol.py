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
construction. The server reads a frame's envelope first (``read_frame``) and decodes the
body as the typed request of its code (``broker_embedded.requests``); answers carrying
messages are cut to fit ``MAX_FRAME_BYTES`` (``message_budget``).
"""

from __future__ import annotations

import enum
import functools
import struct
import typing
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec

from ..api import MAX_FRAME_BYTES, BrokerAPI
from ..errors import BrokerError, MalformedFrameError, error_for_code
from ..message import EndTransactionResult, ReceivedMessage, SendResult

LENGTH = struct.Struct(">I")
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
    DELETE_SUBSCRIPTIONGROUP = 207
    INVOKE_BROKER_TO_RESET_OFFSET = 222
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
    ACK_MESSAGE_BATCH = 200151  # RocketMQ 5's BATCH_ACK_MESSAGE
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
    LIST_OPEN_TRANSACTIONS = 900019
    RELAY_COMMITTED = 900020
    RECALL_MESSAGE = 900021
    DEAD_LETTER_MESSAGE = 900022


#: Which ``BrokerAPI`` method each request code calls.
METHODS: dict[RequestCode, str] = {
    RequestCode.SEND_MESSAGE: "send",
    RequestCode.SEND_HALF_MESSAGE: "send_half",
    RequestCode.END_TRANSACTION: "end_transaction",
    RequestCode.RELAY_COMMITTED: "relay_committed",
    RequestCode.RECALL_MESSAGE: "recall",
    RequestCode.GET_TRANSACTION_STATE: "transaction_state",
    RequestCode.POP_MESSAGE: "receive",
    RequestCode.ACK_MESSAGE: "ack",
    RequestCode.ACK_MESSAGE_BATCH: "ack_many",
    RequestCode.CHANGE_INVISIBLE_DURATION: "change_invisible_duration",
    RequestCode.DEAD_LETTER_MESSAGE: "dead_letter",
    RequestCode.PULL_MESSAGE: "read",
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: "offset_for_timestamp",
    RequestCode.VIEW_MESSAGE_BY_ID: "query_by_id",
    RequestCode.QUERY_MESSAGE: "query_by_key",
    RequestCode.UPDATE_AND_CREATE_TOPIC: "create_topic",
    RequestCode.GET_ALL_TOPIC_CONFIG: "list_topics",
    RequestCode.GET_BROKER_RUNTIME_INFO: "stats",
    RequestCode.LIST_PARKED_TRANSACTIONS: "list_parked",
    RequestCode.LIST_OPEN_TRANSACTIONS: "open_transactions",
    RequestCode.RESOLVE_PARKED_TRANSACTION: "resolve_parked",
    RequestCode.RECHECK_PARKED_TRANSACTION: "recheck_parked",
    RequestCode.LIST_DLQ_MESSAGES: "list_dlq",
    RequestCode.RESEND_DLQ_MESSAGE: "resend_dlq",
    RequestCode.DELETE_SUBSCRIPTIONGROUP: "delete_group",
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: "reset_group",
}
CODES: dict[str, RequestCode] = {method: code for code, method in METHODS.items()}


#: The result type of each method a request code calls (clients convert answers to it).
RESULTS: dict[str, Any] = {
    method: typing.get_type_hints(getattr(BrokerAPI, method))["return"] for method in METHODS.values()
}

#: The most messages one frame carries: a request sends, or an answer returns, no more.
MAX_MESSAGES = 1024
#: Request ids are integers from 0 to 2**64 - 1 (the largest msgpack integer).
RequestId = Annotated[int, msgspec.Meta(ge=0)]
#: Replies carry error texts up to this many characters (they may quote the request).
MAX_ERROR_CHARS = 500
#: A message in a reply takes at most its stored size (``StoredRecord.size``) plus 1/32 of
#: it (a key of 32+ characters has a longer header on the wire than the space that
#: separates keys in the store) plus this: field names, numbers, a receipt handle.
MESSAGE_OVERHEAD_BYTES = 1024
#: The envelope and ``{"ok": [...]}`` around a reply's messages.
REPLY_HEAD_BYTES = 64


def message_budget(max_messages: int) -> int:
    """The stored bytes of messages a reply carrying up to ``max_messages`` can hold
    within ``MAX_FRAME_BYTES``: the ``max_bytes`` the server gives the broker."""
    return (MAX_FRAME_BYTES - REPLY_HEAD_BYTES - max_messages * MESSAGE_OVERHEAD_BYTES) * 32 // 33


class Frame(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A frame's envelope; its body stays encoded until its request code says what it is."""

    code: int
    request_id: RequestId
    kind: Kind
    body: msgspec.Raw


class FrameError(MalformedFrameError):
    """A frame whose envelope could not be read, with the ``request_code`` and
    ``request_id`` it starts with where they are readable (0 where not), for the reply."""

    def __init__(self, message: str, request_code: int, request_id: int) -> None:
        super().__init__(message)
        self.request_code = request_code
        self.request_id = request_id


#: What msgspec raises for bytes that do not decode to the type asked for (text that is
#: not UTF-8 is a UnicodeDecodeError, nesting past its limit a RecursionError).
UNDECODABLE = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
_frame_decoder = msgspec.msgpack.Decoder(Frame)
_code_decoder = msgspec.msgpack.Decoder(int)
_request_id_decoder = msgspec.msgpack.Decoder(RequestId)
#: Code and request id are small scalars: a msgpack int or float takes at most 9 bytes.
_MAX_SCALAR_BYTES = 9


def encode_frame(code: int, request_id: int, kind: Kind, body: Any) -> bytes:
    """One frame, length prefix included."""
    payload = _encoder.encode((code, request_id, int(kind), body))
    return LENGTH.pack(len(payload)) + payload


#: Results whose fields are only str, int, bool, None, enums and tuples of str: msgpack
#: encodes them, as they are, to the same bytes as their ``to_wire`` map, so a reply (every
#: send, half message and END) skips building that map.
_PLAIN_RESULTS: frozenset[type] = frozenset({SendResult, EndTransactionResult})


def encode_reply(code: int, request_id: int, result: Any) -> bytes:
    """The RESPONSE frame ``{"ok": result}``, byte for byte
    ``encode_frame(code, request_id, Kind.RESPONSE, {"ok": to_wire(result)})``."""
    body = result if _in_wire_form(result) else to_wire(result)
    return encode_frame(code, request_id, Kind.RESPONSE, {"ok": body})


def _in_wire_form(result: Any) -> bool:
    """Whether msgpack encodes ``result`` as it is to the bytes of its ``to_wire`` map: a
    plain result, or a list of acks' outcomes or of received messages whose bodies are
    bytes and properties dicts (a receive's, read from the store), which ``to_wire`` would
    only copy."""
    if result is None or type(result) in _PLAIN_RESULTS:
        return True
    return type(result) is list and all(
        item is _OK_NONE or (type(item) is ReceivedMessage and type(item.message.body) is bytes
                             and type(item.message.properties) is dict)
        for item in result)


class FrameBuffer:
    """Cuts a byte stream into frame payloads, however the bytes arrive. It holds only the
    bytes received, never room for a frame's declared length ahead of them."""

    def __init__(self) -> None:
        self._data = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held of the frame still arriving."""
        return len(self._data)

    @property
    def expected(self) -> int:
        """The declared size (length prefix included) of the frame still arriving; 0 until
        its length prefix is in."""
        if len(self._data) < LENGTH.size:
            return 0
        return LENGTH.size + int(LENGTH.unpack_from(self._data)[0])

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


def whole_frames(data: bytes, max_payload: int, max_count: int) -> list[bytes] | None:
    """The payloads of ``data`` if it holds nothing but whole frames, at most ``max_count``
    of them and of at most ``max_payload`` bytes each; None, as soon as that is clear, if it
    holds anything else (part of a frame, a bigger one, more frames): ``FrameBuffer`` then
    takes it as it comes."""
    payloads: list[bytes] = []
    position, size = 0, len(data)
    while position < size:
        if size - position < LENGTH.size or len(payloads) == max_count:
            return None
        (length,) = LENGTH.unpack_from(data, position)
        end = position + LENGTH.size + length
        if length > max_payload or end > size:
            return None
        payloads.append(data[position + LENGTH.size:end])
        position = end
    return payloads


def read_frame(payload: bytes) -> Frame:
    """The envelope of a frame payload; ``FrameError`` if it is not one. The body is only
    skipped over, which costs milliseconds for 8 MiB of anything and stops at msgspec's
    nesting limit (``RecursionError``)."""
    try:
        return _frame_decoder.decode(payload)
    except UNDECODABLE as exc:
        raise FrameError(f"undecodable frame: {exc}", *_readable_head(payload)) from None


def _readable_head(payload: bytes) -> tuple[int, int]:
    """``(code, request_id)`` read one by one from the start of a refused frame's array,
    each 0 unless it is there and valid."""
    header = payload[:1]
    if not header or not (0x90 <= header[0] <= 0x9F or header[0] in (0xDC, 0xDD)):
        return 0, 0
    code_start = {0xDC: 3, 0xDD: 5}.get(header[0], 1)  # after an array 16 or 32 header
    code_end = _scalar_end(payload, code_start)
    if code_end is None:
        return 0, 0
    id_end = _scalar_end(payload, code_end)
    code = _valid_or_zero(_code_decoder, payload[code_start:code_end])
    return code, 0 if id_end is None else _valid_or_zero(_request_id_decoder, payload[code_end:id_end])


def _valid_or_zero(decoder: msgspec.msgpack.Decoder[int], data: bytes) -> int:
    try:
        return decoder.decode(data)
    except UNDECODABLE:
        return 0


def _scalar_end(payload: bytes, start: int) -> int | None:
    """Where the msgpack scalar at ``start`` ends: the shortest prefix that decodes."""
    for end in range(start + 1, min(start + _MAX_SCALAR_BYTES, len(payload)) + 1):
        try:
            _decoder.decode(payload[start:end])
        except UNDECODABLE:
            continue
        return end
    return None


def decode_body(body: msgspec.Raw | bytes) -> Any:
    """A frame's body (``Frame.body``) decoded as it is; ``MalformedFrameError`` if it
    does not decode."""
    try:
        return _decoder.decode(body)
    except UNDECODABLE as exc:
        raise MalformedFrameError(f"undecodable frame body: {exc}") from None


@functools.cache
def answer_decoder(method: str) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of the answers to ``method``, straight to ``ok`` as its result type
    (``RESULTS``) or ``error``; each field ``msgspec.UNSET`` when absent (``Call.result``
    then reads the answer the general way). Built when first asked for, then kept."""
    answer = msgspec.defstruct("Answer", [("ok", RESULTS[method] | msgspec.UnsetType, msgspec.UNSET),
                                          ("error", tuple[str, str] | msgspec.UnsetType, msgspec.UNSET)])
    return msgspec.msgpack.Decoder(answer)


def convert_result(method: str, raw: Any) -> Any:
    """The typed result of ``method`` from a response body."""
    return msgspec.convert(raw, RESULTS[method])


def to_wire(value: Any) -> Any:
    """Plain msgpack-able data for a dataclass, enum or container (bytes stay binary)."""
    return msgspec.to_builtins(value, builtin_types=(bytes,))


def request_body(arguments: dict[str, Any]) -> dict[str, Any]:
    """A request body of keyword arguments; one left None takes the server's default (so
    a server that does not know an optional argument is only sent it when it is used).
    The values stay as they are: msgpack encodes a dataclass (a ``Message``) as the map
    ``to_wire`` would make of it, enums by value, and any body, a bytearray or memoryview
    too, as binary (``to_wire`` made those base64 text, which the server refuses)."""
    return {name: value for name, value in arguments.items() if value is not None}


def unwrap_response(body: Any) -> Any:
    """The ``ok`` value of a response body, or its typed error raised."""
    if not isinstance(body, dict):
        raise MalformedFrameError("a response body must be a map")
    if "error" in body:
        error_code, message = body["error"]
        raise error_for_code(str(error_code), str(message))
    return body.get("ok")


def error_to_wire(error: BrokerError) -> dict[str, Any]:
    """``{"error": [code, message]}``, the message cut to ``MAX_ERROR_CHARS``."""
    return {"error": [error.code, str(error)[:MAX_ERROR_CHARS]]}


_OK_NONE: dict[str, Any] = {"ok": None}


def outcome_to_wire(outcome: Any) -> dict[str, Any]:
    """One item of a batch answer: ``{"ok": result}`` or ``{"error": [code, message]}``."""
    if outcome is None:  # every ack's: no conversion to call, nor for its reply (``encode_reply``)
        return _OK_NONE
    if isinstance(outcome, BrokerError):
        return error_to_wire(outcome)
    return {"ok": to_wire(outcome)}


def outcome_from_wire(item: Any, result_type: Any) -> Any:
    """The result (converted to ``result_type``) or the typed error of a batch answer item."""
    if result_type is None and item == _OK_NONE:  # every ack's: nothing to convert
        return None
    try:
        return msgspec.convert(unwrap_response(item), result_type)
    except BrokerError as exc:
        return exc
