"""``resolve_parked``: by default one check-back to the producer group's checker, whose
answer is applied; no answer changes nothing; ``force`` records a resolution unchecked."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from broker_embedded import CheckRequest, EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.errors import (
    CheckUnansweredError,
    InvalidMessageError,
    UnknownTransactionError,
)

from .conftest import eventually

BrokerFactory = Callable[..., EmbeddedBroker]


class SilentChecker:
    """Takes every check and answers none (a producer whose local transaction hangs)."""

    def __init__(self) -> None:
        self.requests: list[CheckRequest] = []

    def request_check(self, request: CheckRequest) -> bool:
        self.requests.append(request)
        return True


def parked_broker(broker_factory: BrokerFactory, *transaction_ids: str) -> EmbeddedBroker:
    """A broker whose default checker (connected producers) has these transactions parked."""
    broker = broker_factory(SilentChecker())
    for tx in transaction_ids:
        broker.send_half(Message("orders", tx.encode()), producer_group="pg", transaction_id=tx)
    eventually(lambda: len(broker.list_parked()) == len(transaction_ids))
    broker.set_checker(broker.producers)  # RocketMQ's way from now on: ask a connected producer
    return broker


def answering(broker: EmbeddedBroker, answer: Resolution | dict[str, Resolution], group: str = "pg",
              in_thread: bool = True) -> list[CheckRequest]:
    """Register a producer of ``group`` answering checks with ``answer`` (or ``answer[id]``)."""
    asked: list[CheckRequest] = []

    def reply(request: CheckRequest) -> None:
        resolution = answer if isinstance(answer, Resolution) else answer[request.transaction_id]
        broker.end_transaction(request.transaction_id, resolution, producer_group=group, from_check=True)

    def on_check(request: CheckRequest) -> None:
        asked.append(request)
        if in_thread:
            threading.Thread(target=reply, args=(request,)).start()
        else:
            reply(request)

    broker.register_producer(group, on_check)
    return asked


def _unchanged(broker: EmbeddedBroker, tx: str, log_end: int) -> None:
    assert broker.transaction_state(tx) is TransactionState.PARKED
    assert broker.store.commitlog.write_offset == log_end, "nothing was written"
    assert broker.receive("g", "orders", wait_s=0.2) == []


def test_with_no_checker_of_the_group_nothing_changes(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1")
    answering(broker, Resolution.COMMIT, group="another-group")
    log_end = broker.store.commitlog.write_offset
    with pytest.raises(CheckUnansweredError, match="no checker of producer group 'pg' took"):
        broker.resolve_parked("t1")
    _unchanged(broker, "t1", log_end)


def test_a_checker_that_does_not_answer_in_time_changes_nothing(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1")
    silent: list[CheckRequest] = []
    broker.register_producer("pg", silent.append)
    log_end = broker.store.commitlog.write_offset
    with pytest.raises(CheckUnansweredError, match="answered .* within 0.3 s"):
        broker.resolve_parked("t1", wait_s=0.3)
    assert [r.transaction_id for r in silent] == ["t1"]
    _unchanged(broker, "t1", log_end)


def test_an_unknown_answer_changes_nothing(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1")
    answering(broker, Resolution.UNKNOWN)
    log_end = broker.store.commitlog.write_offset
    with pytest.raises(CheckUnansweredError, match="UNKNOWN"):
        broker.resolve_parked("t1")
    _unchanged(broker, "t1", log_end)


def test_an_answer_from_another_group_is_not_taken(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1")
    refused: list[Exception] = []

    def wrong_group(request: CheckRequest) -> None:
        try:
            broker.end_transaction(request.transaction_id, Resolution.COMMIT, producer_group="other",
                                   from_check=True)
        except UnknownTransactionError as exc:
            refused.append(exc)

    broker.register_producer("pg", wrong_group)
    with pytest.raises(CheckUnansweredError, match="within 0.3 s"):
        broker.resolve_parked("t1", wait_s=0.3)
    assert len(refused) == 1
    assert broker.transaction_state("t1") is TransactionState.PARKED


@pytest.mark.parametrize("in_thread", [True, False], ids=["answer-later", "answer-inside-the-check"])
def test_the_checkers_answer_is_applied(broker_factory: BrokerFactory, in_thread: bool) -> None:
    broker = parked_broker(broker_factory, "rolled-back", "committed")
    checks_sent = broker.stats().extra["checks_sent"]
    asked = answering(broker, {"rolled-back": Resolution.ROLLBACK, "committed": Resolution.COMMIT},
                      in_thread=in_thread)
    assert broker.resolve_parked("rolled-back").state is TransactionState.ROLLED_BACK
    assert broker.resolve_parked("committed").state is TransactionState.COMMITTED
    assert [r.transaction_id for r in asked] == ["rolled-back", "committed"]
    assert [r.message.body for r in broker.receive("g", "orders", max_messages=10, wait_s=1)] == [b"committed"]
    assert broker.list_parked() == []
    assert broker.stats().extra["checks_sent"] == checks_sent, "an operator's check is not a counted check"


def test_force_records_the_resolution_without_asking(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1", "t2")
    asked = answering(broker, Resolution.ROLLBACK)
    assert broker.resolve_parked("t1", force=Resolution.COMMIT).state is TransactionState.COMMITTED
    assert broker.resolve_parked("t2", force=Resolution.ROLLBACK).state is TransactionState.ROLLED_BACK
    assert asked == []
    assert [r.message.body for r in broker.receive("g", "orders", wait_s=1)] == [b"t1"]


def test_bad_resolve_arguments_are_refused(broker_factory: BrokerFactory) -> None:
    broker = parked_broker(broker_factory, "t1")
    with pytest.raises(InvalidMessageError):
        broker.resolve_parked("t1", force=Resolution.UNKNOWN)
    with pytest.raises(InvalidMessageError):
        broker.resolve_parked("t1", wait_s=float("nan"))
    with pytest.raises(UnknownTransactionError):
        broker.resolve_parked("never-parked")
    with pytest.raises(UnknownTransactionError):
        broker.resolve_parked("never-parked", force=Resolution.ROLLBACK)
    assert broker.transaction_state("t1") is TransactionState.PARKED
