"""One set of ``BrokerAPI`` behaviour tests, run over every transport (``conftest.DRIVERS``):
what a producer, a consumer and an admin see must not depend on how they reach the broker,
down to the type of the error a mistake raises. A RocketMQ 5 proxy offers no admin API:
there those calls raise ``UnsupportedError``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.errors import (
    BrokerError,
    GroupInUseError,
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    ReservedTopicError,
    TransactionConflictError,
    UnknownGroupError,
    UnknownReceiptError,
    UnknownTopicError,
    UnknownTransactionError,
    UnsupportedError,
)

from .conftest import Driver

GROUP = "contract-consumers"
PRODUCERS = "contract-producers"


def _id() -> str:
    return uuid.uuid4().hex


def _drain(driver: Driver, topic: str, count: int, group: str = GROUP, within_s: float = 10.0) -> list[Any]:
    """Receive and ack until ``count`` messages came (or ``within_s`` passed)."""
    received: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(received) < count and time.monotonic() < deadline:
        for message in driver.api.receive(group, topic, max_messages=count - len(received), wait_s=1):
            driver.api.ack(group, message.receipt_handle)
            received.append(message)
    return received


def _receive(driver: Driver, topic: str, count: int, within_s: float = 10.0) -> list[Any]:
    """Receive (without acking) until ``count`` messages came (or ``within_s`` passed)."""
    received: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(received) < count and time.monotonic() < deadline:
        received += driver.api.receive(GROUP, topic, max_messages=count - len(received), wait_s=1)
    return received


def _nothing_visible(driver: Driver, topic: str, group: str = GROUP) -> bool:
    return driver.api.receive(group, topic, max_messages=8, wait_s=0) == []


# -- producing and consuming ----------------------------------------------------------------
def test_a_sent_message_is_received_once_and_acked_once(driver: Driver) -> None:
    topic = driver.topic()
    sent = driver.api.send(Message(topic, b"hello", keys=("order-1",), tag="paid", properties={"a": "1"}))
    (received,) = driver.api.receive(GROUP, topic, max_messages=8, wait_s=5)
    assert received.message.body == b"hello"
    assert received.message.message_id == sent.message_id
    assert (received.message.tag, received.message.keys) == ("paid", ("order-1",))
    assert received.message.properties["a"] == "1"
    assert received.delivery_attempt == 1
    driver.api.ack(GROUP, received.receipt_handle)
    with pytest.raises(UnknownReceiptError):
        driver.api.ack(GROUP, received.receipt_handle)
    assert _nothing_visible(driver, topic)


def test_a_changed_invisible_duration_gives_a_new_receipt(driver: Driver) -> None:
    topic = driver.topic()
    driver.api.send(Message(topic, b"slow work"))
    (received,) = driver.api.receive(GROUP, topic, wait_s=5, invisible_duration_s=5)
    handle = driver.api.change_invisible_duration(GROUP, received.receipt_handle, 60)
    assert isinstance(handle, str) and handle
    driver.api.ack(GROUP, handle)
    with pytest.raises(UnknownReceiptError):
        driver.api.ack(GROUP, handle)


def test_a_change_that_keeps_the_receipt_leaves_the_handle_good(driver: Driver) -> None:
    """``keep_receipt`` (a front renewing for its consumer): the same handle comes back, the
    message stays invisible, and that handle acks it once."""
    topic = driver.topic()
    driver.api.send(Message(topic, b"renewed"))
    (received,) = driver.api.receive(GROUP, topic, wait_s=5, invisible_duration_s=2)
    handle = driver.api.change_invisible_duration(GROUP, received.receipt_handle, 60, keep_receipt=True)
    assert handle == received.receipt_handle
    time.sleep(2.5)  # past the first invisible duration
    assert _nothing_visible(driver, topic)
    driver.api.ack(GROUP, handle)
    with pytest.raises(UnknownReceiptError):
        driver.api.ack(GROUP, handle)


def test_ack_many_answers_per_receipt_and_acks_the_good_ones(driver: Driver) -> None:
    """As RocketMQ 5's batch AckMessage: a status per entry, one bad receipt (unknown, or
    already acked) refusing only itself."""
    topic = driver.topic()
    for body in (b"a", b"b", b"c"):
        driver.api.send(Message(topic, body))
    received = _receive(driver, topic, 3)
    first, *rest = (r.receipt_handle for r in received)
    driver.api.ack(GROUP, first)
    outcomes = driver.api.ack_many(GROUP, [rest[0], first, "no-such-receipt", rest[1]])
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], UnknownReceiptError) and isinstance(outcomes[2], UnknownReceiptError)
    again = driver.api.ack_many(GROUP, rest)
    assert len(again) == 2 and all(isinstance(o, UnknownReceiptError) for o in again)
    assert driver.api.ack_many(GROUP, []) == []
    assert _nothing_visible(driver, topic)


def test_an_unknown_receipt_is_refused(driver: Driver) -> None:
    with pytest.raises(UnknownReceiptError):
        driver.api.ack(GROUP, "no-such-receipt")


def test_a_message_group_is_delivered_in_order_one_at_a_time(driver: Driver) -> None:
    topic = driver.topic()
    for n in range(3):
        driver.api.send(Message(topic, f"step {n}".encode(), message_group="order-7"))
    bodies = []
    for _ in range(3):
        batch = driver.api.receive(GROUP, topic, max_messages=8, wait_s=5)
        assert len(batch) == 1  # the next one waits for this one's ack
        bodies.append(batch[0].message.body)
        driver.api.ack(GROUP, batch[0].receipt_handle)
    assert bodies == [b"step 0", b"step 1", b"step 2"]


def test_a_delayed_message_comes_at_its_time(driver: Driver) -> None:
    topic = driver.topic()
    driver.api.send(Message(topic, b"later", deliver_at_ms=int(time.time() * 1000) + 3000))
    sent_at = time.monotonic()
    driver.api.send(Message(topic, b"level one", delay_level=1))
    early = [m.message.body for m in driver.api.receive("contract-peekers", topic, wait_s=0)]
    # level 1 is 1 s: on a loaded machine the sends alone may take that long (a peek by another
    # group, so the drain below is not held up by an unacked delivery)
    assert early == [] if time.monotonic() - sent_at < 1.0 else b"later" not in early
    assert sorted(m.message.body for m in _drain(driver, topic, 2)) == [b"later", b"level one"]


# -- transactions ---------------------------------------------------------------------------
def test_commit_delivers_every_half_message_once_and_a_repeat_is_a_no_op(driver: Driver) -> None:
    topic, transaction_id = driver.topic(), _id()
    for n in range(2):
        driver.api.send_half(Message(topic, f"half {n}".encode()), producer_group=PRODUCERS,
                             transaction_id=transaction_id)
    assert _nothing_visible(driver, topic)
    ended = driver.api.end_transaction(transaction_id, Resolution.COMMIT, producer_group=PRODUCERS)
    assert (ended.state, ended.applied, len(ended.message_ids)) == (TransactionState.COMMITTED, True, 2)
    again = driver.api.end_transaction(transaction_id, Resolution.COMMIT, producer_group=PRODUCERS)
    assert (again.state, again.applied) == (TransactionState.COMMITTED, False)
    with pytest.raises(TransactionConflictError):
        driver.api.end_transaction(transaction_id, Resolution.ROLLBACK, producer_group=PRODUCERS)
    assert sorted(m.message.body for m in _drain(driver, topic, 2)) == [b"half 0", b"half 1"]
    assert all(m.transaction_id == transaction_id for m in _drain(driver, topic, 0))


def test_rollback_delivers_nothing_and_a_later_commit_is_refused(driver: Driver) -> None:
    topic, transaction_id = driver.topic(), _id()
    driver.api.send_half(Message(topic, b"never"), producer_group=PRODUCERS, transaction_id=transaction_id)
    ended = driver.api.end_transaction(transaction_id, Resolution.ROLLBACK, producer_group=PRODUCERS)
    assert (ended.state, ended.applied) == (TransactionState.ROLLED_BACK, True)
    again = driver.api.end_transaction(transaction_id, Resolution.ROLLBACK, producer_group=PRODUCERS)
    assert (again.state, again.applied) == (TransactionState.ROLLED_BACK, False)
    with pytest.raises(TransactionConflictError):
        driver.api.end_transaction(transaction_id, Resolution.COMMIT, producer_group=PRODUCERS)
    assert _nothing_visible(driver, topic)


def test_unknown_leaves_the_transaction_open(driver: Driver) -> None:
    topic, transaction_id = driver.topic(), _id()
    driver.api.send_half(Message(topic, b"later"), producer_group=PRODUCERS, transaction_id=transaction_id)
    ended = driver.api.end_transaction(transaction_id, Resolution.UNKNOWN, producer_group=PRODUCERS)
    assert (ended.state, ended.applied) == (TransactionState.PENDING, False)
    assert driver.api.end_transaction(transaction_id, Resolution.COMMIT, producer_group=PRODUCERS).applied
    assert [m.message.body for m in _drain(driver, topic, 1)] == [b"later"]


def test_ending_an_unknown_transaction_is_refused(driver: Driver) -> None:
    with pytest.raises(UnknownTransactionError):
        driver.api.end_transaction(_id(), Resolution.COMMIT, producer_group=PRODUCERS)


# -- the same mistake, the same error -------------------------------------------------------
MISTAKES: dict[str, tuple[type[BrokerError], Callable[[Driver, str], Any]]] = {
    "bad topic name": (InvalidTopicError, lambda d, t: d.api.send(Message("no spaces here", b"x"))),
    "reserved topic": (ReservedTopicError, lambda d, t: d.api.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"))),
    "dead-letter topic": (ReservedTopicError, lambda d, t: d.api.send(Message(f"%DLQ%{GROUP}", b"x"))),
    "oversize body": (MessageTooLargeError, lambda d, t: d.api.send(Message(t, b"x" * (4 * 1024 * 1024 + 1)))),
    "bad delay level": (InvalidMessageError, lambda d, t: d.api.send(Message(t, b"x", delay_level=99))),
    "delay level and time": (InvalidMessageError, lambda d, t: d.api.send(
        Message(t, b"x", delay_level=1, deliver_at_ms=int(time.time() * 1000)))),
    "bad property name": (InvalidMessageError, lambda d, t: d.api.send(Message(t, b"x", properties={"a b": "1"}))),
    "bad message group": (InvalidMessageError, lambda d, t: d.api.send(Message(t, b"x", message_group="a b"))),
    "bad transaction id": (InvalidMessageError, lambda d, t: d.api.send_half(
        Message(t, b"x"), producer_group=PRODUCERS, transaction_id="has space")),
    "half to a reserved topic": (ReservedTopicError, lambda d, t: d.api.send_half(
        Message("RMQ_SYS_TRANS_OP_HALF_TOPIC", b"x"), producer_group=PRODUCERS, transaction_id=_id())),
    "bad consumer group": (InvalidTopicError, lambda d, t: d.api.receive("no spaces", t)),
    "receive nothing": (InvalidMessageError, lambda d, t: d.api.receive(GROUP, t, max_messages=0)),
    "receive invisible for no time": (InvalidMessageError, lambda d, t: d.api.receive(
        GROUP, t, invisible_duration_s=0)),
    "receive waiting too long": (InvalidMessageError, lambda d, t: d.api.receive(GROUP, t, wait_s=10**9)),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistake_raises_the_same_typed_error_on_every_transport(driver: Driver, mistake: str) -> None:
    error, call = MISTAKES[mistake]
    with pytest.raises(error) as raised:
        call(driver, driver.topic())
    assert type(raised.value) is error


# -- reading and admin ----------------------------------------------------------------------
def test_query_by_id_and_key(driver: Driver) -> None:
    topic = driver.topic()
    sent = driver.api.send(Message(topic, b"find me", keys=("order-9",)))
    if driver.proxy:
        for call in (lambda: driver.api.query_by_id(sent.message_id),
                     lambda: driver.api.query_by_key(topic, "order-9")):
            with pytest.raises(UnsupportedError):
                call()
        return
    found = driver.api.query_by_id(sent.message_id)
    assert found is not None and found.message.body == b"find me"
    assert [m.message.body for m in driver.api.query_by_key(topic, "order-9")] == [b"find me"]
    assert driver.api.query_by_id(_id()) is None
    assert driver.api.query_by_key(topic, "no-such-key") == []


ADMIN_CALLS: dict[str, Callable[[Driver, str], Any]] = {
    "create_topic": lambda d, t: d.api.create_topic(t, 2),
    "list_topics": lambda d, t: d.api.list_topics(),
    "transaction_state": lambda d, t: d.api.transaction_state(_id()),
    "read": lambda d, t: d.api.read(t, 0, 0),
    "offset_for_timestamp": lambda d, t: d.api.offset_for_timestamp(t, 0, 0),
    "list_parked": lambda d, t: d.api.list_parked(),
    "open_transactions": lambda d, t: d.api.open_transactions(PRODUCERS),
    "resolve_parked": lambda d, t: d.api.resolve_parked(_id(), force=Resolution.ROLLBACK),
    "recheck_parked": lambda d, t: d.api.recheck_parked(_id()),
    "list_dlq": lambda d, t: d.api.list_dlq(GROUP),
    "resend_dlq": lambda d, t: d.api.resend_dlq(GROUP, _id()),
    "delete_group": lambda d, t: d.api.delete_group(GROUP),
    "reset_group": lambda d, t: d.api.reset_group(GROUP, t),
    "stats": lambda d, t: d.api.stats(),
}


def test_admin_calls(driver: Driver) -> None:
    if driver.proxy:
        for name, call in ADMIN_CALLS.items():
            with pytest.raises(UnsupportedError):
                call(driver, driver.topic())
                pytest.fail(f"{name} did not raise UnsupportedError")
        return
    api, topic = driver.api, f"contract-{_id()[:10]}"
    info = api.create_topic(topic, 2)
    assert (info.name, info.queues) == (topic, 2)
    assert api.create_topic(topic, 4).queues == 2  # idempotent
    assert topic in [t.name for t in api.list_topics()]
    sent = api.send(Message(topic, b"stored", keys=("k",)))
    assert [m.message.body for m in api.read(sent.topic, sent.queue_id, sent.queue_offset)] == [b"stored"]
    assert api.offset_for_timestamp(sent.topic, sent.queue_id, 0) == 0
    transaction_id = _id()
    api.send_half(Message(topic, b"open"), producer_group=PRODUCERS, transaction_id=transaction_id)
    assert api.transaction_state(transaction_id) is TransactionState.PENDING
    assert transaction_id in api.open_transactions(PRODUCERS)
    assert transaction_id not in api.open_transactions("another-group")
    api.end_transaction(transaction_id, Resolution.COMMIT, producer_group=PRODUCERS)
    assert api.transaction_state(transaction_id) is TransactionState.COMMITTED
    assert transaction_id not in [p.transaction_id for p in api.list_parked()]
    with pytest.raises(UnknownTransactionError):
        api.transaction_state(_id())
    with pytest.raises(UnknownTransactionError):
        api.resolve_parked(_id(), force=Resolution.ROLLBACK)
    with pytest.raises(UnknownTransactionError):
        api.recheck_parked(_id())
    assert api.list_dlq(f"group-{_id()[:8]}") == []
    stats = api.stats()
    assert topic in [t.name for t in stats.topics]
    assert stats.pending_half >= 0 and stats.parked >= 0


def test_a_group_no_longer_used_is_deleted_and_one_in_use_is_refused(driver: Driver) -> None:
    if driver.proxy:
        return  # test_admin_calls: UnsupportedError
    api, topic, group = driver.api, driver.topic(), f"retired-{_id()[:8]}"
    for body in (b"a", b"b"):
        api.send(Message(topic, body))
    held = _drain(driver, topic, 1, group=group) and api.receive(group, topic, wait_s=2)
    assert len(held) == 1
    with pytest.raises(GroupInUseError):
        api.delete_group(group)
    assert group in api.stats().consumer_lag
    api.ack(group, held[0].receipt_handle)
    deleted = api.delete_group(group)
    assert (deleted.group, deleted.dead_letters) == (group, 0) and deleted.queues >= 1
    assert group not in api.stats().consumer_lag
    with pytest.raises(UnknownGroupError):
        api.delete_group(group)


def test_a_group_reset_to_the_end_skips_its_backlog(driver: Driver) -> None:
    if driver.proxy:
        return  # test_admin_calls: UnsupportedError
    api, topic, group = driver.api, driver.topic(2), f"late-{_id()[:8]}"
    for body in (b"a", b"b", b"c"):
        api.send(Message(topic, body))
    reset = api.reset_group(group, topic)
    assert (reset.group, reset.topic, reset.queues, reset.lag) == (group, topic, 2, 0)
    api.send(Message(topic, b"new"))
    assert [m.message.body for m in _drain(driver, topic, 1, group=group)] == [b"new"]
    assert api.reset_group(group, topic, 0).lag == 4  # every message kept, again
    with pytest.raises(UnknownTopicError):
        api.reset_group(group, f"missing-{_id()[:8]}")


@pytest.mark.parametrize("mistake", ["no queues", "too many queues", "bad topic", "reserved topic"])
def test_a_bad_topic_to_create_raises_the_same_typed_error(driver: Driver, mistake: str) -> None:
    topic, queues, error = {
        "no queues": (f"contract-{_id()[:10]}", 0, InvalidMessageError),
        "too many queues": (f"contract-{_id()[:10]}", 10**6, InvalidMessageError),
        "bad topic": ("no spaces", 1, InvalidTopicError),
        "reserved topic": ("RMQ_SYS_TRANS_HALF_TOPIC", 1, ReservedTopicError),
    }[mistake]
    error = UnsupportedError if driver.proxy else error
    with pytest.raises(error) as raised:
        driver.api.create_topic(topic, queues)
    assert type(raised.value) is error


@pytest.mark.parametrize("wait_s", [0, -1, 10**9])
def test_resolving_a_parked_transaction_with_a_bad_wait_raises_the_same_typed_error(
    driver: Driver, wait_s: float
) -> None:
    error = UnsupportedError if driver.proxy else InvalidMessageError
    with pytest.raises(error) as raised:
        driver.api.resolve_parked(_id(), wait_s=wait_s)
    assert type(raised.value) is error
