"""Half messages, END_TRANSACTION, kept resolutions, check-back and parking."""

from __future__ import annotations

import pytest

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.errors import TransactionConflictError, UnknownTransactionError

from .conftest import AnsweringChecker, eventually


def test_half_message_is_invisible_until_commit(broker_factory) -> None:
    broker = broker_factory()
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    broker.send_half(Message("orders", b"b"), producer_group="pg", transaction_id="t1")
    assert broker.receive("g", "orders") == []
    result = broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg")
    assert result.applied and result.state is TransactionState.COMMITTED
    received = broker.receive("g", "orders", wait_s=2)
    assert sorted(r.message.body for r in received) == [b"a", b"b"]
    assert {r.transaction_id for r in received} == {"t1"}


def test_rolled_back_message_is_never_delivered(broker_factory) -> None:
    broker = broker_factory()
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    broker.end_transaction("t1", Resolution.ROLLBACK, producer_group="pg")
    assert broker.receive("g", "orders", wait_s=0.3) == []


def test_repeated_resolution_is_a_no_op_and_a_conflicting_one_is_refused(broker_factory) -> None:
    broker = broker_factory()
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg")
    again = broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg")
    assert not again.applied
    with pytest.raises(TransactionConflictError):
        broker.end_transaction("t1", Resolution.ROLLBACK, producer_group="pg")
    with pytest.raises(UnknownTransactionError):
        broker.end_transaction("nope", Resolution.COMMIT, producer_group="pg")
    with pytest.raises(TransactionConflictError):
        broker.send_half(Message("orders", b"late"), producer_group="pg", transaction_id="t1")
    assert len(broker.receive("g", "orders", wait_s=1)) == 1  # delivered once, not twice


def test_resolutions_survive_restart(broker_factory) -> None:
    broker = broker_factory()
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="c")
    broker.send_half(Message("orders", b"b"), producer_group="pg", transaction_id="r")
    broker.end_transaction("c", Resolution.COMMIT, producer_group="pg")
    broker.end_transaction("r", Resolution.ROLLBACK, producer_group="pg")
    broker.close()
    broker = broker_factory()
    assert broker.transaction_state("c") is TransactionState.COMMITTED
    assert broker.transaction_state("r") is TransactionState.ROLLED_BACK
    with pytest.raises(TransactionConflictError):
        broker.end_transaction("r", Resolution.COMMIT, producer_group="pg")


@pytest.mark.parametrize("answer,delivered", [(Resolution.COMMIT, 1), (Resolution.ROLLBACK, 0)])
def test_check_back_resolves_a_forgotten_transaction_once(broker_factory, answer, delivered) -> None:
    checker = AnsweringChecker(answer)
    broker = broker_factory(checker)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    eventually(lambda: broker.transaction_state("t1") is not TransactionState.PENDING)
    assert len(broker.receive("g", "orders", wait_s=0.5)) == delivered
    checks = len(checker.requests)
    assert checks == 1 and checker.requests[0].transaction_id == "t1"
    eventually(lambda: broker.checks.checks_sent >= 1)
    import time

    time.sleep(1.0)  # several check intervals: a resolved transaction is never checked again
    assert len(checker.requests) == checks


def test_unknown_answers_lead_to_rechecks_then_parking_and_admin_resolution(broker_factory) -> None:
    checker = AnsweringChecker(Resolution.UNKNOWN)
    broker = broker_factory(checker)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.PARKED)
    assert [r.check_times for r in checker.requests] == [1, 2, 3]
    assert [p.transaction_id for p in broker.list_parked()] == ["t1"]
    broker.close()
    broker = broker_factory()  # no checker: parked state survives restart
    assert broker.transaction_state("t1") is TransactionState.PARKED
    broker.resolve_parked("t1", force=Resolution.COMMIT)
    assert [r.message.body for r in broker.receive("g", "orders", wait_s=2)] == [b"a"]


def test_recheck_puts_a_parked_transaction_back_under_check(broker_factory) -> None:
    broker = broker_factory(AnsweringChecker(Resolution.UNKNOWN))
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.PARKED)
    broker.close()
    checker = AnsweringChecker(Resolution.ROLLBACK)
    broker = broker_factory(checker)
    broker.recheck_parked("t1")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.ROLLED_BACK)
    assert checker.requests[0].check_times == 1


def test_checks_that_reach_nobody_count_and_the_orphan_parks(broker_factory) -> None:
    broker = broker_factory()  # default checker: connected producers of the group, and none is
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    counts = []
    eventually(lambda: counts.append(broker.book.by_id["t1"].check_times) or counts[-1] >= 1)
    eventually(lambda: broker.transaction_state("t1") is TransactionState.PARKED)
    assert broker.transactions.checks.checks_unrouted >= 3  # FAST.check_max
    assert [p.transaction_id for p in broker.list_parked()] == ["t1"]


