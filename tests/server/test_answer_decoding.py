"""The client's reading of answers: decoded straight to the method's result type, or, for
an answer that decoder does not take, the general way, with the same result or error."""

from __future__ import annotations

import msgspec
import pytest

from broker_embedded.errors import MalformedFrameError, UnknownReceiptError
from broker_embedded.message import Message, ReceivedMessage
from broker_embedded.wire.protocol import (
    Kind,
    RequestCode,
    convert_result,
    encode_frame,
    read_frame,
    to_wire,
)
from broker_embedded.wire.session import ClientSession

SESSION: ClientSession[object] = ClientSession("tcp://127.0.0.1:1", 1.0, 1.0, None, None)
RECEIVED = [ReceivedMessage(Message("orders", b"\x00body", ("k",), "tag", {"a": "b"}, "m-1", 0, None, "g", 1.5),
                            "handle", 2, 3, 4, 5, 6, "tx-1")]


def answer(body: object) -> msgspec.Raw:
    """The body of a RESPONSE frame carrying ``body``, as the client reads it off the wire."""
    return read_frame(encode_frame(RequestCode.PULL_MESSAGE, 7, Kind.RESPONSE, body)[4:]).body


def test_an_answer_decodes_to_what_the_general_way_converts_it_to() -> None:
    call = SESSION.receive("g", "orders")
    assert call.result(answer({"ok": to_wire(RECEIVED)})) == RECEIVED
    assert convert_result("receive", to_wire(RECEIVED)) == RECEIVED
    assert SESSION.ack("g", "handle").result(answer({"ok": None})) is None


def test_an_error_answer_raises_its_typed_error() -> None:
    with pytest.raises(UnknownReceiptError, match="stale"):
        SESSION.ack("g", "handle").result(answer({"error": [UnknownReceiptError.code, "stale"]}))


@pytest.mark.parametrize("body", [{}, {"ok": None}, {"ok": [{"message": 1}]}], ids=["no ok", "None", "bad shape"])
def test_an_answer_of_another_shape_fails_as_the_general_way_does(body: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        SESSION.receive("g", "orders").result(answer(body))


def test_an_answer_that_is_not_a_map_is_a_malformed_frame() -> None:
    with pytest.raises(MalformedFrameError, match="must be a map"):
        SESSION.receive("g", "orders").result(answer([1, 2]))
