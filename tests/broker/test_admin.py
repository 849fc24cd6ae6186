"""Check counts and parking across restarts, the producer callback checker, expired
receipts, replay and query reads, stats, and the export schema."""

from __future__ import annotations

import json
import time

import pytest

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.broker.export import export_messages
from broker_embedded.checkers import ProducerCallbackChecker
from broker_embedded.errors import InvalidTopicError, UnknownReceiptError, UnknownTransactionError
from broker_embedded.message import CheckRequest
from broker_embedded.store.config import StoreConfig
from broker_embedded.topics import CHECK_MAX_TOPIC

from .conftest import AnsweringChecker, eventually


def test_unknown_resolution_records_nothing_and_group_must_match(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=60)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    result = broker.end_transaction("t1", Resolution.UNKNOWN, producer_group="pg")
    assert not result.applied and result.state is TransactionState.PENDING
    with pytest.raises(UnknownTransactionError):
        broker.end_transaction("t1", Resolution.COMMIT, producer_group="someone-else")
    with pytest.raises(UnknownTransactionError):
        broker.transaction_state("never-sent")
    broker.close()
    broker = broker_factory(transaction_timeout_s=60)
    assert broker.transaction_state("t1") is TransactionState.PENDING
    assert broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg").applied


def test_check_counts_survive_restart(broker_factory) -> None:
    checker = AnsweringChecker(Resolution.UNKNOWN)
    broker = broker_factory(checker, check_max=5)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    eventually(lambda: len(checker.requests) >= 2)
    broker.close()
    durable = broker.book.by_id["t1"].check_times
    assert durable >= 2
    after = AnsweringChecker(Resolution.UNKNOWN)
    broker = broker_factory(after, check_max=5)
    eventually(lambda: broker.transaction_state("t1") is TransactionState.PARKED)
    # counting resumes where it stopped: 5 checks in all, not 5 more
    assert [r.check_times for r in after.requests] == list(range(durable + 1, 6))
    assert broker.list_parked()[0].check_times == 5


def test_parked_transaction_is_a_durable_record_and_never_checked(broker_factory) -> None:
    checker = AnsweringChecker(Resolution.UNKNOWN)
    broker = broker_factory(checker)
    broker.send_half(Message("orders", b"a", keys=("k1",)), producer_group="pg", transaction_id="t1")
    broker.send_half(Message("orders", b"b"), producer_group="pg", transaction_id="t1")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.PARKED)
    parked_copies = broker.read_all(CHECK_MAX_TOPIC)
    assert sorted(r.body for r in parked_copies) == [b"a", b"b"]
    assert {r.properties["TRANSACTION_CHECK_TIMES"] for r in parked_copies} == {"3"}
    broker.close()
    later = AnsweringChecker(Resolution.COMMIT)
    broker = broker_factory(later)
    [parked] = broker.list_parked()
    assert parked.transaction_id == "t1" and len(parked.message_ids) == 2
    time.sleep(1.0)  # several check intervals
    assert later.requests == [] and broker.stats().parked == 1
    with pytest.raises(UnknownTransactionError):
        broker.resolve_parked("not-parked", force=Resolution.COMMIT)
    assert broker.resolve_parked("t1", force=Resolution.ROLLBACK).applied
    assert broker.list_parked() == [] and broker.receive("g", "orders", wait_s=0.3) == []


def test_open_transactions_are_the_pending_and_parked_ones_of_a_group(broker_factory) -> None:
    broker = broker_factory(AnsweringChecker(Resolution.UNKNOWN), check_max=1)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="parked")
    eventually(lambda: broker.transaction_state("parked") is TransactionState.PARKED)
    broker.send_half(Message("orders", b"b", transaction_timeout_s=3600), producer_group="other",
                     transaction_id="pending")
    broker.send_half(Message("orders", b"c"), producer_group="pg", transaction_id="done")
    broker.end_transaction("done", Resolution.COMMIT, producer_group="pg")
    assert sorted(broker.open_transactions()) == ["parked", "pending"]
    assert broker.open_transactions("pg") == ["parked"] and broker.open_transactions("nobody") == []
    with pytest.raises(InvalidTopicError):
        broker.open_transactions("bad group!")
    broker.close()
    broker = broker_factory(AnsweringChecker(Resolution.UNKNOWN), check_max=1)  # rebuilt from the log
    assert sorted(broker.open_transactions()) == ["parked", "pending"]


