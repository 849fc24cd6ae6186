"""``OUTBOX["ON_BROKER_DOWN"] = "store"``: a decorated call whose broker is not running
commits with its messages in ``outbox_stored_message``; ``"raise"`` (the default) fails
it and commits nothing. On SQLite and PostgreSQL; the broker down is a TCP port nothing
listens on, or a broker server process SIGKILLed while the shop runs."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from broker_embedded import EmbeddedBroker, Message, TransactionState
from broker_embedded.errors import UnknownTransactionError
from outbox import BrokerUnavailableError
from outbox.integrations.django.backlog import project_backlog, stored_backlog
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import StoredMessage, TransactionLog
from outbox.integrations.django.retention import purge_project
from outbox.integrations.django.transactional import (
    asend,
    current_transaction_id,
    send,
    transactional_message,
)
from outbox.retention import PurgeOptions
from outbox.schema import STORED_MESSAGE, TRANSACTION_LOG
from outbox.stored import decode, encode
from tests.django.shop.models import Account
from tests.django.support import PENDING_URL, admin_client, eventually
from tests.ports import free_port
from tests.server.conftest import ServerProcess

STORED_URL = "/admin/halfmoon_outbox/storedmessage/"
ROOT = Path(__file__).resolve().parents[2]

TOPIC = f"stored.paid.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store_alias(alias: str) -> Iterator[str]:
    """``alias`` without stored messages, before and after (other tests count them)."""
    StoredMessage.objects.using(alias).all().delete()
    yield alias
    StoredMessage.objects.using(alias).all().delete()


def broker_down(mode: str | None = "store") -> Any:
    """``OUTBOX`` with a broker that is not running (and ``ON_BROKER_DOWN`` if given)."""
    outbox = {**settings.OUTBOX, "BROKER_URL": f"tcp://127.0.0.1:{free_port()}"}
    if mode is not None:
        outbox["ON_BROKER_DOWN"] = mode
    return override_settings(OUTBOX=outbox)


def make_pay(alias: str, message_group: str | None = None):
    @transactional_message(topic=TOPIC, using=alias, keys=lambda name, amount, **_: [f"order-{name}"],
                           message_group=message_group, properties={"source": "shop"})
    def pay(name: str, amount: int, fail: bool = False, more: int = 0) -> str:
        Account.objects.using(alias).filter(name=name).update(balance=F("balance") - amount)
        for n in range(more):
            send(Message(f"{TOPIC}.receipt", f"receipt {n}".encode(), tag="receipt"))
        if fail:
            raise ValueError("refused")
        return current_transaction_id() or ""

    return pay


def balance(alias: str) -> int:
    return Account.objects.using(alias).get(name="alice").balance


def stored(alias: str) -> list[StoredMessage]:
    return list(StoredMessage.objects.using(alias).order_by("seq"))


def test_store_mode_commits_the_call_with_its_message_stored(store_alias: str) -> None:
    with broker_down():
        assert producer().broker_down.mode == "store"
        tx = make_pay(store_alias)("alice", 100)
    assert balance(store_alias) == 400
    assert TransactionLog.objects.using(store_alias).get(pk=tx).state == TransactionLog.COMMITTED
    (row,) = stored(store_alias)
    message = decode(bytes(row.message))
    assert (row.transaction_id, row.producer_group, row.topic, row.message_group, row.relayed_at) == (
        tx, "shop", TOPIC, None, None)
    assert row.message_id == message.message_id and row.created_at is not None
    assert (message.topic, message.keys, message.properties) == (TOPIC, ("order-alice",), {"source": "shop"})
    assert b'"name":"alice"' in message.body.replace(b" ", b"")


def test_calls_after_the_broker_is_killed_are_stored(store_alias: str, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker").start()
    try:
        with override_settings(OUTBOX={**settings.OUTBOX, "BROKER_URL": server.url, "ON_BROKER_DOWN": "store"}):
            before = make_pay(store_alias)("alice", 1)
            producer().flush()  # its oneway END
            assert producer().broker.transaction_state(before) is TransactionState.COMMITTED
            server.kill()  # SIGKILL
            after = [make_pay(store_alias)("alice", 2) for _ in range(3)]
    finally:
        server.kill()
    assert balance(store_alias) == 500 - 1 - 3 * 2
    assert [row.transaction_id for row in stored(store_alias)] == after
    assert TransactionLog.objects.using(store_alias).filter(state=TransactionLog.COMMITTED).count() == 4


def test_raise_mode_raises_and_commits_nothing(store_alias: str) -> None:
    with broker_down(None), pytest.raises(BrokerUnavailableError):
        make_pay(store_alias)("alice", 100)
    assert balance(store_alias) == 500
    assert not TransactionLog.objects.using(store_alias).exists()
    assert not stored(store_alias)


def test_every_message_of_the_transaction_is_stored_in_order(store_alias: str) -> None:
    with broker_down():
        tx = make_pay(store_alias)("alice", 100, more=2)
    rows = stored(store_alias)
    assert [row.topic for row in rows] == [TOPIC, f"{TOPIC}.receipt", f"{TOPIC}.receipt"]
    assert {row.transaction_id for row in rows} == {tx}
    assert [decode(bytes(row.message)).body for row in rows[1:]] == [b"receipt 0", b"receipt 1"]


def test_a_function_that_raises_stores_nothing(store_alias: str) -> None:
    with broker_down(), pytest.raises(ValueError, match="refused"):
        make_pay(store_alias)("alice", 100, fail=True, more=1)
    assert balance(store_alias) == 500
    assert not TransactionLog.objects.using(store_alias).exists()
    assert not stored(store_alias)


def store_mode() -> Any:
    """``OUTBOX`` in store mode with the test broker (it is up); a fresh producer."""
    return override_settings(OUTBOX={**settings.OUTBOX, "ON_BROKER_DOWN": "store"})


def test_a_group_with_stored_messages_waiting_is_stored_until_they_are_relayed(store_alias: str) -> None:
    with broker_down():
        first = make_pay(store_alias, "alice")("alice", 1)
    with store_mode():  # the broker is back, the relay has not run yet
        behind = make_pay(store_alias, "alice")("alice", 2)
        with pytest.raises(UnknownTransactionError):
            producer().broker.transaction_state(behind)  # nothing of it reached the broker
    assert [(row.transaction_id, row.message_group) for row in stored(store_alias)] == [
        (first, "alice"), (behind, "alice")]
    StoredMessage.objects.using(store_alias).update(relayed_at=F("created_at"))  # the relay's work
    with store_mode():
        after = make_pay(store_alias, "alice")("alice", 4)
        assert producer().broker.transaction_state(after) is TransactionState.COMMITTED
    assert len(stored(store_alias)) == 2


def test_a_held_call_holds_the_messages_it_sends_after_too(store_alias: str) -> None:
    """Its first message held behind its group's waiting ones, the call stores all of its
    messages, so the later ones (of no group) must not reach the broker as half messages
    that no END would ever follow."""
    with broker_down():
        make_pay(store_alias, "alice")("alice", 1)
    with store_mode():
        behind = make_pay(store_alias, "alice")("alice", 2, more=1)
        with pytest.raises(UnknownTransactionError):
            producer().broker.transaction_state(behind)
    assert [row.topic for row in stored(store_alias) if row.transaction_id == behind] == [TOPIC, f"{TOPIC}.receipt"]


def test_other_groups_go_to_the_broker_while_one_group_waits(store_alias: str) -> None:
    with broker_down():
        make_pay(store_alias, "alice")("alice", 1)
    with store_mode():
        make_pay(store_alias, "alice")("alice", 2)  # held behind the first
        other = make_pay(store_alias, "bob")("alice", 3)
        assert producer().broker.transaction_state(other) is TransactionState.COMMITTED


def test_an_async_call_stores_its_messages(store_alias: str) -> None:
    @transactional_message(topic=TOPIC, using=store_alias)
    async def pay(name: str, amount: int) -> str:
        await Account.objects.using(store_alias).filter(name=name).aupdate(balance=F("balance") - amount)
        await asend(Message(f"{TOPIC}.receipt", b"receipt"))
        return current_transaction_id() or ""

    with broker_down():
        tx = asyncio.run(pay("alice", 100))
    assert balance(store_alias) == 400
    assert [(row.transaction_id, row.topic) for row in stored(store_alias)] == [
        (tx, TOPIC), (tx, f"{TOPIC}.receipt")]
    assert TransactionLog.objects.using(store_alias).get(pk=tx).state == TransactionLog.COMMITTED


def test_retention_deletes_old_relayed_stored_messages_and_keeps_waiting_ones(store_alias: str) -> None:
    with broker_down():
        for amount in (1, 2, 3):
            make_pay(store_alias)("alice", amount)
    old, recent, waiting = stored(store_alias)
    month_ago = timezone.now() - timedelta(days=30)
    StoredMessage.objects.using(store_alias).filter(seq=old.seq).update(created_at=month_ago, relayed_at=month_ago)
    StoredMessage.objects.using(store_alias).filter(seq=recent.seq).update(created_at=month_ago,
                                                                           relayed_at=timezone.now())
    StoredMessage.objects.using(store_alias).filter(seq=waiting.seq).update(created_at=month_ago)
    with override_settings(OUTBOX={**settings.OUTBOX, "PRODUCER_GROUPS": {"shop": store_alias}}):
        (report,) = purge_project(PurgeOptions(pause_s=0), aliases=[store_alias])
    assert report.rows()[STORED_MESSAGE] == 1
    assert [row.seq for row in stored(store_alias)] == [recent.seq, waiting.seq]


def _backlog_of_two(alias: str) -> None:
    """Two stored messages on ``alias``, the oldest stored an hour ago."""
    with broker_down():
        make_pay(alias)("alice", 1)
        make_pay(alias)("alice", 2)
    StoredMessage.objects.using(alias).filter(seq=stored(alias)[0].seq).update(
        created_at=timezone.now() - timedelta(hours=1))


def test_the_backlog_counts_the_waiting_messages_and_the_oldest_ones_age(store_alias: str) -> None:
    _backlog_of_two(store_alias)
    with override_settings(OUTBOX={**settings.OUTBOX, "PRODUCER_GROUPS": {"shop": store_alias}}):
        (backlog,) = project_backlog()
    assert (backlog.using, backlog.producer_group, backlog.waiting) == (store_alias, "shop", 2)
    assert 3590 < backlog.oldest_age_s < 3700
    StoredMessage.objects.using(store_alias).update(relayed_at=timezone.now())
    assert stored_backlog(store_alias) == []


def test_outbox_relay_status_prints_the_backlog(store_alias: str) -> None:
    pytest.importorskip("outbox.relay", reason="outbox.relay (the relay core) is not on this branch yet")
    _backlog_of_two(store_alias)
    out = io.StringIO()
    with override_settings(OUTBOX={**settings.OUTBOX, "PRODUCER_GROUPS": {"shop": store_alias}}):
        call_command("outbox_relay", "--status", stdout=out)
    assert f"{store_alias}\tshop\t2 waiting, the oldest 36" in out.getvalue()
    assert "2 stored messages waiting" in out.getvalue()


@pytest.mark.parametrize("alias", ["default"], indirect=True)  # the database the admin reads
def test_the_admin_lists_the_waiting_stored_messages_read_only(store_alias: str) -> None:
    _backlog_of_two(store_alias)
    client = admin_client()
    assert "<b>shop</b>: 2\n    stored messages waiting for the relay, the oldest 36" in client.get(PENDING_URL).content.decode()
    message_ids = [row.message_id for row in stored(store_alias)]
    listed = client.get(STORED_URL).content.decode()
    assert all(message_id in listed for message_id in message_ids)
    StoredMessage.objects.using(store_alias).update(relayed_at=timezone.now())
    listed = client.get(STORED_URL).content.decode()
    assert not any(message_id in listed for message_id in message_ids)  # only the unrelayed ones
    assert client.get(f"{STORED_URL}add/").status_code == 403


def test_without_overlap_a_half_the_broker_did_not_take_stores_the_call(store_alias: str) -> None:
    @transactional_message(topic=TOPIC, using=store_alias, overlap=False)
    def pay(name: str) -> str:
        send(Message(f"{TOPIC}.receipt", b"receipt"))
        return current_transaction_id() or ""

    with broker_down():
        tx = pay("alice")
    assert [(row.transaction_id, row.topic) for row in stored(store_alias)] == [
        (tx, TOPIC), (tx, f"{TOPIC}.receipt")]


STARTS_WHILE_THE_BROKER_IS_DOWN = """
import sys, django
from django.conf import settings
from django.core.management import call_command
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
                   INSTALLED_APPS=["outbox.integrations.django"], USE_TZ=True,
                   OUTBOX={"BROKER_URL": sys.argv[2], "PRODUCER_GROUP": "shop", "ON_BROKER_DOWN": "store"})
