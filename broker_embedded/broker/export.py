"""Export what the broker knows of every message, for the reconciliation job.

Two tables (Parquet or JSON lines) in ``out_dir``:

* ``messages``: message_id, transaction_id, producer_group, topic, queue_id, keys, tag,
  state (normal | half | committed | rolled_back | parked), born_ms, store_ms (the half
  message's for transactions), commit_ms (when COMMIT was applied), copies (how many times
  the id was written to its real topic; more than one is a duplicate source). A message a
  relay handed over (``relay_committed``: no half message) is committed, with its copy's
  store time as store_ms and commit_ms;
* ``deliveries``: one row per message and consumer group that received it:
  message_id, consumer_group, topic, delivery_attempts, first_delivered_ms, acked_ms,
  dead_lettered, transaction_id (of a transactional message, so that reconciliation
  needs no join to place a delivery).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..message import TransactionState
from ..store.record import PROPERTY_KEYS, PROPERTY_MESSAGE_ID, PROPERTY_TAG, StoredRecord
from ..topics import CONSUMER_STATE_TOPIC, HALF_TOPIC, MAX_QUEUES, OP_HALF_TOPIC, SCHEDULE_TOPIC
from . import codec
from .consumption import EVENT_ACKED, EVENT_DELIVERED, events_of
from .facade import EmbeddedBroker
from .transactions.book import read_half
from .transactions.ops import FINAL_STATES, Op, decode_op

_STATES = {
    TransactionState.PENDING: "half",
    TransactionState.COMMITTED: "committed",
    TransactionState.ROLLED_BACK: "rolled_back",
    TransactionState.PARKED: "parked",
}


def _row(record: StoredRecord, state: str, transaction_id: str | None, producer_group: str | None,
         commit_ms: int | None) -> dict[str, Any]:
    props = record.properties
    real_queue = codec.tolerant(record, lambda p: codec.int_property(p, codec.REAL_QUEUE_ID, 0, MAX_QUEUES - 1), None)
    return {
        "message_id": props.get(PROPERTY_MESSAGE_ID, ""),
        "transaction_id": transaction_id,
        "producer_group": producer_group,
        "topic": props.get(codec.REAL_TOPIC, record.topic),
        "queue_id": record.queue_id if real_queue is None else real_queue,
        "keys": props.get(PROPERTY_KEYS, ""),
        "tag": props.get(PROPERTY_TAG, ""),
        "state": state,
        "born_ms": record.born_timestamp_ms,
        "store_ms": record.store_timestamp_ms,
        "commit_ms": commit_ms,
        "copies": 0,
    }


def _decode_op(record: StoredRecord) -> Op | None:
    try:
        return decode_op(record.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def transaction_states(broker: EmbeddedBroker) -> dict[str, tuple[TransactionState, int | None]]:
    """Every transaction whose half messages are still stored, in the order they were
    begun: its state and, if committed, when. Reads the half and op topics (O(history)):
    for exports and audits, not for a request path."""
    resolved: dict[str, Op] = {}
    for record in broker.iter_queue(OP_HALF_TOPIC):
        op = _decode_op(record)
        if op is not None and op.kind in FINAL_STATES:
            resolved[op.transaction_id] = op
    open_states = {tx.transaction_id: tx.state for tx in broker.book}
    states: dict[str, tuple[TransactionState, int | None]] = {}
    for half in broker.iter_queue(HALF_TOPIC):
        transaction_id = read_half(half).transaction_id
        final = resolved.get(transaction_id)
        if final is not None:
            state = FINAL_STATES[final.kind]
            states[transaction_id] = (state, final.timestamp_ms if state is TransactionState.COMMITTED else None)
        else:
            states[transaction_id] = (open_states.get(transaction_id, TransactionState.PENDING), None)
    return states


def delivery_rows(broker: EmbeddedBroker) -> Iterator[dict[str, Any]]:
    """One row per message and consumer group that received it, from the groups' progress
    events in ``RMQ_SYS_CONSUMER_STATE`` (the broker keeps no per-message state in memory)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    broker.store.flush()  # progress events are written without waiting for their fsync
    for record in broker.iter_queue(CONSUMER_STATE_TOPIC):
        for event in events_of(record):
            row = rows.setdefault((event.group, event.message_id), {
                "message_id": event.message_id, "consumer_group": event.group, "topic": event.topic, "delivery_attempts": 0,
                "first_delivered_ms": 0, "acked_ms": None, "dead_lettered": False,
            })
            if event.kind == EVENT_DELIVERED:
                row["delivery_attempts"] = max(row["delivery_attempts"], event.attempt)
                row["first_delivered_ms"] = row["first_delivered_ms"] or event.timestamp_ms
            elif event.kind == EVENT_ACKED:
                row["acked_ms"] = row["acked_ms"] or event.timestamp_ms
            else:
                row["dead_lettered"] = True
    return iter(rows.values())


