"""The project's producer answers its group's check-backs through the fence, with no Celery
worker: started in the background when the app is ready (a restarted web process answers
before its first call), and in the process whose outer ``atomic`` rolled back."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

from broker_embedded import BrokerClient, Message, TransactionState
from outbox.integrations.django.conf import producer, start_answering_check_backs
from outbox.integrations.django.models import TransactionLog
from outbox.integrations.django.recorder import record_committed
from outbox.integrations.django.transactional import current_transaction_id, transactional_message
from tests.django.support import eventually
from tests.outbox.async_support import tcp_broker


def test_the_projects_producer_answers_its_groups_check_backs(tmp_path: Path, alias: str) -> None:
    server = tcp_broker(tmp_path / "broker", check_after_s=0.3)
    try:
        with BrokerClient(server.url) as client:
            for tx in ("committed-1", "absent-1"):  # as a crashed process of the group left them
                client.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id=tx)
            with transaction.atomic(using=alias):
                record_committed(alias, "committed-1", "shop")

            outbox = {"BROKER_URL": server.url, "PRODUCER_GROUP": "shop", "PRODUCER_GROUPS": {"shop": alias}}
            with override_settings(OUTBOX=outbox):
                start_answering_check_backs()  # what the app's ready() does: no call needed
                eventually(lambda: client.transaction_state("committed-1") is TransactionState.COMMITTED)
                eventually(lambda: client.transaction_state("absent-1") is TransactionState.ROLLED_BACK)
                assert TransactionLog.objects.using(alias).get(pk="absent-1").state == TransactionLog.ROLLED_BACK

                @transactional_message(topic="order.paid", using=alias)
                def pay(name: str) -> str:
                    return current_transaction_id() or ""

                with pytest.raises(RuntimeError), transaction.atomic(using=alias):
                    rolled_back = pay("alice")
                    raise RuntimeError("the outer transaction fails after the call")
                assert producer().answers_check_backs
                eventually(lambda: client.transaction_state(rolled_back) is TransactionState.ROLLED_BACK)
    finally:
        server.stop()


def test_answer_check_backs_false_leaves_them_to_celery(tmp_path: Path) -> None:
    with override_settings(OUTBOX={"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop",
                                   "ANSWER_CHECK_BACKS": False}):
        assert not producer().answers_check_backs
