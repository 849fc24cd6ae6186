"""Op records: everything that happens to a transaction after its half messages.

An op record sits in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` with a msgpack body
``{"tx", "op", "n", "ts", "g", "h", "m", "r"}``: the transaction id, what happened
(commit | rollback | check | park | recheck), the check count, when, and for the
operations that write further records (commit, park) the producer group, the half
messages' commit log offsets and their message ids, so that recovery can redo those
records from the op alone; ``r`` marks the commit a relay wrote for a transaction the
broker never held open. Commit and rollback ops carry the transaction id as their
``KEYS``: the index finds a resolution on disk after the transaction has left memory.
"""

from __future__ import annotations

import msgspec

from ...message import Resolution, TransactionState
from ...store.record import PROPERTY_KEYS, PROPERTY_TAG, StoredRecord
from ...topics import OP_HALF_TOPIC

OP_COMMIT = "commit"
OP_ROLLBACK = "rollback"
OP_CHECK = "check"
OP_PARK = "park"
OP_RECHECK = "recheck"

FINAL_STATES = {OP_COMMIT: TransactionState.COMMITTED, OP_ROLLBACK: TransactionState.ROLLED_BACK}
RESOLUTION_OPS = {Resolution.COMMIT: OP_COMMIT, Resolution.ROLLBACK: OP_ROLLBACK}


class Op(msgspec.Struct, omit_defaults=True):
    """One op record's body (stored under the short names given to ``msgspec.field``)."""

    transaction_id: str = msgspec.field(name="tx")
    kind: str = msgspec.field(name="op")
    check_times: int = msgspec.field(default=0, name="n")
    timestamp_ms: int = msgspec.field(default=0, name="ts")
    producer_group: str = msgspec.field(default="", name="g")
    half_offsets: list[int] = msgspec.field(default_factory=list, name="h")
    message_ids: list[str] = msgspec.field(default_factory=list, name="m")
    #: The first commit of a transaction this broker never held open: a relay's
    #: (``relay_committed``), counted as a committed transaction.
    relayed: bool = msgspec.field(default=False, name="r")


encode_op = msgspec.msgpack.Encoder().encode
decode_op = msgspec.msgpack.Decoder(Op).decode


def op_record(op: Op) -> StoredRecord:
    """The record that stores ``op`` (a resolution is indexed by its transaction id)."""
    props = {PROPERTY_TAG: "d"}
    if op.kind in FINAL_STATES:
        props[PROPERTY_KEYS] = op.transaction_id
    return StoredRecord(OP_HALF_TOPIC, 0, encode_op(op), props)
