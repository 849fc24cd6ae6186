"""The Django app: decorator, nesting, fencing, consumer, admin, commands, migrations."""

from __future__ import annotations

import io
import threading
import uuid

import pytest
from django.core.management import call_command
from django.db import transaction
from django.db.models import F
from django.test import Client

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.broker.export import transaction_states
from outbox import BodyNotSerializableError, TransactionFencedError, message_json
from outbox.integrations.django.conf import producer
from outbox.integrations.django.consumer import idempotent_consumer
from outbox.integrations.django.models import ConsumedMessage, TransactionLog
from outbox.integrations.django.recorder import fenced_answer
from outbox.integrations.django.transactional import (
    current_transaction_id,
    send,
    transactional_message,
)
from tests.django.shop.models import Account, Points


def broker():
    return producer().broker


def drain(group: str, topic: str) -> list:
    got = []
    while batch := broker().receive(group, topic, max_messages=32, wait_s=0.3):
        got.extend(batch)
        for received in batch:
            broker().ack(group, received.receipt_handle)
    return got


def make_pay(alias: str, topic: str = "order.paid"):
    @transactional_message(topic=topic, body=lambda name, amount, **_: {"name": name, "amount": amount},
                           using=alias)
    def pay(name: str, amount: int, fail: bool = False) -> str:
        updated = Account.objects.using(alias).filter(name=name, balance__gte=amount).update(
            balance=F("balance") - amount)
        if fail or not updated:
            raise ValueError("insufficient balance")
        return current_transaction_id() or ""

    return pay


def test_decorator_commits_with_the_transaction(alias) -> None:
    topic = f"paid.{uuid.uuid4().hex}"
    tx = make_pay(alias, topic)("alice", 100)
    assert broker().transaction_state(tx) is TransactionState.COMMITTED
    assert TransactionLog.objects.using(alias).get(pk=tx).state == TransactionLog.COMMITTED
    got = drain("points", topic)
    assert [message_json(r.message) for r in got] == [{"name": "alice", "amount": 100}]
    assert got[0].transaction_id == tx


def test_failure_rolls_back_and_sends_rollback(alias) -> None:
    pay = make_pay(alias)
    with pytest.raises(ValueError):
        pay("alice", 10_000)
    assert Account.objects.using(alias).get(name="alice").balance == 500
    assert not TransactionLog.objects.using(alias).exists()
    states = {state for state, _ in transaction_states(broker()).values()}  # type: ignore[arg-type]
    assert TransactionState.ROLLED_BACK in states


def test_unserialisable_body_sends_nothing(alias) -> None:
    @transactional_message(topic="order.paid", using=alias)
    def pay(when: object) -> None:
        raise AssertionError("must not run")

    before = len(transaction_states(broker()))  # type: ignore[arg-type]
    with pytest.raises(BodyNotSerializableError):
        pay(object())
    assert len(transaction_states(broker())) == before  # type: ignore[arg-type]


def test_commit_waits_for_the_outermost_atomic(alias) -> None:
    pay = make_pay(alias)
    with transaction.atomic(using=alias):
        tx = pay("alice", 50)
        assert broker().transaction_state(tx) is TransactionState.PENDING
    assert broker().transaction_state(tx) is TransactionState.COMMITTED


def test_outer_rollback_is_resolved_by_check_back_as_rollback(alias) -> None:
    pay = make_pay(alias)
    with pytest.raises(RuntimeError):
        with transaction.atomic(using=alias):
            tx = pay("alice", 50)
            raise RuntimeError("the outer transaction fails after the call")
    assert broker().transaction_state(tx) is TransactionState.PENDING
    assert fenced_answer(tx, using=alias) is Resolution.ROLLBACK
    assert Account.objects.using(alias).get(name="alice").balance == 500
    broker().end_transaction(tx, Resolution.ROLLBACK, producer_group="shop", from_check=True)  # as the checker does


def test_several_messages_share_one_transaction(alias) -> None:
    @transactional_message(topic="order.paid", using=alias)
    def pay(name: str) -> str:
        send(Message("order.shipped", b"{}"))
        return current_transaction_id() or ""

    tx = pay("alice")
    result = broker().end_transaction(tx, Resolution.COMMIT, producer_group="shop")
    assert len(result.message_ids) == 2 and result.state is TransactionState.COMMITTED and not result.applied


