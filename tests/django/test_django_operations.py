"""The Django app's failure rules, lock timeouts, settings, and operations on parked
transactions (admin action and commands) and the consumer command as a real process."""

from __future__ import annotations

import io
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import IntegrityError
from django.test import override_settings

from broker_embedded import (
    BrokerClient,
    BrokerConfig,
    EmbeddedBroker,
    Message,
    Resolution,
    TransactionState,
)
from broker_embedded.errors import BrokerUnavailableError
from outbox import BrokerUnavailable, ConfigurationError, Producer
from outbox.integrations.django.conf import outbox_settings, producer
from outbox.integrations.django.models import TransactionLog
from outbox.integrations.django.recorder import fenced_answer
from outbox.integrations.django.transactional import current_transaction_id, transactional_message
from tests.django.shop.models import Account
from tests.django.support import PENDING_URL, admin_client, eventually, park
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_broker_down_at_half_means_the_function_does_not_run(alias) -> None:
    down = Producer(BrokerClient(f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=1), "shop")
    ran: list[str] = []

    @transactional_message(topic="order.paid", using=alias, producer=down)
    def pay(name: str) -> None:
        ran.append(name)

    with pytest.raises(BrokerUnavailable):
        pay("alice")
    assert ran == [] and not TransactionLog.objects.using(alias).exists()


class _FailingEnd:
    """The real broker whose END_TRANSACTION link drops (the network, not the broker)."""

    def __init__(self, broker: object) -> None:
        self._broker = broker

    def __getattr__(self, name: str) -> object:
        return getattr(self._broker, name)

    def end_transaction(self, *args: object, **kwargs: object) -> None:
        raise BrokerUnavailableError("connection reset")


def test_broker_down_at_end_succeeds_warns_and_check_back_commits(alias, caplog) -> None:
    flaky = Producer(_FailingEnd(producer().broker), "shop")  # type: ignore[arg-type]

    @transactional_message(topic="order.paid", using=alias, producer=flaky)
    def pay(name: str) -> str:
        Account.objects.using(alias).filter(name=name).update(balance=1)
        return current_transaction_id() or ""

    with caplog.at_level(logging.WARNING, logger="outbox"):
        tx = pay("alice")
    assert "check-back will resolve it" in caplog.text
    assert Account.objects.using(alias).get(name="alice").balance == 1
    assert producer().broker.transaction_state(tx) is TransactionState.PENDING
    out = io.StringIO()
    call_command("outbox_check", tx, "--database", alias, "--send", stdout=out)
    assert out.getvalue().strip() == "commit"
    assert producer().broker.transaction_state(tx) is TransactionState.COMMITTED


def test_database_failure_sends_rollback_and_raises(alias) -> None:
    seen: list[str] = []

    @transactional_message(topic="order.paid", using=alias)
    def open_account(name: str) -> None:
        seen.append(current_transaction_id() or "")
        Account.objects.using(alias).create(name=name, balance=0)

    with pytest.raises(IntegrityError):
        open_account("alice")  # the name is taken
    assert producer().broker.transaction_state(seen[0]) is TransactionState.ROLLED_BACK
    assert not TransactionLog.objects.using(alias).exists()


def test_outer_rollback_then_check_back_sends_rollback(alias) -> None:
    from django.db import transaction

    @transactional_message(topic="order.paid", using=alias)
    def pay(name: str) -> str:
        return current_transaction_id() or ""

    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        tx = pay("alice")
        raise RuntimeError("outer failure")
    call_command("outbox_check", tx, "--database", alias, "--send", stdout=io.StringIO())
    assert producer().broker.transaction_state(tx) is TransactionState.ROLLED_BACK
    assert TransactionLog.objects.using(alias).get(pk=tx).state == TransactionLog.ROLLED_BACK


def test_lock_timeout_answers_unknown_and_the_next_check_is_final(alias) -> None:
    answers: list[Resolution] = []

    @transactional_message(topic="order.paid", using=alias)
    def pay(name: str) -> str:
        tx = current_transaction_id() or ""
        answers.append(fenced_answer(tx, using=alias, lock_timeout_ms=300))  # another connection
        return tx

    tx = pay("alice")
    assert answers == [Resolution.UNKNOWN]
    assert fenced_answer(tx, using=alias) is Resolution.COMMIT


@pytest.mark.parametrize("bad", [
    {"CHECK_LOCK_TIMEOUT_MS": 0},
    {"CHECK_LOCK_TIMEOUT_MS": "2000"},
    {"PRODUCER_GROUP": ""},
    {"BROKER_URL": "http://example.com"},
    {"BROKER_URLS": "tcp://127.0.0.1:1"},
])
def test_bad_settings_are_improperly_configured(bad) -> None:
    with override_settings(OUTBOX=bad), pytest.raises(ImproperlyConfigured):
        outbox_settings()


@pytest.fixture
def parked(tmp_path: Path, alias: str) -> Iterator[tuple[str, str]]:
    """Two parked transactions of group ``shop``: one whose row says COMMITTED, one with
    no row; the app's broker is switched to that data directory for the test."""
    committed, absent = uuid.uuid4().hex, uuid.uuid4().hex
    TransactionLog.objects.using(alias).create(transaction_id=committed, producer_group="shop",
                                               state=TransactionLog.COMMITTED, created_at=_now())
    park(tmp_path / "broker", {committed: "shop", absent: "shop"})
    with override_settings(OUTBOX={"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop"}):
        yield committed, absent