def collect(broker: EmbeddedBroker) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``messages`` and ``deliveries`` rows of a broker."""
    rows: dict[str, dict[str, Any]] = {}
    copies: Counter[str] = Counter()
    committed: dict[str, StoredRecord] = {}  # the first committed copy of each transactional message

    def seen(record: StoredRecord) -> str:
        message_id = record.properties.get(PROPERTY_MESSAGE_ID, "")
        if codec.TRANSACTION_ID in record.properties:
            committed.setdefault(message_id, record)
        elif message_id not in rows:
            rows[message_id] = _row(record, "normal", None, None, None)
        return message_id

    for topic in broker.list_topics():
        for queue_id in range(topic.queues):
            for record in broker.iter_queue(topic.name, queue_id):
                copies[seen(record)] += 1
    for queue_id in range(broker.store.queues().get(SCHEDULE_TOPIC, 0)):
        for record in broker.iter_queue(SCHEDULE_TOPIC, queue_id):  # delayed, maybe not yet due
            seen(record)
    states = transaction_states(broker)
    for half in broker.iter_queue(HALF_TOPIC):
        transaction_id = read_half(half).transaction_id
        state, commit_ms = states[transaction_id]
        row = _row(half, _STATES[state], transaction_id, half.properties.get(codec.PRODUCER_GROUP), commit_ms)
        rows[row["message_id"]] = row
    for message_id, record in committed.items():  # relayed: committed without a half message
        if rows.get(message_id, {}).get("transaction_id") is None:  # none, or a plain send of the same id
            rows[message_id] = _row(record, "committed", record.properties[codec.TRANSACTION_ID],
                                    record.properties.get(codec.PRODUCER_GROUP), record.store_timestamp_ms)
    for message_id, row in rows.items():
        row["copies"] = copies.get(message_id, 0)
    deliveries = list(delivery_rows(broker))
    for delivery in deliveries:
        message = rows.get(delivery["message_id"])
        delivery["transaction_id"] = message["transaction_id"] if message else None
    return list(rows.values()), deliveries


def export_messages(broker: EmbeddedBroker, out_dir: Path | str,
                    fmt: Literal["parquet", "jsonl"] = "parquet") -> dict[str, int]:
    """Write ``messages`` and ``deliveries`` to ``out_dir``; returns the row counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    messages, deliveries = collect(broker)
    if fmt == "jsonl":
        for name, rows in (("messages", messages), ("deliveries", deliveries)):
            with (out / f"{name}.jsonl").open("w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
    elif fmt == "parquet":
        _write_parquet(out, messages, deliveries)
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    return {"messages": len(messages), "deliveries": len(deliveries)}


def _write_parquet(out: Path, messages: list[dict[str, Any]], deliveries: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    message_schema = pa.schema([
        ("message_id", pa.string()), ("transaction_id", pa.string()), ("producer_group", pa.string()),
        ("topic", pa.string()), ("queue_id", pa.int32()), ("keys", pa.string()), ("tag", pa.string()),
        ("state", pa.string()), ("born_ms", pa.int64()), ("store_ms", pa.int64()),
        ("commit_ms", pa.int64()), ("copies", pa.int32()),
    ])
    delivery_schema = pa.schema([
        ("message_id", pa.string()), ("consumer_group", pa.string()), ("topic", pa.string()),
        ("delivery_attempts", pa.int32()), ("first_delivered_ms", pa.int64()),
        ("acked_ms", pa.int64()), ("dead_lettered", pa.bool_()), ("transaction_id", pa.string()),
    ])
    pq.write_table(pa.Table.from_pylist(messages, schema=message_schema), out / "messages.parquet")
    pq.write_table(pa.Table.from_pylist(deliveries, schema=delivery_schema), out / "deliveries.parquet")