def test_a_fenced_transaction_cannot_commit(alias, monkeypatch) -> None:
    fixed = "fenced-" + alias
    monkeypatch.setattr("outbox.integrations.django.transactional.new_transaction_id", lambda: fixed)
    assert fenced_answer(fixed, using=alias) is Resolution.ROLLBACK  # the checker came first
    with pytest.raises(TransactionFencedError):
        make_pay(alias)("alice", 10)
    assert Account.objects.using(alias).get(name="alice").balance == 500


def test_check_during_a_running_transaction_waits_for_its_commit(alias) -> None:
    answers: list[Resolution] = []
    started = threading.Event()

    @transactional_message(topic="order.paid", using=alias)
    def slow(name: str) -> str:
        tx = current_transaction_id() or ""
        threading.Thread(target=lambda: (started.set(), answers.append(fenced_answer(tx, using=alias)))).start()
        started.wait()
        threading.Event().wait(0.5)
        assert not answers, "the check must wait for this transaction"
        return tx

    slow("alice")
    for _ in range(100):
        if answers:
            break
        threading.Event().wait(0.1)
    assert answers == [Resolution.COMMIT]


def test_idempotent_consumer_awards_points_once(alias) -> None:
    group, topic = "member", f"paid.{uuid.uuid4().hex}"

    @idempotent_consumer(group, using=alias)
    def award(received) -> None:
        body = message_json(received.message)
        Points.objects.using(alias).create(account=body["name"], points=body["amount"])

    make_pay(alias, topic)("alice", 70)
    first = broker().receive(group, topic, max_messages=1, invisible_duration_s=0.05, wait_s=2)[0]
    assert award(first) is True  # ...and the consumer dies before acking
    second = broker().receive(group, topic, max_messages=1, wait_s=2)[0]
    assert second.delivery_attempt == 2 and award(second) is False
    broker().ack(group, second.receipt_handle)
    assert list(Points.objects.using(alias).values_list("points", flat=True)) == [70]
    assert ConsumedMessage.objects.using(alias).count() == 1


def test_makemigrations_finds_nothing() -> None:
    call_command("makemigrations", "halfmoon_outbox", "--check", "--dry-run", verbosity=0)


def test_admin_pages_render(alias) -> None:
    from django.contrib.auth.models import User

    make_pay(alias)("alice", 1)
    User.objects.filter(username="admin").delete()
    User.objects.create_superuser("admin", "a@example.com", "pw")
    client = Client()
    assert client.login(username="admin", password="pw")
    for url in ("/admin/halfmoon_outbox/transactionlog/", "/admin/halfmoon_outbox/consumedmessage/",
                "/admin/halfmoon_outbox/pendingtransaction/"):
        response = client.get(url)
        assert response.status_code == 200, url
    assert b"Pending and parked transactions" in client.get("/admin/halfmoon_outbox/pendingtransaction/").content


def test_management_commands(alias) -> None:
    out = io.StringIO()
    call_command("outbox_parked", stdout=out)
    assert "parked" in out.getvalue()
    out = io.StringIO()
    call_command("outbox_check", "never-started", "--database", alias, stdout=out)
    assert out.getvalue().strip() == "rollback"


def test_decorator_options_match_the_sqlalchemy_decorator(alias) -> None:
    """message_group, delay_level, transaction_timeout_s, properties and fixed keys (issue 11
    item 9), and ordinary values in the default body through DjangoJSONEncoder (item 8)."""
    import datetime
    from decimal import Decimal

    import outbox

    topic = f"paid.{uuid.uuid4().hex}"
    seen: list[str | None] = []

    @transactional_message(topic=topic, keys=["orders"], tag="paid", message_group=lambda name, amount, at: name,
                           delay_level=1, transaction_timeout_s=30.0, properties={"currency": "EUR"},
                           using=alias)
    def pay(name: str, amount: Decimal, at: datetime.datetime) -> str:
        seen.append(outbox.current_transaction_id())
        return current_transaction_id() or ""

    tx = pay("alice", Decimal("9.90"), datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC))
    assert seen == [tx] and outbox.current_transaction_id() is None
    got: list = []
    for _ in range(60):
        got += drain("points", topic)
        if got:
            break
    (paid,) = got
    assert message_json(paid.message) == {"name": "alice", "amount": "9.90", "at": "2026-01-02T03:04:05.678Z"}
    assert (paid.message.keys, paid.message.tag, paid.message.message_group, dict(paid.message.properties)) == (
        ("orders",), "paid", "alice", {"currency": "EUR"})
    assert paid.store_timestamp_ms - paid.born_timestamp_ms >= 1000  # delay level 1, from the commit


