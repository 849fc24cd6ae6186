"""The broker's own stored records keep their bytes: op records and consumer progress
events are read back by every later version, so their Python field names may change but
what they encode to (short msgpack keys) may not. The literals were encoded by the code
before the fields got descriptive names."""

from __future__ import annotations

from broker_embedded.broker.consumption import Event, decode_events, encode_events
from broker_embedded.broker.transactions.ops import Op, decode_op, encode_op

COMMIT_OP = Op(transaction_id="tx-1", kind="commit", check_times=2, timestamp_ms=1_700_000_000_000,
               producer_group="shop", half_offsets=[10, 20], message_ids=["m1", "m2"])
COMMIT_OP_BYTES = (b"\x87\xa2tx\xa4tx-1\xa2op\xa6commit\xa1n\x02\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00"
                   b"\xa1g\xa4shop\xa1h\x92\n\x14\xa1m\x92\xa2m1\xa2m2")
CHECK_OP = Op(transaction_id="tx-1", kind="check", check_times=1, timestamp_ms=1_700_000_000_000)
CHECK_OP_BYTES = b"\x84\xa2tx\xa4tx-1\xa2op\xa5check\xa1n\x01\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00"
EVENT = Event(kind="d", group="shop", topic="orders", stored_topic="%RETRY%shop", queue_id=3, queue_offset=42,
              attempt=2, message_id="m1", timestamp_ms=1_700_000_000_000)
EVENTS_BYTES = (b"\x91\x89\xa1e\xa1d\xa1g\xa4shop\xa1s\xa6orders\xa1t\xab%RETRY%shop\xa1q\x03\xa1o*\xa1n\x02"
                b"\xa1m\xa2m1\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00")


def test_op_records_encode_to_the_bytes_older_versions_wrote_and_read() -> None:
    assert encode_op(COMMIT_OP) == COMMIT_OP_BYTES
    assert encode_op(CHECK_OP) == CHECK_OP_BYTES  # defaults stay omitted
    assert decode_op(COMMIT_OP_BYTES) == COMMIT_OP
    assert decode_op(CHECK_OP_BYTES) == CHECK_OP


def test_progress_events_encode_to_the_bytes_older_versions_wrote_and_read() -> None:
    assert encode_events([EVENT]) == EVENTS_BYTES
    assert decode_events(EVENTS_BYTES) == [EVENT]