def test_producer_callback_checker_round_robin_and_failing_callbacks() -> None:
    checker = ProducerCallbackChecker()
    request = CheckRequest("pg", "t1", Message("orders", b"a"), 1)
    assert not checker.request_check(request)  # no producer of the group: no route
    calls: list[str] = []

    def broken(req: CheckRequest) -> None:
        raise ConnectionError("gone")

    checker.register("pg", lambda req: calls.append("one"))
    checker.register("pg", lambda req: calls.append("two"))
    for _ in range(4):
        assert checker.request_check(request)
    assert sorted(calls) == ["one", "one", "two", "two"]
    lonely = ProducerCallbackChecker()
    lonely.register("pg", broken)
    assert not lonely.request_check(request)  # a raising callback is "no route"
    lonely.unregister("pg", broken)
    assert not lonely.request_check(request)


def test_a_receipt_expires_with_its_invisible_duration(broker_factory) -> None:
    broker = broker_factory(retry_backoff_s=(30.0,))
    broker.send(Message("orders", b"x"))
    received = broker.receive("g", "orders", invisible_duration_s=0.1)[0]
    time.sleep(0.3)
    with pytest.raises(UnknownReceiptError):
        broker.ack("g", received.receipt_handle)
    with pytest.raises(UnknownReceiptError):
        broker.change_invisible_duration("g", received.receipt_handle, 10)


def test_read_offsets_queries_and_stats(broker_factory) -> None:
    broker = broker_factory(default_queues=1)
    first = broker.send(Message("orders", b"a", keys=("order-1", "user-7"), tag="paid"))
    time.sleep(0.01)
    middle_ms = time.time_ns() // 1_000_000
    time.sleep(0.01)
    second = broker.send(Message("orders", b"b", keys=("order-2",), properties={"trace": "x"}))
    replay = broker.read("orders", 0, 0)
    assert [m.message.body for m in replay] == [b"a", b"b"]
    assert replay[1].message.properties == {"trace": "x"} and replay[0].message.tag == "paid"
    assert broker.offset_for_timestamp("orders", 0, middle_ms) == second.queue_offset == 1
    found = broker.query_by_id(first.message_id)
    assert found is not None and found.message.keys == ("order-1", "user-7")
    assert broker.query_by_id("missing") is None
    assert [m.message.body for m in broker.query_by_key("orders", "user-7")] == [b"a"]
    broker.send_half(Message("orders", b"h"), producer_group="pg", transaction_id="t")
    broker.receive("g", "orders", max_messages=1)
    stats = broker.stats()
    assert stats.pending_half == 1 and stats.topics[0].depth == (2,)
    assert stats.consumer_lag == {"g": {"orders": 2}}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_schema(broker_factory, tmp_path, fmt) -> None:
    broker = broker_factory(default_queues=1, transaction_timeout_s=60)
    plain = broker.send(Message("orders", b"n", keys=("a", "b"), tag="t"))
    delayed = broker.send(Message("orders", b"d", delay_level=18))
    broker.send_half(Message("orders", b"c"), producer_group="pg", transaction_id="tc")
    broker.send_half(Message("orders", b"r"), producer_group="pg", transaction_id="tr")
    pending = broker.send_half(Message("orders", b"h"), producer_group="pg", transaction_id="th")
    broker.end_transaction("tc", Resolution.COMMIT, producer_group="pg")
    broker.end_transaction("tr", Resolution.ROLLBACK, producer_group="pg")
    for received in broker.receive("g", "orders", max_messages=10):
        if received.message.message_id == plain.message_id:
            broker.ack("g", received.receipt_handle)
    relayed = broker.relay_committed([Message("orders", b"x"), Message("orders", b"y", delay_level=18)],
                                     producer_group="pg", transaction_id="tx")  # no half message: store mode
    broker.send(Message("orders", b"x", message_id=relayed[0].message_id))  # and sent again, plain
    counts = export_messages(broker, tmp_path / "out", fmt)
    assert counts == {"messages": 7, "deliveries": 2}
    if fmt == "jsonl":
        messages = [json.loads(line) for line in (tmp_path / "out/messages.jsonl").read_text().splitlines()]
        deliveries = [json.loads(line) for line in (tmp_path / "out/deliveries.jsonl").read_text().splitlines()]
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(tmp_path / "out/messages.parquet")
        assert str(table.schema.field("queue_id").type) == "int32"
        assert str(table.schema.field("copies").type) == "int32"
        assert str(table.schema.field("commit_ms").type) == "int64"
        messages = table.to_pylist()
        deliveries = pq.read_table(tmp_path / "out/deliveries.parquet").to_pylist()
    waiting = next(m for m in messages if m["message_id"] == delayed.message_id)
    assert waiting["state"] == "normal" and waiting["copies"] == 0 and waiting["topic"] == "orders"
    messages.remove(waiting)
    # relayed: committed without a half message, the delayed one still waiting for its time
    handed_over = {m["message_id"]: m for m in messages if m["transaction_id"] == "tx"}
    assert set(handed_over) == {r.message_id for r in relayed}
    assert all(m["state"] == "committed" and m["commit_ms"] is not None for m in handed_over.values())
    assert sorted(m["copies"] for m in handed_over.values()) == [0, 2]
    messages = [m for m in messages if m["transaction_id"] != "tx"]
    by_tx = {m["transaction_id"]: m for m in messages}
    assert by_tx[None]["state"] == "normal" and by_tx[None]["keys"] == "a b" and by_tx[None]["copies"] == 1
    assert by_tx["tc"]["state"] == "committed" and by_tx["tc"]["commit_ms"] >= by_tx["tc"]["store_ms"]
    assert by_tx["tc"]["copies"] == 1 and by_tx["tc"]["producer_group"] == "pg"
    assert by_tx["tr"]["state"] == "rolled_back" and by_tx["tr"]["copies"] == 0
    assert by_tx["th"]["state"] == "half" and by_tx["th"]["commit_ms"] is None
    assert by_tx["th"]["message_id"] == pending.message_id and by_tx["th"]["topic"] == "orders"
    rows = {d["message_id"]: d for d in deliveries}
    assert rows[plain.message_id]["acked_ms"] is not None
    assert rows[by_tx["tc"]["message_id"]]["acked_ms"] is None
    # deliveries name their transaction, so reconciliation needs no join to place them
    assert rows[by_tx["tc"]["message_id"]]["transaction_id"] == "tc"
    assert rows[plain.message_id]["transaction_id"] is None
    assert all(d["consumer_group"] == "g" and d["delivery_attempts"] == 1 and not d["dead_lettered"]
               for d in deliveries)