def test_decorator_takes_an_encoder_and_refuses_bad_options(alias) -> None:
    import json

    from broker_embedded.errors import InvalidMessageError

    class Upper(json.JSONEncoder):
        def default(self, o: object) -> object:
            return str(o).upper() if isinstance(o, uuid.UUID) else super().default(o)

    topic = f"paid.{uuid.uuid4().hex}"

    @transactional_message(topic=topic, encoder=Upper, keys=lambda ref: [ref.hex],
                           properties=lambda ref: {"version": str(ref.version)}, using=alias)
    def pay(ref: uuid.UUID) -> None:
        pass

    ref = uuid.UUID(int=10)
    pay(ref)
    (paid,) = drain("points", topic)
    assert message_json(paid.message) == {"ref": str(ref).upper()}
    assert (paid.message.keys, dict(paid.message.properties)) == ((ref.hex,), {"version": "None"})
    for bad in ({"delay_level": 19}, {"transaction_timeout_s": float("inf")}, {"keys": "one"}):
        with pytest.raises(InvalidMessageError):
            transactional_message(topic=topic, using=alias, **bad)  # type: ignore[arg-type]
    ran: list[str] = []

    @transactional_message(topic=topic, message_group=lambda group: group, using=alias)
    def grouped(group: str) -> None:
        ran.append(group)

    rows = TransactionLog.objects.using(alias).count()
    with pytest.raises(InvalidMessageError):
        grouped("two words")
    assert ran == [] and TransactionLog.objects.using(alias).count() == rows


def test_transaction_timeout_brings_the_first_check_back_forward(alias, tmp_path) -> None:
    from broker_embedded import BrokerConfig, EmbeddedBroker
    from broker_embedded.errors import BrokerUnavailableError
    from outbox import Producer

    broker = EmbeddedBroker(tmp_path / "broker", BrokerConfig(transaction_timeout_s=3600))
    checked = threading.Event()
    broker.register_producer("shop", lambda request: checked.set())

    class DroppedEnd:
        def __getattr__(self, name: str) -> object:
            return getattr(broker, name)

        def end_transaction(self, *args: object, **kwargs: object) -> None:
            raise BrokerUnavailableError("connection reset")

    try:
        @transactional_message(topic="order.paid", transaction_timeout_s=0.2, using=alias,
                               producer=Producer(DroppedEnd(), "shop"))  # type: ignore[arg-type]
        def pay(name: str) -> None:
            pass

        pay("alice")
        assert checked.wait(60)
    finally:
        broker.close()


@pytest.fixture
def without_table(alias):
    """``alias`` with one framework table renamed away for the test."""
    from django.db import connections

    renamed: list[str] = []

    def rename(table: str) -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
        renamed.append(table)

    yield rename
    for table in renamed:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")


def test_missing_tables_name_the_migration(alias, without_table) -> None:
    from outbox import SchemaMissingError

    without_table("outbox_transaction_log")
    pay = make_pay(alias)
    with pytest.raises(SchemaMissingError, match=f"outbox_transaction_log does not exist in database '{alias}'"
                                                 f".*: run `manage.py migrate halfmoon_outbox --database {alias}`"):
        pay("alice", 10)
    assert Account.objects.using(alias).get(name="alice").balance == 500
    with pytest.raises(SchemaMissingError, match="outbox_transaction_log does not exist"):
        fenced_answer("tx-1", using=alias)

    without_table("outbox_consumed_message")

    @idempotent_consumer("member", using=alias)
    def award(received) -> None:
        raise AssertionError("must not run")

    topic = f"paid.{uuid.uuid4().hex}"
    broker().send(Message(topic, b"{}"))
    (received,) = broker().receive("member", topic, wait_s=2)
    with pytest.raises(SchemaMissingError, match="outbox_consumed_message does not exist"):
        award(received)


def test_an_in_memory_sqlite_database_cannot_be_checked(monkeypatch) -> None:
    from django.conf import settings
    from django.db import connections

    from outbox import ConfigurationError

    monkeypatch.setitem(settings.DATABASES, "memory", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    monkeypatch.setitem(connections.settings, "memory", settings.DATABASES["memory"])
    with pytest.raises(ConfigurationError, match="memory"):
        fenced_answer("tx-1", using="memory")
