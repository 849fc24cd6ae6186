"""The server's reply encoding: the short path for plain results writes the same bytes as
the general one, so the wire format does not change."""

from __future__ import annotations

import pytest

from broker_embedded.errors import UnknownReceiptError
from broker_embedded.message import (
    EndTransactionResult,
    Message,
    ReceivedMessage,
    SendResult,
    TransactionState,
)
from broker_embedded.wire.protocol import (
    Kind,
    RequestCode,
    encode_frame,
    encode_reply,
    outcome_to_wire,
    to_wire,
)

RECEIVED = ReceivedMessage(Message("orders", b"\x00body", ("k1", "k2"), "tag", {"a": "é"}, "m-1", 0, 2**41,
                                   "group", 1.5), "handle|x", 2, 3, 2**40, 1, 2, "tx-1")

RESULTS = [
    None,
    SendResult("m-1", "orders", 3, 2**40, 2**63 - 1),
    SendResult("m-2", "orders", 0, 0, 0, transaction_id="tx-é"),
    EndTransactionResult("tx-1", TransactionState.COMMITTED, True, ("m-1", "m-2")),
    EndTransactionResult("tx-2", TransactionState.ROLLED_BACK, False, ()),
    [{"topic": "orders", "queues": 4}],
    b"\x00binary",
    [RECEIVED, ReceivedMessage(Message("t", b"", message_id="m-2"), "h", 1, 0, 0, 0, 0)],
    [outcome_to_wire(None), outcome_to_wire(UnknownReceiptError("stale")), outcome_to_wire(None)],
    [ReceivedMessage(Message("t", bytearray(b"body")), "h", 1, 0, 0, 0, 0)],  # not as it is: to_wire makes it so
]


@pytest.mark.parametrize("result", RESULTS)
def test_a_reply_is_the_frame_of_its_wire_form(result: object) -> None:
    request_id = 2**64 - 1
    general = encode_frame(RequestCode.SEND_MESSAGE, request_id, Kind.RESPONSE, {"ok": to_wire(result)})
    assert encode_reply(RequestCode.SEND_MESSAGE, request_id, result) == general
