"""Settings: defaults that need nothing, environment overrides, explicit overrides, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox import ConfigurationError
from outbox.settings import OutboxSettings


def test_defaults_need_no_server(monkeypatch) -> None:
    for name in ("OUTBOX_BROKER_URL", "OUTBOX_DATABASE_URL", "OUTBOX_GROUP_DATABASES",
                 "OUTBOX_CELERY_BROKER_URL", "OUTBOX_CELERY_DATA_DIR", "OUTBOX_CHECK_LOCK_TIMEOUT_MS"):
        monkeypatch.delenv(name, raising=False)
    settings = OutboxSettings.from_env()
    assert settings.database_url.startswith("sqlite:///")
    assert settings.celery_broker_url == "filesystem://"
    assert settings.database_for("any-group") == settings.database_url


def test_environment_then_explicit_overrides(monkeypatch) -> None:
    monkeypatch.setenv("OUTBOX_BROKER_URL", "tcp://127.0.0.1:1")
    monkeypatch.setenv("OUTBOX_GROUP_DATABASES", '{"shop": "postgresql+psycopg://db/shop"}')
    monkeypatch.setenv("OUTBOX_CELERY_DATA_DIR", "/tmp/x")
    settings = OutboxSettings.from_env(broker_url="tcp://127.0.0.1:2")
    assert settings.broker_url == "tcp://127.0.0.1:2"
    assert settings.database_for("shop") == "postgresql+psycopg://db/shop"
    assert settings.celery_data_dir == Path("/tmp/x")


@pytest.mark.parametrize(("name", "value"), [("OUTBOX_GROUP_DATABASES", "[1]"),
                                             ("OUTBOX_GROUP_DATABASES", "{not json"),
                                             ("OUTBOX_CHECK_LOCK_TIMEOUT_MS", "soon")])
def test_bad_values_are_typed_errors(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError):
        OutboxSettings.from_env()
