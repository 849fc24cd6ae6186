"""Poison messages: a write is validated field by field before anything is stored, and no
stored record can stop a start.

The second half writes records the broker interprets on replay straight into the commit
log through the store API (bypassing validation, as an older version or a record damaged
behind a valid CRC would have left them), restarts, and checks that the start succeeds,
that an unusable transaction is parked for the operator, and that everything else still
works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.broker.transactions.ops import Op, encode_op
from broker_embedded.errors import (
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
)
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from broker_embedded.topics import CONSUMER_STATE_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, SCHEDULE_TOPIC

from .conftest import FAST, AnsweringChecker, eventually

BrokerFactory = Callable[..., EmbeddedBroker]
NOW_MS = time.time_ns() // 1_000_000


# -- validation ---------------------------------------------------------------------------
class _Unchecked(Message):
    """A Message whose construction checks nothing."""

    def __post_init__(self) -> None:
        pass


def _smuggled_body(body: object) -> Message:
    """A message whose body got past Message's own check (it refuses a str at construction)."""
    return _Unchecked("orders", body)  # type: ignore[arg-type]


BAD_MESSAGES = {
    "timeout NaN": (Message("orders", b"x", transaction_timeout_s=float("nan")), InvalidMessageError),
    "timeout inf": (Message("orders", b"x", transaction_timeout_s=float("inf")), InvalidMessageError),
    "timeout zero": (Message("orders", b"x", transaction_timeout_s=0.0), InvalidMessageError),
    "timeout over a day": (Message("orders", b"x", transaction_timeout_s=86_401.0), InvalidMessageError),
    "timeout a string": (Message("orders", b"x", transaction_timeout_s="5"), InvalidMessageError),  # type: ignore[arg-type]
    "topic with a newline": (Message("orders\n", b"x"), InvalidTopicError),
    "topic not a string": (Message(5, b"x"), InvalidTopicError),  # type: ignore[arg-type]
    "body a string": (_smuggled_body("x"), InvalidMessageError),
    "body too large": (Message("orders", b"x" * 2049), MessageTooLargeError),
    "message id not a string": (Message("orders", b"x", message_id=7), InvalidMessageError),  # type: ignore[arg-type]
    "message id with a tab": (Message("orders", b"x", message_id="a\tb"), InvalidMessageError),
    "keys a string": (Message("orders", b"x", keys="abc"), InvalidMessageError),  # type: ignore[arg-type]
    "key not a string": (Message("orders", b"x", keys=(5,)), InvalidMessageError),  # type: ignore[arg-type]
    "key too long": (Message("orders", b"x", keys=("k" * 128,)), InvalidMessageError),
    "tag too long": (Message("orders", b"x", tag="t" * 128), InvalidMessageError),
    "tag not printable": (Message("orders", b"x", tag="a\x00b"), InvalidMessageError),
    "message group empty": (Message("orders", b"x", message_group=""), InvalidMessageError),
    "message group with a space": (Message("orders", b"x", message_group="a b"), InvalidMessageError),
    "property value a number": (Message("orders", b"x", properties={"n": 5}), InvalidMessageError),  # type: ignore[dict-item]
    "property value a lone surrogate": (Message("orders", b"x", properties={"n": "\udc80"}), InvalidMessageError),
    "property name empty": (Message("orders", b"x", properties={"": "v"}), InvalidMessageError),
    "property name with a space": (Message("orders", b"x", properties={"a b": "v"}), InvalidMessageError),
    "properties too large": (Message("orders", b"x", properties={f"p{i}": "v" * 1000 for i in range(40)}),
                             MessageTooLargeError),
    "properties not a mapping": (Message("orders", b"x", properties=[("a", "b")]), InvalidMessageError),  # type: ignore[arg-type]
    "delay level negative": (Message("orders", b"x", delay_level=-1), InvalidMessageError),
    "delay level a float": (Message("orders", b"x", delay_level=1.5), InvalidMessageError),  # type: ignore[arg-type]
    "delay level a bool": (Message("orders", b"x", delay_level=True), InvalidMessageError),
    "deliver_at negative": (Message("orders", b"x", deliver_at_ms=-1), InvalidMessageError),
    "deliver_at a string": (Message("orders", b"x", deliver_at_ms="1"), InvalidMessageError),  # type: ignore[arg-type]
    "deliver_at a week ahead": (Message("orders", b"x", deliver_at_ms=NOW_MS + 7 * 86_400_000),
                                InvalidMessageError),
}


