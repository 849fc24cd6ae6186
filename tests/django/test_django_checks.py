"""``manage.py check`` catches what used to fail only at the first request: wrong ``OUTBOX``
settings, a broker URL without a scheme, conflicting broker URL variables, unapplied outbox
migrations and an unreachable broker; and the one broker URL name, ``HALFMOON_BROKER_URL``."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings

from broker_embedded import BrokerConfig
from outbox.integrations.django.conf import outbox_settings
from tests.ports import free_port
from tests.server.conftest import ThreadServer

SHOP = {"PRODUCER_GROUP": "shop"}


def _ids(**kwargs: object) -> list[str]:
    return sorted(m.id for m in run_checks(tags=["halfmoon_outbox"], **kwargs) if m.id)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_broker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HALFMOON_BROKER_URL", "OUTBOX_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("outbox", "check_id"), [
    ({"BROKER_URLS": "tcp://127.0.0.1:9876"}, "halfmoon_outbox.E001"),
    ({"BROKER_URL": "127.0.0.1:9876"}, "halfmoon_outbox.E002"),
    ({"BROKER_URL": "http://example.com"}, "halfmoon_outbox.E002"),
    ({"BROKER_URL": "tcp://127.0.0.1"}, "halfmoon_outbox.E002"),
    ({"PRODUCER_GROUP": ""}, "halfmoon_outbox.E004"),
    ({"PRODUCER_GROUPS": "billing"}, "halfmoon_outbox.E005"),
    ({"PRODUCER_GROUPS": {"billing": 3}}, "halfmoon_outbox.E005"),
    ({"PRODUCER_GROUPS": [["billing"]]}, "halfmoon_outbox.E005"),
    ({"PRODUCER_GROUPS": [""]}, "halfmoon_outbox.E005"),
    ({"PRODUCER_GROUPS": {"billing": "no-such-alias"}}, "halfmoon_outbox.E006"),
    ({"CHECK_LOCK_TIMEOUT_MS": "2000"}, "halfmoon_outbox.E007"),
    ({"CHECK_LOCK_TIMEOUT_MS": 0}, "halfmoon_outbox.E007"),
    ({"RETENTION": 7}, "halfmoon_outbox.E008"),
    ({"RETENTION": {"DEDUP_WINDOW": 60}}, "halfmoon_outbox.E008"),
    ({"RETENTION": {"DEDUP_WINDOW_S": -1}}, "halfmoon_outbox.E008"),
    ({"RETENTION": {"CHECK_MAX": "15"}}, "halfmoon_outbox.E008"),
    ({"ANSWER_CHECK_BACKS": "yes"}, "halfmoon_outbox.E009"),
    ({"ONEWAY_END": 0}, "halfmoon_outbox.E010"),
    ({"ON_BROKER_DOWN": "queue"}, "halfmoon_outbox.E011"),
])
def test_each_wrong_setting_is_an_error_of_manage_py_check(outbox: dict[str, object], check_id: str) -> None:
    with override_settings(OUTBOX=outbox):
        assert _ids() == [check_id]
        with pytest.raises(SystemCheckError, match=check_id):
            call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_every_wrong_setting_is_reported_at_once() -> None:
    with override_settings(OUTBOX={"BROKER_URL": "localhost", "PRODUCER_GROUP": 7, "CHECK_LOCK_TIMEOUT_MS": -1}):
        assert _ids() == ["halfmoon_outbox.E002", "halfmoon_outbox.E004", "halfmoon_outbox.E007"]


def test_the_project_settings_pass() -> None:
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()


def test_halfmoon_broker_url_is_the_broker_url_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFMOON_BROKER_URL", "tcp://127.0.0.1:1111")
    with override_settings(OUTBOX=SHOP):
        assert outbox_settings().broker_url == "tcp://127.0.0.1:1111"
        monkeypatch.setenv("OUTBOX_BROKER_URL", "tcp://127.0.0.1:1111")  # the same: fine
        assert outbox_settings().broker_url == "tcp://127.0.0.1:1111"
    with override_settings(OUTBOX={**SHOP, "BROKER_URL": "tcp://127.0.0.1:2222"}):
        assert outbox_settings().broker_url == "tcp://127.0.0.1:2222"  # the Django setting wins


def test_the_older_variable_still_works_and_a_conflict_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_BROKER_URL", "tcp://127.0.0.1:3333")
    with override_settings(OUTBOX=SHOP):
        assert outbox_settings().broker_url == "tcp://127.0.0.1:3333"
        monkeypatch.setenv("HALFMOON_BROKER_URL", "tcp://127.0.0.1:4444")
        assert "halfmoon_outbox.E003" in _ids()
    with override_settings(OUTBOX={**SHOP, "BROKER_URL": "tcp://127.0.0.1:2222"}):
        assert "halfmoon_outbox.E003" not in _ids()  # the explicit setting decides


def test_owned_groups_and_their_databases() -> None:
    from outbox.integrations.django.conf import ForeignGroupError

    with override_settings(OUTBOX={**SHOP, "PRODUCER_GROUPS": {"billing": "default", "legacy": None}}):
        conf = outbox_settings()
        assert conf.owned_groups == {"shop", "billing", "legacy"}
        assert {group: conf.database_for(group) for group in conf.owned_groups} == dict.fromkeys(
            ["shop", "billing", "legacy"], "default")
        with pytest.raises(ForeignGroupError, match="another service"):
            conf.database_for("sqlalchemy-service")
    with override_settings(OUTBOX={**SHOP, "PRODUCER_GROUPS": ("legacy",)}):
        assert outbox_settings().owned_groups == {"shop", "legacy"}


def test_no_url_at_all_is_the_default_broker() -> None:
    with override_settings(OUTBOX=SHOP):
        assert outbox_settings().broker_url == "tcp://127.0.0.1:9876"


def test_an_unreachable_broker_is_a_warning() -> None:
    closed_port = free_port()
    with override_settings(OUTBOX={**SHOP, "BROKER_URL": f"tcp://127.0.0.1:{closed_port}"}):
        assert _ids() == ["halfmoon_outbox.W002"]
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())  # a warning does not fail


def test_a_running_broker_passes(tmp_path: Path) -> None:
    server = ThreadServer(tmp_path / "broker", BrokerConfig())
    try:
        with override_settings(OUTBOX={**SHOP, "BROKER_URL": server.url}):
            assert _ids() == []
    finally:
        server.stop()


@pytest.fixture
def unapplied() -> Iterator[None]:
    """The default database's records of the outbox migrations removed (the tables stay)."""
    recorder = MigrationRecorder(connections["default"])
    applied = sorted(name for app, name in recorder.applied_migrations() if app == "halfmoon_outbox")
    for name in applied:
        recorder.record_unapplied("halfmoon_outbox", name)
    try:
        yield
    finally:
        for name in applied:
            recorder.record_applied("halfmoon_outbox", name)


def test_unapplied_outbox_migrations_are_a_warning_of_the_database_checks(unapplied: None) -> None:
    assert _ids() == []  # the database checks run only when asked for
    assert _ids(databases=["default"]) == ["halfmoon_outbox.W001"]
    out = io.StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=out)
    assert "halfmoon_outbox.W001" in out.getvalue()


def test_applied_migrations_pass_the_database_checks() -> None:
    assert _ids(databases=["default"]) == []


@pytest.mark.parametrize("options", [{}, {"timeout": 20}, {"transaction_mode": "DEFERRED"}])
def test_sqlite_without_immediate_transactions_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                           options: dict[str, object]) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "OPTIONS", options)
    assert _ids() == ["halfmoon_outbox.W003"]
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)  # a warning does not fail
    assert "halfmoon_outbox.W003" in out.getvalue() and '"transaction_mode": "IMMEDIATE"' in out.getvalue()


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate", "EXCLUSIVE"])
def test_sqlite_with_transactions_that_lock_at_begin_passes(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "OPTIONS", {"transaction_mode": mode})
    assert _ids() == []
