"""A producer group whose checks nobody answers is loud: ``stats().unanswered_check_groups``
names it and the broker logs it at ERROR (once per period), until one of its answers arrives.

Group ``silent`` has a checker that takes every check and never answers (a Celery queue
with no worker); group ``live`` is answered at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from broker_embedded import (
    BrokerClient,
    CheckRequest,
    EmbeddedBroker,
    Message,
    Resolution,
    TransactionState,
)

from ..server.conftest import ServerProcess
from .conftest import eventually

UNANSWERED_LOGGER = "broker_embedded.broker.transactions"


class HalfAnsweringChecker:
    """Takes every check; answers ROLLBACK from its own thread for the ``live`` group only."""

    def __init__(self) -> None:
        self.requests: list[CheckRequest] = []
        self.broker: EmbeddedBroker | None = None

    def request_check(self, request: CheckRequest) -> bool:
        self.requests.append(request)
        broker = self.broker
        if request.producer_group == "live" and broker is not None:
            threading.Thread(target=lambda: broker.end_transaction(
                request.transaction_id, Resolution.ROLLBACK, producer_group="live", from_check=True,
            )).start()
        return True

    def checks_of(self, group: str) -> int:
        return sum(1 for request in self.requests if request.producer_group == group)


def _half(broker: EmbeddedBroker, group: str, transaction_id: str) -> None:
    broker.send_half(Message("order.paid", b"{}"), producer_group=group, transaction_id=transaction_id)


def _unanswered_errors(caplog: pytest.LogCaptureFixture, group: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "ERROR" and f"producer group {group!r}" in r.getMessage()]


def test_only_the_group_nobody_answers_is_reported(broker_factory, caplog) -> None:
    checker = HalfAnsweringChecker()
    broker = broker_factory(checker, check_max=1000)
    with caplog.at_level("ERROR", logger=UNANSWERED_LOGGER):
        _half(broker, "silent", "s1")
        for n in range(3):  # the live group keeps being asked, and keeps answering
            _half(broker, "live", f"l{n}")
        eventually(lambda: "silent" in broker.stats().unanswered_check_groups)
        eventually(lambda: all(broker.transaction_state(f"l{n}") is TransactionState.ROLLED_BACK
                               for n in range(3)))
        stats = broker.stats()
        assert list(stats.unanswered_check_groups) == ["silent"]
        assert stats.unanswered_check_groups["silent"] >= 2 * 0.3  # two check intervals of FAST
        asked = checker.checks_of("silent")
        eventually(lambda: checker.checks_of("silent") >= asked + 5)  # five more unanswered rounds
        assert len(_unanswered_errors(caplog, "silent")) == 1, "logged once per period, not every round"
        assert _unanswered_errors(caplog, "live") == []


def test_an_answer_clears_the_group_and_a_new_silence_is_reported_again(broker_factory, caplog) -> None:
    checker = HalfAnsweringChecker()
    broker = broker_factory(checker, check_max=1000)
    with caplog.at_level("ERROR", logger=UNANSWERED_LOGGER):
        _half(broker, "silent", "s1")
        eventually(lambda: "silent" in broker.stats().unanswered_check_groups)
        eventually(lambda: len(_unanswered_errors(caplog, "silent")) == 1)
        # a late checker of the group answers at last
        broker.end_transaction("s1", Resolution.COMMIT, producer_group="silent", from_check=True)
        assert "silent" not in broker.stats().unanswered_check_groups
        _half(broker, "silent", "s2")  # ... and falls silent again
        eventually(lambda: "silent" in broker.stats().unanswered_check_groups)
        eventually(lambda: len(_unanswered_errors(caplog, "silent")) == 2)


def test_a_group_whose_transactions_parked_is_no_longer_reported(broker_factory) -> None:
    checker = HalfAnsweringChecker()
    broker = broker_factory(checker)  # FAST: parked after 3 unanswered checks
    _half(broker, "silent", "s1")
    eventually(lambda: "silent" in broker.stats().unanswered_check_groups)
    eventually(lambda: broker.transaction_state("s1") is TransactionState.PARKED)
    eventually(lambda: broker.stats().unanswered_check_groups == {})


def test_a_group_with_no_checker_route_is_reported_too(broker_factory) -> None:
    broker = broker_factory()  # the default checker: connected producers, and none is
    _half(broker, "nobody", "n1")
    eventually(lambda: "nobody" in broker.stats().unanswered_check_groups)


@pytest.mark.slow
def test_stats_over_tcp_and_the_cli_show_the_unanswered_group(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "0.3", "--check-interval", "0.3")
    server.start()
    try:
        _stats_over_tcp(server.url)
    finally:
        server.kill()


def _stats_over_tcp(url: str) -> None:
    with BrokerClient(url) as producer, BrokerClient(url) as admin:
        def answer(request: CheckRequest) -> None:
            threading.Thread(target=lambda: producer.end_transaction(
                request.transaction_id, Resolution.ROLLBACK, producer_group="live", from_check=True,
            )).start()

        producer.register_producer("live", answer)
        for group in ("silent", "live"):
            producer.send_half(Message("order.paid", b"{}"), producer_group=group, transaction_id=f"{group}-1")
        eventually(lambda: "silent" in admin.stats().unanswered_check_groups)
        eventually(lambda: admin.transaction_state("live-1") is TransactionState.ROLLED_BACK)
        assert list(admin.stats().unanswered_check_groups) == ["silent"]
    printed = subprocess.run([sys.executable, "-m", "broker_embedded", "stats", "--json", "--url", url],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert list(json.loads(printed)["unanswered_check_groups"]) == ["silent"]