@pytest.mark.parametrize("name", list(BAD_MESSAGES))
def test_a_bad_field_is_refused_with_a_typed_error_before_anything_is_stored(
    broker_factory: BrokerFactory, name: str
) -> None:
    message, error = BAD_MESSAGES[name]
    broker = broker_factory(max_body_size=2048)
    end = broker.store.commitlog.write_offset
    with pytest.raises(error):
        broker.send_half(message, producer_group="pg", transaction_id="t1")
    with pytest.raises(error):
        broker.send(message)
    assert broker.send_batch([message])[0].__class__ is error
    assert broker.store.commitlog.write_offset == end, "a refused message stored nothing"
    assert broker.stats().pending_half == 0
    broker.close()
    broker = broker_factory()  # and nothing was left that a start could trip on
    assert broker.list_topics() == []


@pytest.mark.parametrize(
    "producer_group,transaction_id,error",
    [
        ("pg", 5, InvalidMessageError),
        ("pg", "tx one", InvalidMessageError),
        (None, "t1", InvalidTopicError),
        ("pg\n", "t1", InvalidTopicError),
    ],
)
def test_bad_half_and_end_arguments_are_refused(
    broker_factory: BrokerFactory, producer_group: object, transaction_id: object, error: type[Exception]
) -> None:
    broker = broker_factory()
    end = broker.store.commitlog.write_offset
    with pytest.raises(error):
        broker.send_half(Message("orders", b"x"), producer_group=producer_group,  # type: ignore[arg-type]
                         transaction_id=transaction_id)  # type: ignore[arg-type]
    with pytest.raises(error):
        broker.end_transaction(transaction_id, Resolution.COMMIT,  # type: ignore[arg-type]
                               producer_group=producer_group)  # type: ignore[arg-type]
    assert broker.store.commitlog.write_offset == end


