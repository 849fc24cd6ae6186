"""Typed requests: the body of each request code decoded straight into its own struct.

A request body is a map of keyword arguments. Every request code has a type: for a code
that calls a ``BrokerAPI`` method, a ``msgspec.Struct`` made from the method's signature
(its arguments, their type hints and defaults), so client and server agree by
construction; for the server's own requests, one declared here. Decoding a body into its
type checks, in one pass over the bytes, that every required argument is there, that no
unknown one is, that each has its type and that numbers are within ``BOUNDS``: a request
that does not fit is refused with ``MalformedFrameError`` (a number out of its bounds with
``InvalidMessageError``, as the in-process broker refuses it) before it reaches the broker
or joins a batch with other clients' requests. It also bounds the work of a frame: a value is
only as deep as its type, and a value of the wrong type fails where it starts, so 8 MiB of
nested or empty arrays cost microseconds.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Annotated, Any

import msgspec

from ..api import MAX_DURATION_S, BrokerAPI
from ..errors import InvalidMessageError, MalformedFrameError, UnknownRequestCodeError
from ..message import Message
from .protocol import MAX_MESSAGES, METHODS, UNDECODABLE, RequestCode

#: Bounds of arguments by name (a name means the same in every method): numbers, and the
#: length of a batch.
BOUNDS: dict[str, msgspec.Meta] = {
    "max_messages": msgspec.Meta(ge=1),
    "max_bytes": msgspec.Meta(ge=1),
    "wait_s": msgspec.Meta(ge=0, le=MAX_DURATION_S),
    "invisible_duration_s": msgspec.Meta(gt=0, le=MAX_DURATION_S),
    "receipt_handles": msgspec.Meta(max_length=MAX_MESSAGES),
    "messages": msgspec.Meta(max_length=MAX_MESSAGES),
}

#: How msgspec words a number outside its ``BOUNDS`` (a well-formed request, a bad value).
_OUT_OF_BOUNDS = re.compile(r"Expected `(int|float)` [<>]=? ")

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Request(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A decoded request body."""


class ProducerGroupRequest(Request, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """HEART_BEAT and UNREGISTER_CLIENT: check-backs of a producer group, on or off."""

    producer_group: NonEmpty


class SendBatchRequest(Request, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """SEND_BATCH_MESSAGE."""

    messages: Annotated[list[Message], msgspec.Meta(max_length=MAX_MESSAGES)]


def _bounded(name: str, hint: Any) -> Any:
    """``hint`` with the bound of argument ``name`` (on the non-None part of an optional)."""
    bound = BOUNDS.get(name)
    if bound is None:
        return hint
    if isinstance(hint, types.UnionType):  # X | None
        return Annotated[typing.get_args(hint)[0], bound] | None
    return Annotated[hint, bound]


def _method_request(method: str) -> type[Request]:
    """The struct of a ``BrokerAPI`` method's keyword arguments."""
    function = getattr(BrokerAPI, method)
    hints = typing.get_type_hints(function)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, parameter in list(inspect.signature(function).parameters.items())[1:]:  # after self
        hint = _bounded(name, hints[name])
        empty = parameter.default is inspect.Parameter.empty
        fields.append((name, hint) if empty else (name, hint, parameter.default))
    struct = msgspec.defstruct(f"{method}_request", fields, bases=(Request,), frozen=True,
                               forbid_unknown_fields=True, kw_only=True)
    return typing.cast(type[Request], struct)


#: The type each request code's body decodes to. AUTHENTICATE and EXPORT_MESSAGES bodies
#: stay maps of text (and numbers), checked field by field where they are handled.
REQUEST_TYPES: dict[int, Any] = {
    **{code: _method_request(method) for code, method in METHODS.items()},
    RequestCode.HEART_BEAT: ProducerGroupRequest,
    RequestCode.UNREGISTER_CLIENT: ProducerGroupRequest,
    RequestCode.SEND_BATCH_MESSAGE: SendBatchRequest,
    RequestCode.AUTHENTICATE: dict[str, str | int],
    RequestCode.EXPORT_MESSAGES: dict[str, str],
}
_DECODERS = {int(code): msgspec.msgpack.Decoder(kind) for code, kind in REQUEST_TYPES.items()}


def decode_request(code: int, body: bytes | msgspec.Raw) -> Any:
    """The typed request of ``code`` from its encoded body; ``UnknownRequestCodeError`` or
    ``MalformedFrameError``."""
    decoder = _DECODERS.get(code)
    if decoder is None:
        raise UnknownRequestCodeError(f"unknown request code {code}")
    try:
        return decoder.decode(body)
    except UNDECODABLE as exc:
        if isinstance(exc, msgspec.ValidationError) and _OUT_OF_BOUNDS.match(str(exc)):
            raise InvalidMessageError(f"{RequestCode(code).name}: {exc}") from None
        fields = getattr(REQUEST_TYPES[code], "__struct_fields__", None)
        takes = f" (it takes {', '.join(fields) or 'no arguments'})" if fields is not None else ""
        raise MalformedFrameError(f"{RequestCode(code).name}: {exc}{takes}") from None


def request_arguments(request: Request) -> dict[str, Any]:
    """The keyword arguments a request carries."""
    return msgspec.structs.asdict(request)
