"""The admin's framework tables are read-only (no add, change, delete or bulk delete), and a
transaction log entry shows its broker state and messages and links to its consumptions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.test import Client
from django.utils import timezone

from broker_embedded import BrokerStats, EmbeddedBroker, Message, Resolution
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import ConsumedMessage, TransactionLog
from outbox.integrations.django.transactional import (
    current_transaction_id,
    send,
    transactional_message,
)
from tests.django.support import PENDING_URL, SilentChecker, admin_client, eventually

LOG_URL = "/admin/halfmoon_outbox/transactionlog/"
CONSUMED_URL = "/admin/halfmoon_outbox/consumedmessage/"


@dataclass(frozen=True)
class Paid:
    transaction_id: str
    audit_message_id: str
    consumed: ConsumedMessage  # consumed from this transaction
    unrelated: ConsumedMessage  # consumed from another one


def _consumed(transaction_id: str) -> ConsumedMessage:
    return ConsumedMessage.objects.create(consumer_group="member", message_id=uuid.uuid4().hex, topic="order.paid",
                                          transaction_id=transaction_id, consumed_at=timezone.now())


@pytest.fixture
def paid(django_project: bool) -> Iterator[Paid]:
    """A transaction of two messages on the default database (the one the admin reads)."""
    audit = Message("order.audit", b"{}")

    @transactional_message(topic="order.paid")
    def pay(name: str) -> str:
        send(audit)
        return current_transaction_id() or ""

    transaction_id = pay("alice")
    yield Paid(transaction_id, audit.message_id, _consumed(transaction_id), _consumed(uuid.uuid4().hex))


@pytest.fixture
def client(django_project: bool) -> Client:
    return admin_client()


def test_transaction_log_rows_cannot_be_added_changed_or_deleted(paid: Paid, client: Client) -> None:
    row = f"{LOG_URL}{paid.transaction_id}/"
    changelist = client.get(LOG_URL).content.decode()
    assert paid.transaction_id in changelist
    assert "delete_selected" not in changelist and f"{LOG_URL}add/" not in changelist
    assert client.get(f"{LOG_URL}add/").status_code == 403
    assert client.post(f"{LOG_URL}add/", {"transaction_id": "x", "producer_group": "shop",
                                          "state": "COMMITTED"}).status_code == 403
    assert client.get(f"{row}delete/").status_code == 403
    assert client.post(f"{row}delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{row}change/", {"state": TransactionLog.ROLLED_BACK}).status_code == 403
    client.post(LOG_URL, {"action": "delete_selected", "_selected_action": [paid.transaction_id], "post": "yes"})
    assert TransactionLog.objects.get(pk=paid.transaction_id).state == TransactionLog.COMMITTED


def test_consumed_message_rows_cannot_be_deleted(paid: Paid, client: Client) -> None:
    row = f"{CONSUMED_URL}{paid.consumed.pk}/"
    assert "delete_selected" not in client.get(CONSUMED_URL).content.decode()
    assert client.get(f"{row}delete/").status_code == 403
    assert client.post(f"{row}delete/", {"post": "yes"}).status_code == 403
    assert client.get(f"{CONSUMED_URL}add/").status_code == 403
    client.post(CONSUMED_URL, {"action": "delete_selected", "_selected_action": [paid.consumed.pk], "post": "yes"})
    assert ConsumedMessage.objects.filter(pk=paid.consumed.pk).exists()


def test_an_entry_shows_its_broker_state_and_messages(paid: Paid, client: Client) -> None:
    page = client.get(f"{LOG_URL}{paid.transaction_id}/change/").content.decode()
    assert "committed; messages:" in page
    assert f"halfmoon-broker query --id {paid.audit_message_id}" in page
    assert page.count("halfmoon-broker query --id") == 2  # order.paid and order.audit


def test_an_entry_the_broker_does_not_know_says_so(client: Client) -> None:
    unknown = uuid.uuid4().hex
    TransactionLog.objects.create(transaction_id=unknown, producer_group="shop", state=TransactionLog.ROLLED_BACK,
                                  created_at=timezone.now())
    page = client.get(f"{LOG_URL}{unknown}/change/").content.decode()
    assert "the broker did not say" in page and unknown in page


def test_an_entry_links_to_the_messages_consumed_from_it(paid: Paid, client: Client) -> None:
    link = f"{CONSUMED_URL}?transaction_id={paid.transaction_id}"
    assert f'href="{link}"' in client.get(f"{LOG_URL}{paid.transaction_id}/change/").content.decode()
    assert f'href="{link}"' in client.get(LOG_URL).content.decode()  # a column of the list too
    consumptions = client.get(link).content.decode()
    assert paid.consumed.message_id in consumptions and paid.unrelated.message_id not in consumptions


@pytest.mark.skipif("unanswered_check_groups" not in BrokerStats.__dataclass_fields__,
                    reason="the broker's stats do not report unanswered check-backs yet")
def test_the_pending_page_names_a_group_whose_checks_go_unanswered(client: Client) -> None:
    broker = producer().broker
    assert isinstance(broker, EmbeddedBroker)
    broker.set_checker(SilentChecker())  # for a group with no producer: this project's answers its own
    transaction_id = uuid.uuid4().hex
    try:
        broker.send_half(Message("order.paid", b"{}", transaction_timeout_s=0.1), producer_group="ledger",
                         transaction_id=transaction_id)
        eventually(lambda: "ledger" in getattr(broker.stats(), "unanswered_check_groups", {}))
        page = client.get(PENDING_URL).content.decode()
    finally:
        broker.set_checker(broker.producers)
        broker.end_transaction(transaction_id, Resolution.ROLLBACK, producer_group="ledger")
    assert "Producer group <b>ledger</b>: the oldest unanswered check is" in page
