"""Synthetic inputs with known anomalies of every kind, for tests and the benchmark.

``generate(n, each)`` makes ``n`` clean transactions plus ``each`` of every anomaly kind
(and of every store-mode case: relayed, relayed after the export, waiting, waiting too
long) and returns the five tables and the counts the job must find. Writers put them in
SQLite databases (through SQLAlchemy) or Parquet, next to the broker export files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import create_engine

from ..integrations.sqlalchemy.tables import (
    consumed_message,
    metadata,
    stored_message,
    transaction_log,
)

KINDS = ("rolled_back", "phantom", "lost", "half_pending", "parked", "duplicate_delivery",
         "duplicate_effect", "in_flight", "clock_skew", *("relayed", "relayed_after_export", "unrelayed",
                                                          "unrelayed_stale"))
#: The kinds whose messages went through store mode (``outbox_stored_message`` rows).
STORED_KINDS = ("relayed", "relayed_after_export", "unrelayed", "unrelayed_stale")
GROUP = "points"
#: How long the synthetic relays took after the local commit (an outage of half a minute).
RELAY_DELAY_MS = 30_000


@dataclass
class Synthetic:
    """The generated tables and what the job must count."""

    transaction_log: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    consumed: list[dict[str, Any]] = field(default_factory=list)
    stored: list[dict[str, Any]] = field(default_factory=list)
    expected: dict[str, int] = field(default_factory=dict)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _local_ms(kind: str, i: int, now_ms: int, grace_ms: int, max_unrelayed_ms: int) -> int:
    """When a transaction of ``kind`` committed locally: long settled, except the in-flight
    ones, and the unrelayed ones on either side of ``max_unrelayed_ms``."""
    if kind == "in_flight":
        return now_ms - 1000
    if kind == "unrelayed":
        return now_ms - max_unrelayed_ms // 2 - i % 7
    if kind == "unrelayed_stale":
        return now_ms - 2 * max_unrelayed_ms - i % 7
    return now_ms - 10 * grace_ms - (i % 3600) * 1000


def generate(n: int, each: int, now_ms: int, grace_ms: int = 60_000, topics: int = 3,
             max_unrelayed_ms: int = 3_600_000) -> Synthetic:
    """``n`` clean transactions and ``each`` of every kind in ``KINDS``. Store mode: a
    ``relayed`` transaction's message reached the broker ``RELAY_DELAY_MS`` after its local
    commit; a ``relayed_after_export`` one was relayed a second before ``now_ms`` and is not
    in the export yet; an ``unrelayed`` one waits (younger than ``max_unrelayed_ms``), an
    ``unrelayed_stale`` one has waited longer, with two messages."""
    data = Synthetic()

    def add(i: int, kind: str) -> None:
        tx = f"tx{i:09d}"
        mid = f"m{i:09d}"
        topic = f"topic{i % topics}"
        local_ms = _local_ms(kind, i, now_ms, grace_ms, max_unrelayed_ms)
        relayed_ms = {"relayed": local_ms + RELAY_DELAY_MS + i % 7, "relayed_after_export": now_ms - 1000}.get(kind)
        handed_ms = relayed_ms or local_ms
        commit_ms = handed_ms + 3 + i % 7 if kind != "clock_skew" else local_ms - 50
        consumed_ms = commit_ms + 5 + i % 11
        local_state: str | None = "COMMITTED"
        broker_state = "committed"
        copies, attempts, consumptions = 1, 1, 1
        if kind == "rolled_back":
            local_state, broker_state, attempts, consumptions = "ROLLED_BACK", "rolled_back", 0, 0
        elif kind == "phantom":
            local_state = None
        elif kind == "lost":
            attempts, consumptions = 0, 0
        elif kind in ("half_pending", "parked"):
            local_state, attempts, consumptions = None, 0, 0
            broker_state = "half" if kind == "half_pending" else "parked"
        elif kind == "duplicate_delivery":
            copies = 2
        elif kind == "duplicate_effect":
            consumptions = 2
        elif kind in ("in_flight", "relayed_after_export", "unrelayed", "unrelayed_stale"):
            attempts, consumptions = 0, 0
        if local_state:
            data.transaction_log.append({"transaction_id": tx, "producer_group": "shop", "state": local_state,
                                         "created_at": _ts(local_ms)})
        if kind in STORED_KINDS:
            data.stored.extend(
                {"message_id": f"{mid}-{k}", "transaction_id": tx, "producer_group": "shop", "topic": topic,
                 "message_group": None, "message": b"", "created_at": _ts(local_ms),
                 "relayed_at": None if relayed_ms is None else _ts(relayed_ms)}
                for k in range(2 if kind == "unrelayed_stale" else 1))
        if kind not in ("relayed_after_export", "unrelayed", "unrelayed_stale"):  # none in the broker's export
            data.messages.append({
                "message_id": mid, "transaction_id": tx, "producer_group": "shop", "topic": topic,
                "queue_id": i % 4, "keys": "", "tag": "", "state": broker_state, "born_ms": handed_ms - 2,
                "store_ms": handed_ms - 1, "commit_ms": commit_ms if broker_state == "committed" else None,
                "copies": copies,
            })
        if attempts:
            data.deliveries.append({"message_id": mid, "consumer_group": GROUP, "topic": topic,
                                    "delivery_attempts": attempts, "first_delivered_ms": consumed_ms - 1,
                                    "acked_ms": consumed_ms + 1, "dead_lettered": False, "transaction_id": tx})
        for c in range(consumptions):
            data.consumed.append({"consumer_group": GROUP, "message_id": mid if c == 0 else f"{mid}-again",
                                  "topic": topic, "transaction_id": tx, "consumed_at": _ts(consumed_ms + c)})

    index = 0
    for _ in range(n):
        add(index, "clean")
        index += 1
    for kind in KINDS:
        for _ in range(each):
            add(index, kind)
            index += 1
    data.expected = {
        "transactions": n + each * len(KINDS),
        "committed": n + each * (len(KINDS) - 4),  # all but rolled_back, phantom, half, parked
        "stored": each * len(STORED_KINDS),
        "stored_messages": each * (len(STORED_KINDS) + 1),  # the stale ones have two messages
        "stored_unrelayed": each * 2,
        "unrelayed_stale": each,
        "rolled_back": each,
        "phantom": each,
        "lost": each,
        "half_pending": each,
        "parked": each,
        "duplicate_delivery": each,
        "duplicate_effect": each,
        "clock_skew": each,
    }
    return data


def write_sqlite(data: Synthetic, producer_url: str, consumer_url: str) -> None:
    """The framework tables in two databases."""
    for url, tables in ((producer_url, ((transaction_log, data.transaction_log), (stored_message, data.stored))),
                        (consumer_url, ((consumed_message, data.consumed),))):
        engine = create_engine(url)
        metadata.create_all(engine)
        with engine.begin() as conn:
            for table, rows in tables:
                if rows:
                    conn.execute(table.insert(), rows)
        engine.dispose()


MESSAGES_SCHEMA = pa.schema([
    ("message_id", pa.string()), ("transaction_id", pa.string()), ("producer_group", pa.string()),
    ("topic", pa.string()), ("queue_id", pa.int32()), ("keys", pa.string()), ("tag", pa.string()),
    ("state", pa.string()), ("born_ms", pa.int64()), ("store_ms", pa.int64()), ("commit_ms", pa.int64()),
    ("copies", pa.int32()),
])
DELIVERIES_SCHEMA = pa.schema([
    ("message_id", pa.string()), ("consumer_group", pa.string()), ("topic", pa.string()),
    ("delivery_attempts", pa.int32()), ("first_delivered_ms", pa.int64()), ("acked_ms", pa.int64()),
    ("dead_lettered", pa.bool_()), ("transaction_id", pa.string()),
])


def write_export(data: Synthetic, export_dir: Path, fmt: str = "parquet",
                 with_delivery_transaction_ids: bool = True) -> None:
    """The broker export as the broker writes it: messages and deliveries, Parquet or JSON
    lines; without ``with_delivery_transaction_ids``, as exports before that column wrote it."""
    export_dir.mkdir(parents=True, exist_ok=True)
    deliveries_schema = DELIVERIES_SCHEMA
    if not with_delivery_transaction_ids:
        deliveries_schema = DELIVERIES_SCHEMA.remove(DELIVERIES_SCHEMA.get_field_index("transaction_id"))
    for name, rows, schema in (("messages", data.messages, MESSAGES_SCHEMA),
                               ("deliveries", data.deliveries, deliveries_schema)):
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(rows, schema), export_dir / f"{name}.parquet")
        elif fmt == "jsonl":
            with (export_dir / f"{name}.jsonl").open("w", encoding="utf-8") as out:
                out.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            raise ValueError(f"unknown export format {fmt!r} (parquet or jsonl)")


STORED_SCHEMA = pa.schema([
    ("transaction_id", pa.string()), ("topic", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")),
    ("relayed_at", pa.timestamp("us", tz="UTC")),
])


def write_parquet_tables(data: Synthetic, folder: Path) -> tuple[str, str]:
    """The framework tables as Parquet; returns ``parquet://`` URLs for the job (the stored
    messages beside the transaction_log, where the job looks for them)."""
    folder.mkdir(parents=True, exist_ok=True)
    producer, consumer = folder / "transaction_log.parquet", folder / "consumed_message.parquet"
    pq.write_table(pa.Table.from_pylist(data.transaction_log), producer)
    pq.write_table(pa.Table.from_pylist(data.consumed), consumer)
    stored = [{name: row[name] for name in STORED_SCHEMA.names} for row in data.stored]
    pq.write_table(pa.Table.from_pylist(stored, STORED_SCHEMA), folder / "stored_message.parquet")
    return f"parquet://{producer}", f"parquet://{consumer}"
