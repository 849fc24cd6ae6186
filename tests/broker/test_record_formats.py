"""The broker's own stored records keep their bytes: commit log records, op records and
consumer progress events are read back by every later version, so their Python field names
may change but what they encode to (short msgpack keys) may not. The literals were encoded by
the code before the fields got descriptive names (the legacy commit log record: before records
carried their own commit log offset)."""

from __future__ import annotations

import pytest

from broker_embedded.broker.consumption import (
    Event,
    Held,
    Snapshot,
    _SavedProgress,
    decode_events,
    decode_snapshot,
    encode_events,
    encode_snapshot,
)
from broker_embedded.broker.transactions.ops import Op, decode_op, encode_op
from broker_embedded.store import codec as record_codec
from broker_embedded.store.record import StoredRecord

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


# A delivery event since receipts are kept (its receipt and wall times under r, v, x).
DELIVERED = Event(kind="d", group="shop", topic="orders", stored_topic="%RETRY%shop", queue_id=3, queue_offset=42,
                  attempt=2, message_id="m1", timestamp_ms=1_700_000_000_000, receipt="00ff00ff00ff00ff",
                  visible_at_ms=1_700_000_030_000, expires_at_ms=1_700_000_030_000)
DELIVERED_BYTES = (b"\x91\x8c\xa1e\xa1d\xa1g\xa4shop\xa1s\xa6orders\xa1t\xab%RETRY%shop\xa1q\x03\xa1o*\xa1n\x02"
                   b"\xa1m\xa2m1\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xa1r\xb000ff00ff00ff00ff"
                   b"\xa1v\xcf\x00\x00\x01\x8b\xcf\xe5\xdd0\xa1x\xcf\x00\x00\x01\x8b\xcf\xe5\xdd0")
# The consumer snapshot: one queue's progress, before receipts were kept (4 fields) and since (5).
PROGRESS = _SavedProgress(("shop", "orders", "orders", 3), 40, [42], {41: 2})
SNAPSHOT_BEFORE_RECEIPTS_BYTES = b"\x82\xa4upto\x07\xa8progress\x91\x94\x94\xa4shop\xa6orders\xa6orders\x03(\x91*\x81)\x02"
HELD = Held("00ff00ff00ff00ff", 1_700_000_000_000, 1_700_000_030_000, 1_700_000_030_000)
SNAPSHOT_BYTES = (b"\x82\xa4upto\x07\xa8progress\x91\x95\x94\xa4shop\xa6orders\xa6orders\x03(\x91*\x81)\x02\x81)"
                  b"\x94\xb000ff00ff00ff00ff\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xcf\x00\x00\x01\x8b\xcf\xe5\xdd0"
                  b"\xcf\x00\x00\x01\x8b\xcf\xe5\xdd0")


def test_op_records_encode_to_the_bytes_older_versions_wrote_and_read() -> None:
    assert encode_op(COMMIT_OP) == COMMIT_OP_BYTES
    assert encode_op(CHECK_OP) == CHECK_OP_BYTES  # defaults stay omitted
    assert decode_op(COMMIT_OP_BYTES) == COMMIT_OP
    assert decode_op(CHECK_OP_BYTES) == CHECK_OP


def test_progress_events_encode_to_the_bytes_older_versions_wrote_and_read() -> None:
    assert encode_events([EVENT]) == EVENTS_BYTES
    assert decode_events(EVENTS_BYTES) == [EVENT]
    assert encode_events([DELIVERED]) == DELIVERED_BYTES
    assert decode_events(DELIVERED_BYTES) == [DELIVERED]


def test_a_consumer_snapshot_from_before_receipts_were_kept_still_loads() -> None:
    assert decode_snapshot(SNAPSHOT_BEFORE_RECEIPTS_BYTES) == Snapshot(7, [PROGRESS])
    with_receipts = Snapshot(7, [_SavedProgress(("shop", "orders", "orders", 3), 40, [42], {41: 2}, {41: HELD})])
    assert encode_snapshot(with_receipts) == SNAPSHOT_BYTES
    assert decode_snapshot(SNAPSHOT_BYTES) == with_receipts


# A deleted group's events: per queue its floor there, and its DLQ's end (no subscribed topic).
DELETED = [Event(kind="f", group="shop", topic="orders", stored_topic="orders", queue_id=3, queue_offset=40,
                 attempt=0, message_id="", timestamp_ms=1_700_000_000_000),
           Event(kind="f", group="shop", topic="", stored_topic="%DLQ%shop", queue_id=0, queue_offset=5,
                 attempt=0, message_id="", timestamp_ms=1_700_000_000_000)]
DELETED_BYTES = (b"\x92\x89\xa1e\xa1f\xa1g\xa4shop\xa1s\xa6orders\xa1t\xa6orders\xa1q\x03\xa1o(\xa1n\x00\xa1m\xa0"
                 b"\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\x89\xa1e\xa1f\xa1g\xa4shop\xa1s\xa0\xa1t\xa9%DLQ%shop"
                 b"\xa1q\x00\xa1o\x05\xa1n\x00\xa1m\xa0\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00")