def test_registered_producers_get_checks(broker_factory) -> None:
    broker = broker_factory()
    seen = []

    def on_check(request):
        seen.append(request.transaction_id)
        broker.end_transaction(request.transaction_id, Resolution.COMMIT,
                               producer_group="pg", from_check=True)

    broker.register_producer("pg", on_check)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.COMMITTED)
    assert seen == ["t1"]


def test_a_connected_producer_of_the_group_goes_before_the_configured_checker(broker_factory) -> None:
    fallback = AnsweringChecker(Resolution.ROLLBACK)
    broker = broker_factory(fallback)
    answered = []

    def on_check(request):
        answered.append(request.transaction_id)
        broker.end_transaction(request.transaction_id, Resolution.COMMIT, producer_group="pg", from_check=True)

    broker.register_producer("pg", on_check)
    broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
    broker.send_half(Message("orders", b"b"), producer_group="other", transaction_id="t2")
    eventually(lambda: broker.transaction_state("t1") is TransactionState.COMMITTED)
    eventually(lambda: broker.transaction_state("t2") is TransactionState.ROLLED_BACK)
    assert answered == ["t1"]
    assert [r.transaction_id for r in fallback.requests] == ["t2"]


def test_outstanding_checks_are_bounded(broker_factory) -> None:
    class Silent:
        def __init__(self):
            self.requests = []

        def request_check(self, request):
            self.requests.append(request)
            return True

    silent = Silent()
    broker = broker_factory(None, max_outstanding_checks=2, check_interval_s=30)
    broker.set_checker(silent)
    for n in range(5):
        broker.send_half(Message("orders", b"x"), producer_group="pg", transaction_id=f"t{n}")
    eventually(lambda: len(silent.requests) == 2)
    import time

    time.sleep(0.5)
    assert len(silent.requests) == 2
    assert broker.stats().outstanding_checks == 2


def test_per_message_transaction_timeout_delays_the_first_check(broker_factory) -> None:
    checker = AnsweringChecker(Resolution.COMMIT)
    broker = broker_factory(checker)
    broker.send_half(Message("orders", b"a", transaction_timeout_s=60), producer_group="pg",
                     transaction_id="slow")
    broker.send_half(Message("orders", b"b"), producer_group="pg", transaction_id="fast")
    eventually(lambda: broker.transaction_state("fast") is TransactionState.COMMITTED)
    assert broker.transaction_state("slow") is TransactionState.PENDING


def test_a_check_answer_arriving_after_the_producer_resolved_changes_nothing(broker_factory, caplog) -> None:
    class Holding:
        def __init__(self):
            self.requests = []

        def request_check(self, request):
            self.requests.append(request)
            return True  # the answer comes later

    holding = Holding()
    broker = broker_factory(None, check_interval_s=30)
    broker.set_checker(holding)
    with caplog.at_level("INFO", logger="broker_embedded"):
        broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id="t1")
        eventually(lambda: holding.requests)
        broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg")  # the producer wins
        late = broker.end_transaction("t1", Resolution.COMMIT, producer_group="pg", from_check=True)
        assert not late.applied
        with pytest.raises(TransactionConflictError):
            broker.end_transaction("t1", Resolution.ROLLBACK, producer_group="pg", from_check=True)
    assert [r.message.body for r in broker.receive("g", "orders", max_messages=10, wait_s=1)] == [b"a"]
    assert broker.receive("g", "orders", wait_s=0.3) == []
    assert broker.stats().outstanding_checks == 0 and len(holding.requests) == 1
    logged = [r.getMessage() for r in caplog.records if "t1" in r.getMessage()]
    assert any("check-back 1/" in m for m in logged) and any("check-back answer" in m for m in logged)


def test_a_producers_own_end_is_not_a_log_line_at_info_but_a_check_backs_is(broker_factory, caplog) -> None:
    """A decorated call's END is the everyday case, one per call: a broker at its default
    level (INFO) writes no line for it (a line per transaction would fill an operator's disk
    and cost the broker CPU per call); what a check-back or an operator decided still shows."""
    broker = broker_factory(AnsweringChecker(Resolution.COMMIT), check_interval_s=0.05)
    with caplog.at_level("INFO", logger="broker_embedded"):
        for n, resolution in enumerate([Resolution.COMMIT, Resolution.ROLLBACK]):
            broker.send_half(Message("orders", b"a"), producer_group="pg", transaction_id=f"own{n}")
            broker.end_transaction(f"own{n}", resolution, producer_group="pg")
        broker.send_half(Message("orders", b"b", transaction_timeout_s=0.1), producer_group="pg",
                         transaction_id="checked")
        eventually(lambda: broker.transaction_state("checked") is TransactionState.COMMITTED)
    at_info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert not [m for m in at_info if "own" in m]
    assert any("checked committed by check-back answer" in m for m in at_info)
