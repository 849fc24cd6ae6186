"""``relay_committed``: the messages of a local transaction that committed in the producer's
database (the outbox's store mode), handed over without half message or END. The broker
recognises a transaction and message id it holds, whatever it holds them as (half messages
of a pending transaction, a commit by END or check-back, an earlier relay), and never keeps
a second copy."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.broker.writes import HalfCall, RelayCall
from broker_embedded.errors import (
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    ReservedTopicError,
    TransactionConflictError,
    UnknownTransactionError,
)
from broker_embedded.store.record import StoredRecord
from broker_embedded.topics import HALF_TOPIC

from .conftest import FAST, eventually
from .crashcut import (
    CutImages,
    describe,
    exactly_once,
    finish_after,
    keep_before,
    report,
    run_cuts,
    visible,
)
from .test_poison import append_raw, half_props

PG = "pg"


def _tx() -> str:
    return uuid.uuid4().hex


def _copies(broker: EmbeddedBroker, topic: str) -> Counter[str]:
    """How often each message id is stored in ``topic`` (every queue)."""
    return visible(broker, topic)


def _received(broker: EmbeddedBroker, topic: str, count: int) -> list[bytes]:
    """Bodies a fresh consumer group receives (and acks) within a few seconds."""
    group, bodies = f"g-{uuid.uuid4().hex[:8]}", []
    deadline = time.monotonic() + 5
    while len(bodies) < count and time.monotonic() < deadline:
        for received in broker.receive(group, topic, max_messages=32, wait_s=0.5):
            broker.ack(group, received.receipt_handle)
            bodies.append(received.message.body)
    return bodies + [m.message.body for m in broker.receive(group, topic, wait_s=0.2)]


def test_an_unknown_transaction_is_committed_once_and_a_repeat_stores_nothing(broker_factory) -> None:
    broker = broker_factory()
    tx = _tx()
    messages = [Message("orders", b"a", keys=("order-1",), tag="paid"), Message("orders", b"b")]
    results = broker.relay_committed(messages, producer_group=PG, transaction_id=tx)
    assert [r.message_id for r in results] == [m.message_id for m in messages]
    assert all(r.transaction_id == tx and r.topic == "orders" and r.queue_offset >= 0 for r in results)
    assert broker.transaction_state(tx) is TransactionState.COMMITTED
    again = broker.end_transaction(tx, Resolution.COMMIT, producer_group=PG)
    assert (again.applied, set(again.message_ids)) == (False, {m.message_id for m in messages})
    with pytest.raises(TransactionConflictError):
        broker.end_transaction(tx, Resolution.ROLLBACK, producer_group=PG)

    assert broker.relay_committed(messages, producer_group=PG, transaction_id=tx) == results
    assert sorted(_received(broker, "orders", 2)) == [b"a", b"b"]
    assert _copies(broker, "orders") == Counter(m.message_id for m in messages)
    # indexed and tagged like any committed message
    (by_key,) = broker.query_by_key("orders", "order-1")
    assert (by_key.message.message_id, by_key.message.tag, by_key.transaction_id) == (messages[0].message_id, "paid", tx)
    tagged = broker.receive("tagged", "orders", filter_expression="paid", wait_s=1)
    assert [r.message.body for r in tagged] == [b"a"]
    # a half message for it now is refused, as for any ended transaction
    with pytest.raises(TransactionConflictError):
        broker.send_half(Message("orders", b"late"), producer_group=PG, transaction_id=tx)


def test_a_pending_transaction_holding_some_messages_is_committed_with_the_rest(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=600)
    tx = _tx()
    first, second = Message("orders", b"first"), Message("orders", b"second")
    held = broker.send_half(first, producer_group=PG, transaction_id=tx)
    results = broker.relay_committed([first, second], producer_group=PG, transaction_id=tx)
    assert [r.message_id for r in results] == [first.message_id, second.message_id]
    assert results[0].commit_log_offset > held.commit_log_offset  # the committed copy, not the half
    assert broker.transaction_state(tx) is TransactionState.COMMITTED
    assert broker.open_transactions() == []
    assert sorted(_received(broker, "orders", 2)) == [b"first", b"second"]
    assert broker.relay_committed([first, second], producer_group=PG, transaction_id=tx) == results
    assert _copies(broker, "orders") == Counter([first.message_id, second.message_id])
    ended = broker.end_transaction(tx, Resolution.COMMIT, producer_group=PG)
    assert (ended.applied, set(ended.message_ids)) == (False, {first.message_id, second.message_id})


def test_a_transaction_committed_by_end_gets_only_what_it_lacks(broker_factory) -> None:
    broker = broker_factory()
    tx = _tx()
    first, second = Message("orders", b"first"), Message("orders", b"second")
    broker.send_half(first, producer_group=PG, transaction_id=tx)
    broker.end_transaction(tx, Resolution.COMMIT, producer_group=PG)
    (only,) = broker.relay_committed([first], producer_group=PG, transaction_id=tx)
    assert (only.message_id, only.queue_offset) == (first.message_id, 0)
    assert _copies(broker, "orders") == Counter([first.message_id])

    both = broker.relay_committed([first, second], producer_group=PG, transaction_id=tx)
    assert both[0] == only and both[1].message_id == second.message_id
    assert broker.relay_committed([second, first], producer_group=PG, transaction_id=tx) == [both[1], both[0]]
    assert _copies(broker, "orders") == Counter([first.message_id, second.message_id])
    ended = broker.end_transaction(tx, Resolution.COMMIT, producer_group=PG)
    assert set(ended.message_ids) == {first.message_id, second.message_id}


def test_a_rolled_back_transaction_is_refused_and_nothing_is_stored(broker_factory) -> None:
    broker = broker_factory()
    tx = _tx()
    broker.send_half(Message("orders", b"half"), producer_group=PG, transaction_id=tx)
    broker.end_transaction(tx, Resolution.ROLLBACK, producer_group=PG)
    end = broker.store.commitlog.write_offset
    with pytest.raises(TransactionConflictError):
        broker.relay_committed([Message("orders", b"relayed")], producer_group=PG, transaction_id=tx)
    assert broker.store.commitlog.write_offset == end
    assert broker.transaction_state(tx) is TransactionState.ROLLED_BACK


def test_another_producer_groups_transaction_is_refused(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=600)
    pending, committed = _tx(), _tx()
    broker.send_half(Message("orders", b"p"), producer_group=PG, transaction_id=pending)
    broker.relay_committed([Message("orders", b"c")], producer_group=PG, transaction_id=committed)
    for tx in (pending, committed):
        with pytest.raises(TransactionConflictError):
            broker.relay_committed([Message("orders", b"x")], producer_group="other", transaction_id=tx)
    assert broker.transaction_state(pending) is TransactionState.PENDING
    assert _copies(broker, "orders").total() == 1


def test_the_same_relay_twice_in_one_batch_stores_one_copy(broker_factory) -> None:
    broker = broker_factory()
    tx = _tx()
    call = RelayCall([Message("orders", b"once")], PG, tx)
    outcomes = broker.produce([call, call])
    assert any(isinstance(o, list) for o in outcomes)
    assert all(isinstance(o, list | TransactionConflictError) for o in outcomes)
    assert _copies(broker, "orders").total() == 1
    assert broker.relay_committed(call.messages, producer_group=PG, transaction_id=tx) == next(
        o for o in outcomes if isinstance(o, list))


@pytest.mark.parametrize("relay_first", [True, False])
def test_a_half_message_in_the_same_batch_as_the_relay_makes_no_second_copy(broker_factory, relay_first) -> None:
    broker = broker_factory(transaction_timeout_s=600)
    tx, message = _tx(), Message("orders", b"both ways")
    relay, half = RelayCall([message], PG, tx), HalfCall(message, PG, tx)
    outcomes = broker.produce([relay, half] if relay_first else [half, relay])
    assert any(isinstance(o, TransactionConflictError) for o in outcomes)  # the later one waits its turn
    broker.relay_committed([message], producer_group=PG, transaction_id=tx)
    assert broker.transaction_state(tx) is TransactionState.COMMITTED and broker.open_transactions() == []
    assert _copies(broker, "orders") == Counter([message.message_id])


def test_a_message_group_keeps_the_relayed_order(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("fifo", 4)
    tx = _tx()
    messages = [Message("fifo", f"{n}".encode(), message_group="order-7") for n in range(6)]
    held = Message("fifo", b"held", message_group="order-7")
    broker.send_half(held, producer_group=PG, transaction_id=tx)
    results = broker.relay_committed([*messages[:3], held, *messages[3:]], producer_group=PG, transaction_id=tx)
    assert len({r.queue_id for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(7))
    group, bodies = "fifo-readers", []
    while len(bodies) < 7:
        (received,) = broker.receive(group, "fifo", max_messages=8, wait_s=2)  # one at a time in a group
        bodies.append(received.message.body)
        broker.ack(group, received.receipt_handle)
    assert bodies == [b"0", b"1", b"2", b"held", b"3", b"4", b"5"]


def test_a_delay_counts_from_the_relay(broker_factory) -> None:
    broker = broker_factory()
    tx = _tx()
    relayed_at = time.monotonic()
    (result,) = broker.relay_committed([Message("orders", b"later", delay_level=1)], producer_group=PG,
                                       transaction_id=tx)
    assert result.queue_offset == -1  # held in the delay topic for now
    early = broker.receive("g", "orders", wait_s=0)
    assert early == [] or time.monotonic() - relayed_at >= 1.0
    (due,) = broker.receive("g", "orders", wait_s=5)
    assert due.message.body == b"later" and time.monotonic() - relayed_at >= 0.9
    assert broker.relay_committed([Message("orders", b"later", delay_level=1, message_id=result.message_id)],
                                  producer_group=PG, transaction_id=tx) == [result]
    assert _copies(broker, "orders").total() == 1


def test_recognition_survives_a_restart(broker_factory, tmp_path) -> None:
    broker = broker_factory()
    tx = _tx()
    messages = [Message("orders", b"a"), Message("orders", b"b")]
    results = broker.relay_committed(messages, producer_group=PG, transaction_id=tx)
    broker.close()
    broker = broker_factory()
    assert broker.relay_committed(messages, producer_group=PG, transaction_id=tx) == results
    assert broker.transaction_state(tx) is TransactionState.COMMITTED
    assert _copies(broker, "orders") == Counter(m.message_id for m in messages)


def test_a_half_message_that_cannot_be_committed_is_replaced_by_the_relayed_one(broker_factory) -> None:
    closed = broker_factory()
    closed.close()
    append_raw(closed.data_dir, [StoredRecord(HALF_TOPIC, 0, b"unusable", half_props(REAL_QID="zz"))])
    broker = broker_factory()
    eventually(lambda: broker.list_parked())  # parked at once: it cannot be committed
    relayed = Message("orders", b"relayed", message_id="m-poison")
    (result,) = broker.relay_committed([relayed], producer_group="pg", transaction_id="tx-poison")
    assert result.message_id == "m-poison"
    assert broker.transaction_state("tx-poison") is TransactionState.COMMITTED and broker.list_parked() == []
    assert _received(broker, "orders", 1) == [b"relayed"]


BAD = {
    "no messages": (InvalidMessageError, lambda: []),
    "bad topic": (InvalidTopicError, lambda: [Message("orders", b"ok"), Message("no spaces", b"x")]),
    "reserved topic": (ReservedTopicError, lambda: [Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x")]),
    "oversize body": (MessageTooLargeError, lambda: [Message("orders", b"x" * (4 * 1024 * 1024 + 1))]),
    "one id twice": (InvalidMessageError, lambda: [Message("orders", b"x", message_id="same"),
                                                   Message("orders", b"y", message_id="same")]),
    "not a message": (InvalidMessageError, lambda: [b"raw"]),
}


@pytest.mark.parametrize("bad", BAD)
def test_bad_input_is_refused_with_a_typed_error_and_stores_nothing(broker_factory, bad: str) -> None:
    broker = broker_factory()
    error, messages = BAD[bad]
    end = broker.store.commitlog.write_offset
    tx = _tx()
    with pytest.raises(error):
        broker.relay_committed(messages(), producer_group=PG, transaction_id=tx)
    assert broker.store.commitlog.write_offset == end
    with pytest.raises(InvalidMessageError):
        broker.relay_committed([Message("orders", b"x")], producer_group=PG, transaction_id="has space")
    with pytest.raises(InvalidTopicError):
        broker.relay_committed([Message("orders", b"x")], producer_group="no spaces", transaction_id=tx)
    assert broker.store.commitlog.write_offset == end


def test_a_relay_cut_at_any_byte_is_completed_by_its_retry_exactly_once(tmp_path) -> None:
    """A crash anywhere in the relay's append (never acknowledged): the start finds the
    transaction unknown, or COMMITTED with each message at most once; the relay's retry
    then leaves every message readable exactly once."""
    data = tmp_path / "broker"
    quiet = replace(FAST, transaction_timeout_s=3600)
    messages = [Message("orders", os.urandom(100)) for _ in range(2)]
    ids = [m.message_id for m in messages]
    start = keep_before(EmbeddedBroker(data, quiet), tmp_path / "before")
    broker = EmbeddedBroker(data, quiet)
    broker.relay_committed(messages, producer_group=PG, transaction_id="tx-cut")
    cut = CutImages.capture(tmp_path / "before", data, start, finish_after(broker))

    def check(image: Path) -> str | None:
        with EmbeddedBroker(image, quiet) as opened:
            try:
                state: TransactionState | None = opened.transaction_state("tx-cut")
            except UnknownTransactionError:
                state = None
            seen = visible(opened, "orders")
            if state is None and seen or max(seen.values(), default=0) > 1:
                return f"{state} with {describe(seen, ids)} after the crash"
            opened.relay_committed(messages, producer_group=PG, transaction_id="tx-cut")
            seen = visible(opened, "orders")
            return None if exactly_once(seen, ids) else f"the retry left {describe(seen, ids)}"

    positions = cut.positions([*(bytes(m.body) for m in messages), *(i.encode() for i in ids)], 64)
    violations = run_cuts(cut, positions, tmp_path, check)
    assert not violations, report(violations, len(positions), "a relay")


def test_a_relayed_transaction_counts_once_as_committed(broker_factory) -> None:
    """The metrics' transactions_ended{commit}: a relay of a transaction never held open is one
    committed transaction; its repeats, a further message and a restart add none."""
    broker = broker_factory()
    before = broker.book.committed
    tx = _tx()
    first = Message("orders", b"a")
    broker.relay_committed([first], producer_group=PG, transaction_id=tx)
    broker.relay_committed([first], producer_group=PG, transaction_id=tx)
    broker.relay_committed([first, Message("orders", b"b")], producer_group=PG, transaction_id=tx)
    assert broker.book.committed == before + 1
    broker.close()
    broker = broker_factory()
    assert broker.book.committed == before + 1