# A snapshot since groups can be deleted, with what a deleted one left.
SNAPSHOT_WITH_DELETED_BYTES = (b"\x84\xa4upto\x07\xa8progress\x90\xa9resume_at\x91\x92\x94\xa4shop\xa6orders"
                               b"\xa6orders\x03(\xaadlq_floors\x81\xa4shop\x05")


# A reset group's event: its new floor in one queue.
RESET = Event(kind="r", group="shop", topic="orders", stored_topic="orders", queue_id=3, queue_offset=40,
              attempt=0, message_id="", timestamp_ms=1_700_000_000_000)
RESET_BYTES = (b"\x91\x89\xa1e\xa1r\xa1g\xa4shop\xa1s\xa6orders\xa1t\xa6orders\xa1q\x03\xa1o(\xa1n\x00\xa1m\xa0"
               b"\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5h\x00")


def test_a_deleted_or_reset_groups_events_and_snapshot_keep_their_bytes() -> None:
    assert encode_events(DELETED) == DELETED_BYTES
    assert decode_events(DELETED_BYTES) == DELETED
    assert encode_events([RESET]) == RESET_BYTES
    assert decode_events(RESET_BYTES) == [RESET]
    with_deleted = Snapshot(7, [], resume_at=[(("shop", "orders", "orders", 3), 40)], dlq_floors={"shop": 5})
    assert encode_snapshot(with_deleted) == SNAPSHOT_WITH_DELETED_BYTES
    assert decode_snapshot(SNAPSHOT_WITH_DELETED_BYTES) == with_deleted


# The store's commit log record, in its two formats: data directories written before a record
# carried its own commit log offset are read by every later version.
RECORD_FIELDS = ("orders", 3, 42, 1, 1_700_000_000_000, 1_700_000_000_001, {"UNIQ_KEY": "m1"}, b"hello")
LEGACY_RECORD_BYTES = (b"\x00\x00\x00N\xda\xa3 \xa7<\xcc\xbb6\x00\x00\x00\x03\x00\x00\x00\x01\x00\x00\x00\x00"
                       b"\x00\x00\x00*\x00\x00\x01\x8b\xcf\xe5h\x00\x00\x00\x01\x8b\xcf\xe5h\x01\x00\x06orders"
                       b"\x00\x00\x00\r\x81\xa8UNIQ_KEY\xa2m1\x00\x00\x00\x05hello")
RECORD_AT_4096_BYTES = (b"\x00\x00\x00V\xda\xa3 \xa8\xda\xeb\xcc\x14\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00"
                        b"\x03\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00*\x00\x00\x01\x8b\xcf\xe5h\x00\x00\x00"
                        b"\x01\x8b\xcf\xe5h\x01\x00\x06orders\x00\x00\x00\r\x81\xa8UNIQ_KEY\xa2m1\x00\x00\x00\x05hello")


def _fields(record: StoredRecord) -> tuple[object, ...]:
    return (record.topic, record.queue_id, record.queue_offset, record.flags, record.born_timestamp_ms,
            record.store_timestamp_ms, record.properties, record.body)


def test_a_commit_log_record_encodes_to_the_bytes_this_version_writes_and_reads_both_formats() -> None:
    assert record_codec.seal(record_codec.encode(*RECORD_FIELDS), 4096) == RECORD_AT_4096_BYTES  # type: ignore[arg-type]
    for data, size in ((RECORD_AT_4096_BYTES, 86), (LEGACY_RECORD_BYTES, 78)):
        decoded = record_codec.decode(b"\0" * 8 + data, 8, 4096)
        assert _fields(decoded) == RECORD_FIELDS and (decoded.commit_log_offset, decoded.size) == (4096, size)
        head = record_codec.decode_head(lambda at, length, data=data: data[at:at + length], 4096)
        assert head == ("orders", {"UNIQ_KEY": "m1"}, 3, 42, size)


def test_a_record_read_where_it_was_not_written_is_no_record() -> None:
    with pytest.raises(record_codec.RecordError, match="misplaced"):
        record_codec.decode(RECORD_AT_4096_BYTES, 0, 8192)
    with pytest.raises(record_codec.RecordError, match="misplaced"):
        record_codec.decode_head(lambda at, length: RECORD_AT_4096_BYTES[at:at + length], 8192)
    # a legacy record does not say where it was written: it is read wherever it is
    assert record_codec.decode(LEGACY_RECORD_BYTES, 0, 8192).commit_log_offset == 8192


def test_a_blank_filler_is_one_where_it_was_written_and_a_legacy_one_anywhere() -> None:
    blank, legacy = b"\x00\x00\x00@\xcb\xd41\x94\xaa\x17\x98\xdf" + bytes(52), b"\x00\x00\x00@\xcb\xd41\x94" + bytes(56)
    assert record_codec.encode_blank(64, 4096) == blank
    assert record_codec.blank_length(b"\0" * 8 + blank, 8, 4096) == 64
    assert record_codec.blank_length(blank, 0, 8192) == 0  # a misdirected write's copy
    assert record_codec.blank_length(legacy, 0, 8192) == 64