def _now():  # type: ignore[no-untyped-def]
    from django.utils import timezone

    return timezone.now()


def test_parked_transactions_resolve_by_the_transaction_log_from_the_admin(parked, alias) -> None:
    committed, absent = parked
    client = admin_client()
    url = PENDING_URL
    page = client.get(url).content.decode()
    assert committed in page and absent in page
    if alias != "default":
        return  # the admin resolves on the default database; the command takes --database
    response = client.post(url, {"resolve": committed}, follow=True)
    assert f"Transaction {committed}: committed" in response.content.decode()
    response = client.post(url, {"resolve": absent}, follow=True)
    assert f"Transaction {absent}: rolled_back" in response.content.decode()
    assert producer().broker.transaction_state(committed) is TransactionState.COMMITTED
    assert producer().broker.transaction_state(absent) is TransactionState.ROLLED_BACK
    assert TransactionLog.objects.get(pk=absent).state == TransactionLog.ROLLED_BACK


def test_parked_commands_list_and_resolve(parked, alias) -> None:
    committed, absent = parked
    out = io.StringIO()
    call_command("outbox_parked", stdout=out)
    assert committed in out.getvalue() and "2 parked" in out.getvalue()
    for tx, state in ((committed, "committed"), (absent, "rolled_back")):
        out = io.StringIO()
        call_command("outbox_resolve", tx, "--database", alias, stdout=out)
        assert out.getvalue().strip() == state
    with pytest.raises(CommandError):
        call_command("outbox_resolve", committed, "--database", alias, stdout=io.StringIO())
    assert TransactionLog.objects.using(alias).get(pk=absent).state == TransactionLog.ROLLED_BACK


@pytest.mark.slow
def test_outbox_consume_command_handles_each_message_once_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "HALFMOON_DJANGO_TEST_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tests.django.settings"}
    env.pop("HALFMOON_DJANGO_PG_NAME", None)
    manage = [sys.executable, "-m", "django"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    broker = EmbeddedBroker(tmp_path / "broker")
    for amount in (10, 20, 30):
        broker.send(Message("order.paid", f'{{"name": "alice", "amount": {amount}}}'.encode()))
    broker.close()
    consumer = subprocess.Popen(
        [*manage, "outbox_consume", "--group", "member", "--topic", "order.paid",
         "--handler", "tests.django.shop.handlers:award_points"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def points() -> list[int]:
            with sqlite3.connect(tmp_path / "default.sqlite3") as db:
                return sorted(row[0] for row in db.execute("SELECT points FROM shop_points"))

        try:
            eventually(lambda: points() == [10, 20, 30] or consumer.poll() is not None, timeout_s=60)
        except AssertionError:
            consumer.kill()
            raise AssertionError(f"points {points()}; consumer said {consumer.communicate()}") from None
        assert points() == [10, 20, 30], consumer.communicate()
        consumer.send_signal(signal.SIGTERM)
        out, err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 0, err
    assert "stopped after 3 messages" in out
    with sqlite3.connect(tmp_path / "default.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM outbox_consumed_message").fetchone() == (3,)


def test_the_app_answers_its_own_check_backs(tmp_path: Path, alias) -> None:
    """END lost after a commit, and an outer rollback: the broker's check-backs, answered
    in-process by ``answer_check_backs``, commit the first and roll back the second."""
    from django.db import transaction

    from outbox.integrations.django.resolve import answer_check_backs

    config = BrokerConfig(transaction_timeout_s=0.2, check_interval_s=0.2, check_max=50, service_tick_s=0.02)
    broker = EmbeddedBroker(tmp_path / "broker", config=config)
    try:
        sender = Producer(broker, "shop")
        stop = answer_check_backs(alias, sender)

        @transactional_message(topic="order.paid", using=alias, producer=Producer(_FailingEnd(broker), "shop"))  # type: ignore[arg-type]
        def pay(name: str) -> str:
            return current_transaction_id() or ""

        committed = pay("alice")
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            rolled_back = pay("alice")
            raise RuntimeError("outer failure")
        eventually(lambda: broker.transaction_state(committed) is TransactionState.COMMITTED)
        eventually(lambda: broker.transaction_state(rolled_back) is TransactionState.ROLLED_BACK)
        stop()
    finally:
        broker.close()


@pytest.mark.parametrize("handler", ["tests.django.shop.handlers", "tests.django.shop.handlers:nothing",
                                     "no.such.module:award_points"])
def test_outbox_consume_rejects_a_bad_handler(handler: str) -> None:
    with pytest.raises(CommandError, match="handler"):
        call_command("outbox_consume", "--group", "member", "--topic", "order.paid", "--handler", handler)


def test_an_in_memory_sqlite_database_cannot_be_checked(monkeypatch) -> None:
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES, "memory", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    with pytest.raises(ConfigurationError, match="memory"):
        fenced_answer("tx-memory", using="memory")


def test_admin_transaction_log_search_and_filters(alias) -> None:
    if alias != "default":
        pytest.skip("the admin reads the default database")

    @transactional_message(topic="order.paid")
    def pay(name: str) -> str:
        return current_transaction_id() or ""

    first, second = pay("alice"), pay("alice")
    client = admin_client()
    url = "/admin/halfmoon_outbox/transactionlog/"
    found = client.get(url, {"q": first}).content.decode()
    assert first in found and second not in found
    assert second in client.get(url, {"state__exact": "COMMITTED", "producer_group": "shop"}).content.decode()
    assert second not in client.get(url, {"state__exact": "ROLLED_BACK"}).content.decode()
