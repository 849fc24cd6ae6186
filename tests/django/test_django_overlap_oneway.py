"""Django's ``@transactional_message`` over TCP waits for one broker round trip at most:
the half message is awaited at the end of its ``atomic`` block (a broker lost meanwhile
commits nothing), and the END after the commit does not hold the caller, yet is
delivered by a process that exits right after the call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

from broker_embedded import BrokerClient, TransactionState
from outbox import BrokerUnavailableError, instrumentation
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import TransactionLog
from outbox.integrations.django.transactional import current_transaction_id, transactional_message
from tests.django.shop.models import Account
from tests.outbox.async_support import tcp_broker
from tests.outbox.test_overlap_oneway import ROOT, hold, listening, recorder
from tests.server.conftest import ServerProcess


def test_the_call_returns_before_its_end_is_answered(tmp_path: Path, alias: str) -> None:
    server = tcp_broker(tmp_path / "broker")
    ends: list[str] = []
    release = threading.Event()

    def hold_the_broker() -> None:
        nonlocal release
        release = hold(server)

    try:
        with override_settings(OUTBOX={"BROKER_URL": server.url, "PRODUCER_GROUP": "shop",
                                       "PRODUCER_GROUPS": {"shop": alias}}):
            @transactional_message(topic="order.paid", using=alias)
            def pay(name: str) -> str:
                transaction.on_commit(hold_the_broker, using=alias)  # runs before the call's END
                return current_transaction_id() or ""

            with listening(instrumentation.END_TRANSACTION, recorder(ends, "END sent", "END answered")):
                transaction_id = pay("alice")
                assert ends == ["END sent"]
                assert server.broker.transaction_state(transaction_id) is TransactionState.PENDING
                release.set()
                assert producer().flush(10)
            assert ends == ["END sent", "END answered"]
            assert server.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    finally:
        release.set()
        server.stop()


def test_broker_killed_between_begin_and_commit_commits_nothing_and_raises(tmp_path: Path, alias: str) -> None:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()
    ran = []
    try:
        with override_settings(OUTBOX={"BROKER_URL": server.url, "PRODUCER_GROUP": "shop",
                                       "PRODUCER_GROUPS": {"shop": alias}}):
            @transactional_message(topic="order.paid", using=alias)
            def pay(name: str) -> None:
                Account.objects.using(alias).filter(name=name).update(balance=0)
                ran.append(name)
                server.kill()  # the half message was never read: it has no acknowledgment

            producer()  # connected (and answering check-backs) before the broker stops
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            with pytest.raises(BrokerUnavailableError):
                pay("alice")
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    assert ran == ["alice"]
    assert Account.objects.using(alias).get(name="alice").balance == 500
    assert not TransactionLog.objects.using(alias).exists()


def test_a_process_exiting_right_after_a_call_delivers_its_end(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()  # no check-back
    try:
        done = subprocess.run([sys.executable, "-m", "tests.outbox.exit_after_call", "django", server.url,
                               str(tmp_path / "app.sqlite3")], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with BrokerClient(server.url) as client:
            assert client.transaction_state(done.stdout.strip()) is TransactionState.COMMITTED
    finally:
        server.kill()


def test_without_overlap_the_half_is_acknowledged_before_the_function_runs(tmp_path: Path, alias: str) -> None:
    server = tcp_broker(tmp_path / "broker")
    timeline: list[str] = []
    try:
        with override_settings(OUTBOX={"BROKER_URL": server.url, "PRODUCER_GROUP": "shop",
                                       "PRODUCER_GROUPS": {"shop": alias}}):
            @transactional_message(topic="order.paid", using=alias, overlap=False)
            def pay(name: str) -> str:
                timeline.append("function")
                return current_transaction_id() or ""

            with listening(instrumentation.SEND_HALF, recorder(timeline, "half sent", "half acknowledged")):
                transaction_id = pay("alice")
            assert timeline == ["half sent", "half acknowledged", "function"]
            assert producer().flush(10)
            assert server.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    finally:
        server.stop()
