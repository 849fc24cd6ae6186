"""A Django project's check-back meets its own database's errors: the Celery task answers
UNKNOWN (the broker asks again) for Django's ``DatabaseError`` family, as the producer
does, instead of failing the task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.test import override_settings

from broker_embedded import Resolution
from outbox.integrations.django.tasks import check_transaction_task


@pytest.fixture
def unreachable_alias(tmp_path: Path) -> Iterator[str]:
    """A ``DATABASES`` alias whose SQLite file cannot be opened (its folder does not exist)."""
    connections.settings["unreachable"] = {**connections.settings["default"],
                                           "NAME": str(tmp_path / "missing" / "db.sqlite3")}
    try:
        yield "unreachable"
    finally:
        connections["unreachable"].close()
        del connections.settings["unreachable"]


def test_the_check_task_answers_unknown_when_the_groups_database_is_unreachable(
        tmp_path: Path, unreachable_alias: str) -> None:
    outbox = {"BROKER_URL": f"embedded://{tmp_path / 'broker'}", "PRODUCER_GROUP": "shop",
              "PRODUCER_GROUPS": {"far": unreachable_alias}, "ANSWER_CHECK_BACKS": False}
    with override_settings(OUTBOX=outbox):
        assert check_transaction_task("far", "tx-1", "msg-1") == Resolution.UNKNOWN.value
