"""Parked transactions of several producer groups on one broker: the Django project resolves
only the groups whose transaction_log it owns, each by its own group; another service's
transaction (committed in its own database) is shown read-only and never fenced here."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from sqlalchemy import Engine, create_engine, select

from broker_embedded import TransactionState
from outbox.integrations.django.conf import producer
from outbox.integrations.django.models import TransactionLog
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import COMMITTED, metadata, transaction_log
from tests.django.support import PENDING_URL, admin_client, park

OTHER_GROUP = "sqlalchemy-service"


@dataclass(frozen=True)
class TwoServices:
    ours: str  # group "shop", no transaction_log row: its fence answers ROLLBACK
    theirs: str  # group OTHER_GROUP, COMMITTED in the other service's database
    their_database: Engine
    broker_url: str

    def their_state(self) -> str | None:
        with self.their_database.connect() as conn:
            return conn.execute(select(transaction_log.c.state)
                                .where(transaction_log.c.transaction_id == self.theirs)).scalar_one_or_none()

    def still_parked(self, transaction_id: str) -> bool:
        broker = producer().broker
        return (broker.transaction_state(transaction_id) is TransactionState.PARKED
                and transaction_id in {tx.transaction_id for tx in broker.list_parked()})


@pytest.fixture
def two_services(tmp_path: Path, django_project: bool) -> Iterator[TwoServices]:
    their_database = create_engine(f"sqlite:///{tmp_path / 'other-service.sqlite3'}")
    metadata.create_all(their_database)
    ours, theirs = uuid.uuid4().hex, uuid.uuid4().hex
    with their_database.begin() as conn:
        record_committed(conn, theirs, OTHER_GROUP)
    park(tmp_path / "broker", {ours: "shop", theirs: OTHER_GROUP})
    url = f"embedded://{tmp_path / 'broker'}"
    with override_settings(OUTBOX={"BROKER_URL": url, "PRODUCER_GROUP": "shop"}):
        yield TwoServices(ours, theirs, their_database, url)
    their_database.dispose()


def _not_fenced_here(services: TwoServices) -> bool:
    return not TransactionLog.objects.filter(pk=services.theirs).exists()


def test_a_resolve_posted_for_another_groups_transaction_is_refused(two_services: TwoServices) -> None:
    """The loss: the old admin fenced the other service's transaction in Django's database
    and told the broker ROLLBACK, though it had committed in its own database."""
    response = admin_client().post(PENDING_URL, {"resolve": two_services.theirs})
    assert response.status_code == 403
    assert two_services.still_parked(two_services.theirs)
    assert _not_fenced_here(two_services)
    assert two_services.their_state() == COMMITTED


def test_the_page_shows_another_groups_transactions_read_only(two_services: TwoServices) -> None:
    page = admin_client().get(PENDING_URL).content.decode()
    assert two_services.theirs in page and two_services.ours in page
    assert f'value="{two_services.ours}"' in page  # our transaction has its button
    assert f'value="{two_services.theirs}"' not in page
    assert "owned by another service" in page


def test_the_commands_refuse_another_groups_transaction(two_services: TwoServices) -> None:
    theirs = two_services.theirs
    with pytest.raises(CommandError, match=OTHER_GROUP):
        call_command("outbox_resolve", theirs, stdout=io.StringIO())
    for arguments in ([], ["--send"], ["--group", OTHER_GROUP, "--send"]):
        with pytest.raises(CommandError):
            call_command("outbox_check", theirs, *arguments, stdout=io.StringIO())
    assert two_services.still_parked(theirs)
    assert _not_fenced_here(two_services)
    assert two_services.their_state() == COMMITTED


def test_our_own_transaction_still_resolves_from_the_admin(two_services: TwoServices) -> None:
    response = admin_client().post(PENDING_URL, {"resolve": two_services.ours}, follow=True)
    assert f"Transaction {two_services.ours}: rolled_back" in response.content.decode()
    assert producer().broker.transaction_state(two_services.ours) is TransactionState.ROLLED_BACK


def test_resolving_needs_the_change_permission_of_the_transaction_log(two_services: TwoServices) -> None:
    from django.contrib.auth.models import Permission, User

    User.objects.filter(username="viewer").delete()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_pendingtransaction"))
    client = Client()
    assert client.login(username="viewer", password="pw")
    assert two_services.ours in client.get(PENDING_URL).content.decode()
    assert client.post(PENDING_URL, {"resolve": two_services.ours}).status_code == 403
    assert two_services.still_parked(two_services.ours)


def test_a_configured_second_group_is_fenced_with_its_own_group(tmp_path: Path, django_project: bool) -> None:
    """``PRODUCER_GROUPS``: this project also owns "legacy" (on the default database); its
    parked transaction is fenced under "legacy", not under ``PRODUCER_GROUP``."""
    legacy = uuid.uuid4().hex
    park(tmp_path / "broker", {legacy: "legacy"})
    outbox = {"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop",
              "PRODUCER_GROUPS": ["legacy"]}
    with override_settings(OUTBOX=outbox):
        client = admin_client()
        assert f'value="{legacy}"' in client.get(PENDING_URL).content.decode()
        response = client.post(PENDING_URL, {"resolve": legacy}, follow=True)
        assert f"Transaction {legacy}: rolled_back" in response.content.decode()
        assert producer().broker.transaction_state(legacy) is TransactionState.ROLLED_BACK
    fence = TransactionLog.objects.get(pk=legacy)
    assert (fence.state, fence.producer_group) == (TransactionLog.ROLLED_BACK, "legacy")


@pytest.mark.postgres
def test_a_group_mapped_to_another_alias_is_resolved_on_that_database(tmp_path: Path, alias: str) -> None:
    """``PRODUCER_GROUPS = {"billing": "pg"}``: billing's row lives in the ``pg`` database,
    so the admin (whose router picks ``default``) must read it there: COMMIT."""
    if alias != "pg":
        pytest.skip("the mapping points at the PostgreSQL alias")
    from django.utils import timezone

    billing = uuid.uuid4().hex
    TransactionLog.objects.using("pg").create(transaction_id=billing, producer_group="billing",
                                              state=TransactionLog.COMMITTED, created_at=timezone.now())
    park(tmp_path / "broker", {billing: "billing"})
    outbox = {"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop",
              "PRODUCER_GROUPS": {"billing": "pg"}}
    with override_settings(OUTBOX=outbox):
        response = admin_client().post(PENDING_URL, {"resolve": billing}, follow=True)
        assert f"Transaction {billing}: committed" in response.content.decode()
    assert not TransactionLog.objects.using("default").filter(pk=billing).exists()