def test_retention_keeps_unresolved_half_messages_and_consumers_skip_deleted_ones(broker_factory) -> None:
    store = StoreConfig(segment_size=16 * 1024, checkpoint_interval_s=0.5)
    broker = broker_factory(store=store, default_queues=1, transaction_timeout_s=600)
    broker.send_half(Message("orders", b"half"), producer_group="pg", transaction_id="t")
    for n in range(40):
        broker.send(Message("orders", bytes([n]) * 1024))
    far_future = time.time_ns() // 1_000_000 + 365 * 86_400_000
    assert broker.apply_retention(far_future) == 0  # the half message's segment is guarded
    broker.end_transaction("t", Resolution.COMMIT, producer_group="pg")
    assert broker.apply_retention(far_future) > 0
    kept = broker.store.queue_min_offset("orders", 0)
    assert kept > 0
    got: list[bytes] = []
    while batch := broker.receive("g", "orders", max_messages=64, wait_s=0.5):
        for received in batch:
            got.append(received.message.body)
            broker.ack("g", received.receipt_handle)
    assert got[-1] == b"half" and len(got) == 41 - kept
    assert broker.stats().consumer_lag == {"g": {"orders": 0}}


@pytest.mark.parametrize("snapshot", ["older", "torn"])
def test_restart_from_an_older_or_torn_transaction_snapshot(broker_factory, snapshot) -> None:
    checker = AnsweringChecker(Resolution.UNKNOWN)
    broker = broker_factory(checker, check_max=2)
    broker.send_half(Message("orders", b"c", transaction_timeout_s=600), producer_group="pg",
                     transaction_id="committed")
    broker.send_half(Message("orders", b"p", transaction_timeout_s=0.1), producer_group="pg",
                     transaction_id="parked")
    broker.send_half(Message("orders", b"w", transaction_timeout_s=600), producer_group="pg",
                     transaction_id="waiting")
    broker.write_snapshots()
    path = broker.data_dir / "transactions.snapshot"
    older = path.read_bytes()
    broker.end_transaction("committed", Resolution.COMMIT, producer_group="pg")
    eventually(lambda: broker.transaction_state("parked") is TransactionState.PARKED)
    broker.close()
    path.write_bytes(older if snapshot == "older" else b"\x00torn")
    broker = broker_factory(AnsweringChecker(Resolution.UNKNOWN), check_max=2)
    assert broker.transaction_state("committed") is TransactionState.COMMITTED
    assert broker.transaction_state("parked") is TransactionState.PARKED
    assert broker.list_parked()[0].check_times == 2
    assert broker.transaction_state("waiting") is TransactionState.PENDING
    assert [r.message.body for r in broker.receive("g", "orders", max_messages=10, wait_s=1)] == [b"c"]
    broker.end_transaction("waiting", Resolution.COMMIT, producer_group="pg")
    assert [r.message.body for r in broker.receive("g", "orders", wait_s=2)] == [b"w"]