def test_end_with_a_resolution_that_is_no_resolution_is_refused(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(transaction_timeout_s=60)
    broker.send_half(Message("orders", b"x"), producer_group="pg", transaction_id="t1")
    with pytest.raises(InvalidMessageError):
        broker.end_transaction("t1", "commit", producer_group="pg")  # type: ignore[arg-type]
    assert broker.transaction_state("t1") is TransactionState.PENDING
    assert broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg").applied


# -- stored records the broker cannot use ---------------------------------------------------
def append_raw(data_dir: Path, records: list[StoredRecord]) -> list[StoredRecord]:
    """Append records with the store alone (the broker is closed): nothing validates them."""
    store = MessageStore(data_dir, FAST.store)
    try:
        return store.put_batch(records)
    finally:
        store.close()


def half_props(**changes: str | None) -> dict[str, str]:
    """The properties of a half message of transaction ``tx-poison``, changed as given
    (None removes a property)."""
    props = {"UNIQ_KEY": "m-poison", "REAL_TOPIC": "orders", "REAL_QID": "0", "TRAN_ID": "tx-poison",
             "PGROUP": "pg"}
    for name, value in changes.items():
        if value is None:
            props.pop(name, None)
        else:
            props[name] = value
    return props


def start_with_a_sound_transaction(broker_factory: BrokerFactory) -> EmbeddedBroker:
    """A broker holding one sound pending transaction ``tx-sound``; returned closed."""
    broker = broker_factory()
    broker.send_half(Message("orders", b"sound", message_id="m-sound", transaction_timeout_s=600),
                     producer_group="pg", transaction_id="tx-sound")
    broker.close()
    return broker


def sound_transaction_still_works(broker: EmbeddedBroker) -> None:
    assert broker.transaction_state("tx-sound") is TransactionState.PENDING
    assert broker.end_transaction("tx-sound", Resolution.COMMIT, producer_group="pg").applied
    got = broker.receive("g", "orders", max_messages=10, wait_s=1)
    assert [r.message.body for r in got] == [b"sound"], "only the sound transaction is delivered"


HALF_POISONS: dict[str, dict[str, str | None]] = {
    "no transaction id": {"TRAN_ID": None},
    "transaction id with a space": {"TRAN_ID": "tx poison"},
    "transaction id too long": {"TRAN_ID": "t" * 65},
    "no producer group": {"PGROUP": None},
    "producer group with a slash": {"PGROUP": "pg/../x"},
    "no message id": {"UNIQ_KEY": None},
    "no real topic": {"REAL_TOPIC": None},
    "real topic climbing out of the data dir": {"REAL_TOPIC": "../../escape"},
    "real topic a system topic": {"REAL_TOPIC": HALF_TOPIC},
    "no real queue id": {"REAL_QID": None},
    "real queue id not a number": {"REAL_QID": "zz"},
    "real queue id negative": {"REAL_QID": "-1"},
    "real queue id past any topic": {"REAL_QID": "99999999999"},
    "delay level past 18": {"DELAY": "19"},
    "delay level not a number": {"DELAY": "soon"},
    "delivery time not a number": {"DELIVER_AT": "tomorrow"},
    "delivery time negative": {"DELIVER_AT": "-5"},
}


def _parked_poison(broker: EmbeddedBroker) -> str:
    parked = [p.transaction_id for p in broker.list_parked()]
    assert len(parked) == 1, parked
    return parked[0]


@pytest.mark.parametrize("name", list(HALF_POISONS))
def test_an_unusable_half_message_is_parked_for_the_operator_and_never_stops_a_start(
    broker_factory: BrokerFactory, name: str
) -> None:
    closed = start_with_a_sound_transaction(broker_factory)
    [poison] = append_raw(closed.data_dir, [StoredRecord(HALF_TOPIC, 0, b"poison", half_props(**HALF_POISONS[name]))])
    broker = broker_factory()  # no checker at all: parking needs none
    eventually(lambda: broker.list_parked())
    tx_id = _parked_poison(broker)
    assert tx_id in ("tx-poison", f"unreadable-tx-at-{poison.commit_log_offset}")
    with pytest.raises(InvalidMessageError, match="cannot be committed"):
        broker.resolve_parked(tx_id, force=Resolution.COMMIT)
    assert broker.transaction_state(tx_id) is TransactionState.PARKED
    broker.close()
    broker = broker_factory()  # parked, and still no trouble starting
    assert broker.resolve_parked(tx_id, force=Resolution.ROLLBACK).state is TransactionState.ROLLED_BACK
    sound_transaction_still_works(broker)
    broker.close()
    broker = broker_factory()
    assert broker.list_parked() == [] and broker.transaction_state(tx_id) is TransactionState.ROLLED_BACK


@pytest.mark.parametrize("name", list(HALF_POISONS))
def test_a_commit_of_an_unusable_half_message_is_not_redone_and_never_stops_a_start(
    broker_factory: BrokerFactory, tmp_path: Path, name: str
) -> None:
    """An older version committed it and crashed before writing the real message: the
    start logs that it cannot redo it, and goes on."""
    closed = start_with_a_sound_transaction(broker_factory)
    props = half_props(**HALF_POISONS[name])
    [half] = append_raw(closed.data_dir, [StoredRecord(HALF_TOPIC, 0, b"poison", props)])
    op = Op(props.get("TRAN_ID", ""), "commit", 0, NOW_MS, "pg", [half.commit_log_offset], ["m-poison"])
    append_raw(closed.data_dir, [StoredRecord(OP_HALF_TOPIC, 0, encode_op(op), {"TAGS": "d"})])
    broker = broker_factory()
    sound_transaction_still_works(broker)
    assert len(broker.read_all(HALF_TOPIC)) == 2, "no copy went to a system topic"
    assert set(broker.store.queues()) == {HALF_TOPIC, OP_HALF_TOPIC, "orders"}, "nor anywhere else"
    assert not list(tmp_path.glob("**/escape")), "nor outside the data directory"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e400", "abc", "86401"])
def test_an_unusable_transaction_timeout_falls_back_to_the_broker_default(
    broker_factory: BrokerFactory, value: str
) -> None:
    """The timeout only says when to check first: the default serves, nothing is parked."""
    closed = start_with_a_sound_transaction(broker_factory)
    append_raw(closed.data_dir, [StoredRecord(HALF_TOPIC, 0, b"poison", half_props(TRAN_TIMEOUT=value))])
    checker = AnsweringChecker(Resolution.COMMIT)
    broker = broker_factory(checker, transaction_timeout_s=0.2)
    eventually(lambda: broker.transaction_state("tx-poison") is TransactionState.COMMITTED)
    assert [r.message.body for r in broker.receive("g", "orders", wait_s=1)] == [b"poison"]
    assert broker.list_parked() == []


def test_op_records_that_name_foreign_or_missing_offsets_commit_nothing(broker_factory: BrokerFactory) -> None:
    closed = start_with_a_sound_transaction(broker_factory)
    broker = broker_factory()
    sound_half = broker.read_all(HALF_TOPIC)[0].commit_log_offset
    user = broker.send(Message("other", b"user")).commit_log_offset
    broker.close()
    ops = [  # commits of other transactions naming tx-sound's half, a user message, nowhere
        Op("tx-elsewhere", "commit", 0, NOW_MS, "pg", [sound_half], ["m-sound"]),
        Op("tx-elsewhere-2", "commit", 0, NOW_MS, "pg", [user], ["m-user"]),
        Op("tx-elsewhere-3", "commit", 0, NOW_MS, "pg", [10**12, -5], ["m-none"]),
        Op("tx-sound", "check", 2**40, NOW_MS),  # a check count past any check_max
    ]
    records = [StoredRecord(OP_HALF_TOPIC, 0, encode_op(op), {"TAGS": "d"}) for op in ops]
    records += [StoredRecord(OP_HALF_TOPIC, 0, body) for body in (b"\xc1", msgspec.msgpack.encode({"tx": 5}))]
    append_raw(closed.data_dir, records)
    broker = broker_factory()
    assert broker.receive("g", "orders", wait_s=0.5) == [], "nothing of tx-sound was committed"
    sound_transaction_still_works(broker)


SCHEDULE_POISONS: dict[str, dict[str, str]] = {
    "no real topic": {},
    "real topic climbing out of the data dir": {"REAL_TOPIC": "../../escape", "REAL_QID": "0"},
    "real queue id not a number": {"REAL_TOPIC": "orders", "REAL_QID": "zz"},
    "real queue id past any topic": {"REAL_TOPIC": "orders", "REAL_QID": "99999999999"},
}


@pytest.mark.parametrize("name", list(SCHEDULE_POISONS))
def test_an_undeliverable_delayed_message_stays_where_it_is_and_the_others_are_delivered(
    broker_factory: BrokerFactory, tmp_path: Path, name: str
) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"delayed", delay_level=1))
    broker.close()
    props = {"UNIQ_KEY": "m-poison", "DUE_AT": "1", "DELAY": "1", **SCHEDULE_POISONS[name]}
    append_raw(broker.data_dir, [StoredRecord(SCHEDULE_TOPIC, 1, b"poison", props)])
    broker = broker_factory()
    got: list[bytes] = []
    eventually(lambda: got.extend(r.message.body for r in broker.receive("g", "orders", wait_s=0.2)) or got)
    time.sleep(0.3)
    got.extend(r.message.body for r in broker.receive("g", "orders", max_messages=10))
    assert got == [b"delayed"]
    assert len(broker.read_all(SCHEDULE_TOPIC, 1)) == 2, "the poison stays in the schedule topic"
    assert not (tmp_path / "escape").exists()
    assert len(broker.delays) == 0, "and is not waited for (it would hold retention forever)"


