"""``@transactional_message`` on ``async def`` views and services, and ``asend``: through
Django's ``AsyncClient`` (the ASGI handler) and called directly, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
from django.conf import settings
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, override_settings
from django.urls import path

from broker_embedded import Message, ReceivedMessage, TransactionState
from outbox import message_json
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import TransactionLog
from outbox.integrations.django.transactional import (
    asend,
    current_transaction_id,
    transactional_message,
)
from tests.django.shop.models import Account, Points
from tests.django.support import eventually

TOPIC = f"async.paid.{uuid.uuid4().hex[:8]}"
RECEIPTS = f"async.receipt.{uuid.uuid4().hex[:8]}"


def paying_view(alias: str) -> Callable[..., Awaitable[JsonResponse]]:
    """An async view that is itself the transactional function."""

    @transactional_message(topic=TOPIC, body=lambda request, name, amount: {"name": name, "amount": amount},
                           using=alias)
    async def pay(request: HttpRequest, name: str, amount: int) -> JsonResponse:
        updated = await Account.objects.using(alias).filter(name=name, balance__gte=amount).aupdate(
            balance=F("balance") - amount)
        await Points.objects.using(alias).acreate(account=name, points=amount)
        if not updated:
            raise ValueError("insufficient balance")
        await asend(Message(RECEIPTS, f'{{"name": "{name}"}}'.encode()))
        return JsonResponse({"transaction_id": current_transaction_id()})

    return pay


urlpatterns = [path(f"{alias}/pay/<str:name>/<int:amount>", paying_view(alias)) for alias in settings.DATABASES]


def paying_service(alias: str, entered: asyncio.Event | None = None) -> Callable[..., Awaitable[str]]:
    """An async service; with ``entered``, it signals after its write and then hangs."""

    @transactional_message(topic=TOPIC, using=alias)
    async def pay(name: str, amount: int) -> str:
        await Account.objects.using(alias).filter(name=name).aupdate(balance=F("balance") - amount)
        if entered is not None:
            entered.set()
            await asyncio.sleep(3600)
        return current_transaction_id() or ""

    return pay


def drain(topic: str) -> list[ReceivedMessage]:
    broker, got = producer().broker, []
    while batch := broker.receive("async-tests", topic, max_messages=32, wait_s=0.3):
        got.extend(batch)
        for received in batch:
            broker.ack("async-tests", received.receipt_handle)
    return got


def balance(alias: str) -> int:
    return Account.objects.using(alias).get(name="alice").balance


def test_an_async_view_commits_its_writes_and_messages(alias: str) -> None:
    with override_settings(ROOT_URLCONF=__name__):
        response = asyncio.run(AsyncClient().post(f"/{alias}/pay/alice/100"))
    assert response.status_code == 200
    transaction_id = response.json()["transaction_id"]
    assert producer().broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    assert TransactionLog.objects.using(alias).get(pk=transaction_id).state == TransactionLog.COMMITTED
    assert balance(alias) == 400 and Points.objects.using(alias).count() == 1
    paid, receipts = drain(TOPIC), drain(RECEIPTS)
    assert [message_json(r.message) for r in paid] == [{"name": "alice", "amount": 100}]
    assert [message_json(r.message) for r in receipts] == [{"name": "alice"}]
    assert paid[0].transaction_id == receipts[0].transaction_id == transaction_id


def test_an_async_view_that_raises_rolls_everything_back(alias: str) -> None:
    with override_settings(ROOT_URLCONF=__name__), pytest.raises(ValueError, match="insufficient"):
        asyncio.run(AsyncClient().post(f"/{alias}/pay/alice/10000"))
    # Its ORM calls ran inside the transaction: the Points row it created is gone too.
    assert balance(alias) == 500 and not Points.objects.using(alias).exists()
    assert not TransactionLog.objects.using(alias).exists()
    assert drain(TOPIC) == [] and drain(RECEIPTS) == []


def test_concurrent_async_calls_each_commit_once(alias: str) -> None:
    pay = paying_service(alias)

    async def both() -> list[str]:
        return list(await asyncio.gather(pay("alice", 100), pay("alice", 50)))

    transaction_ids = asyncio.run(both())
    assert len(set(transaction_ids)) == 2 and balance(alias) == 350
    for transaction_id in transaction_ids:
        assert producer().broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    assert sorted(r.transaction_id or "" for r in drain(TOPIC)) == sorted(transaction_ids)


def test_cancelling_an_async_call_rolls_it_back(alias: str) -> None:
    entered = asyncio.Event()
    pay = paying_service(alias, entered)

    async def cancelled() -> None:
        call = asyncio.ensure_future(pay("alice", 100))
        await asyncio.wait_for(entered.wait(), 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(cancelled())
    eventually(lambda: not TransactionLog.objects.using(alias).exists() and balance(alias) == 500)
    assert drain(TOPIC) == []


def test_asend_outside_a_transactional_call_is_refused() -> None:
    from outbox import OutboxError

    with pytest.raises(OutboxError, match="inside @transactional_message"):
        asyncio.run(asend(Message(RECEIPTS, b"{}")))