django.setup()
call_command("migrate", verbosity=0)
from outbox.integrations.django.models import StoredMessage, TransactionLog
from outbox.integrations.django.transactional import transactional_message
pay = transactional_message(topic="order.paid")(lambda name: name)
print(pay("alice"), StoredMessage.objects.count(), TransactionLog.objects.get().state)
"""


def test_a_process_that_starts_while_the_broker_is_down_takes_calls(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", STARTS_WHILE_THE_BROKER_IS_DOWN, str(tmp_path / "app.sqlite3"),
                           f"tcp://127.0.0.1:{free_port()}"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["alice", "1", "COMMITTED"]


@pytest.mark.slow
def test_outbox_relay_hands_the_stored_messages_to_the_broker_in_order_and_stops_on_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("outbox.relay", reason="outbox.relay (the relay core) is not on this branch yet")
    env = {**os.environ, "HALFMOON_DJANGO_TEST_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tests.django.settings"}
    env.pop("HALFMOON_DJANGO_PG_NAME", None)
    manage, database = [sys.executable, "-m", "django"], tmp_path / "default.sqlite3"
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    messages = [Message(TOPIC, f"order {n}".encode(), message_group="alice") for n in range(3)]
    with sqlite3.connect(database) as db:  # what three calls stored while the broker was down
        for n, message in enumerate(messages):
            db.execute(f"INSERT INTO {TRANSACTION_LOG} (transaction_id, producer_group, state, created_at) "
                       "VALUES (?, 'shop', 'COMMITTED', '2026-01-01 00:00:00.000000')", (f"tx-{n}",))
            db.execute(f"INSERT INTO {STORED_MESSAGE} (message_id, transaction_id, producer_group, topic, "
                       "message_group, message, created_at) VALUES (?, ?, 'shop', ?, 'alice', ?, "
                       "'2026-01-01 00:00:00.000000')", (message.message_id, f"tx-{n}", TOPIC, encode(message)))

    def waiting() -> int:
        with sqlite3.connect(database) as db:
            return int(db.execute(f"SELECT count(*) FROM {STORED_MESSAGE} WHERE relayed_at IS NULL").fetchone()[0])

    relay = subprocess.Popen([*manage, "outbox_relay"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        eventually(lambda: waiting() == 0 or relay.poll() is not None, timeout_s=60)
        assert waiting() == 0, relay.communicate(timeout=10) if relay.poll() is not None else "still waiting"
        relay.send_signal(signal.SIGTERM)
        out, err = relay.communicate(timeout=60)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
    assert relay.returncode == 0, err
    assert "stopped relaying from default" in out
    broker, bodies = EmbeddedBroker(tmp_path / "broker"), []
    try:
        while batch := broker.receive("relayed", TOPIC, max_messages=10, wait_s=1.0):  # one group: one at a time
            for received in batch:
                bodies.append(received.message.body)
                broker.ack("relayed", received.receipt_handle)
    finally:
        broker.close()
    assert bodies == [b"order 0", b"order 1", b"order 2"]