def test_a_delayed_message_without_a_readable_due_time_is_delivered_now(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    broker.create_topic("orders")
    broker.close()
    props = {"UNIQ_KEY": "m-late", "DUE_AT": "whenever", "REAL_TOPIC": "orders", "REAL_QID": "2"}
    append_raw(broker.data_dir, [StoredRecord(SCHEDULE_TOPIC, 1, b"late", props)])
    broker = broker_factory()
    eventually(lambda: broker.read("orders", 2, 0))
    assert broker.read("orders", 2, 0)[0].message.body == b"late"


def test_consumer_progress_records_that_cannot_be_used_are_skipped(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    kept = broker.send(Message("orders", b"kept", message_id="m-kept"))
    tired = broker.send(Message("orders", b"tired", message_id="m-tired"))
    broker.close()

    def event(kind: str, group: str, sent: object, message_id: str, attempts: int) -> dict[str, object]:
        return {"e": kind, "g": group, "s": "orders", "t": "orders", "q": sent.queue_id,  # type: ignore[attr-defined]
                "o": sent.queue_offset, "n": attempts, "m": message_id, "ts": NOW_MS}  # type: ignore[attr-defined]

    bodies = [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode([{"e": 5}]),  # msgpack, not events
        # a dead-lettering whose group would name a DLQ topic outside the data directory
        msgspec.msgpack.encode([event("x", "../../../escape", kept, "m-kept", 3)]),
        # a dead-lettering that names another message than the one at its offset
        msgspec.msgpack.encode([event("x", "g2", kept, "m-someone-else", 3)]),
        # a delivery count past max_delivery_attempts: the message goes to the DLQ
        msgspec.msgpack.encode([event("d", "g", tired, "m-tired", 10**6)]),
    ]
    append_raw(broker.data_dir, [StoredRecord(CONSUMER_STATE_TOPIC, 0, body) for body in bodies])
    broker = broker_factory()
    assert not list(tmp_path.glob("**/escape"))
    assert [r.message.message_id for r in broker.receive("g", "orders", max_messages=10, wait_s=1)] == ["m-kept"]
    assert [m.message.message_id for m in broker.list_dlq("g")] == ["m-tired"]
    assert broker.list_dlq("g2") == [], "no DLQ copy of a message the event does not name"


def test_a_stored_message_with_unusable_fields_is_still_delivered(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", queues=1)
    broker.close()
    props = {"UNIQ_KEY": "m-odd", "DELAY": "x", "DELIVER_AT": "y", "TRAN_TIMEOUT": "nan"}
    append_raw(broker.data_dir, [StoredRecord("orders", 0, b"odd", props)])
    broker = broker_factory()
    [got] = broker.receive("g", "orders", wait_s=1)
    assert got.message.message_id == "m-odd" and got.message.delay_level == 0
    assert got.message.deliver_at_ms is None and got.message.transaction_timeout_s is None
    assert broker.query_by_id("m-odd") is not None
