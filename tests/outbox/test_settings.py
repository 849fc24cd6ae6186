"""Settings: defaults that need nothing, environment overrides, explicit overrides, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox import ConfigurationError
from outbox.settings import OutboxSettings


def test_defaults_need_no_server(monkeypatch) -> None:
    for name in ("HALFMOON_BROKER_URL", "OUTBOX_BROKER_URL", "OUTBOX_DATABASE_URL", "OUTBOX_GROUP_DATABASES",
                 "OUTBOX_CELERY_BROKER_URL", "OUTBOX_CELERY_DATA_DIR", "OUTBOX_CHECK_LOCK_TIMEOUT_MS",
                 "OUTBOX_CHECK_CONNECT_TIMEOUT_S", "OUTBOX_CHECK_STATEMENT_TIMEOUT_MS"):
        monkeypatch.delenv(name, raising=False)
    settings = OutboxSettings.from_env()
    assert settings.database_url.startswith("sqlite:///")
    assert (settings.check_connect_timeout_s, settings.check_statement_timeout_ms) == (5, 5000)
    assert settings.celery_broker_url == "filesystem://"
    assert settings.database_for("any-group") == settings.database_url
    assert settings.broker_url == "tcp://127.0.0.1:9876"


def test_environment_then_explicit_overrides(monkeypatch) -> None:
    monkeypatch.delenv("HALFMOON_BROKER_URL", raising=False)
    monkeypatch.setenv("OUTBOX_BROKER_URL", "tcp://127.0.0.1:1")
    monkeypatch.setenv("OUTBOX_GROUP_DATABASES", '{"shop": "postgresql+psycopg://db/shop"}')
    monkeypatch.setenv("OUTBOX_CELERY_DATA_DIR", "/tmp/x")
    monkeypatch.setenv("OUTBOX_CHECK_STATEMENT_TIMEOUT_MS", "750")
    settings = OutboxSettings.from_env(broker_url="tcp://127.0.0.1:2")
    assert settings.check_statement_timeout_ms == 750
    assert settings.broker_url == "tcp://127.0.0.1:2"
    assert settings.database_for("shop") == "postgresql+psycopg://db/shop"
    assert settings.celery_data_dir == Path("/tmp/x")


def test_halfmoon_broker_url_is_read_and_outbox_broker_url_is_its_alias(monkeypatch) -> None:
    monkeypatch.delenv("OUTBOX_BROKER_URL", raising=False)
    monkeypatch.setenv("HALFMOON_BROKER_URL", "tcp://127.0.0.1:7")
    assert OutboxSettings.from_env().broker_url == "tcp://127.0.0.1:7"
    monkeypatch.setenv("OUTBOX_BROKER_URL", "tcp://127.0.0.1:7")
    assert OutboxSettings.from_env().broker_url == "tcp://127.0.0.1:7"
    monkeypatch.setenv("HALFMOON_BROKER_URL", "")  # empty is unset
    monkeypatch.setenv("OUTBOX_BROKER_URL", "embedded:///var/lib/halfmoon")
    assert OutboxSettings.from_env().broker_url == "embedded:///var/lib/halfmoon"
    monkeypatch.setenv("OUTBOX_BROKER_URL", "rocketmq5://proxy.example:8081?topics=orders")
    assert OutboxSettings.from_env().broker_url == "rocketmq5://proxy.example:8081?topics=orders"


@pytest.mark.parametrize(("halfmoon", "outbox"), [("tcp://127.0.0.1:7", "tcp://127.0.0.1:8"),
                                                  ("127.0.0.1:7", ""), ("", "http://example.com"),
                                                  ("rocketmq5://proxy.example", "")])
def test_conflicting_or_schemeless_broker_urls_are_typed_errors(monkeypatch, halfmoon: str, outbox: str) -> None:
    monkeypatch.setenv("HALFMOON_BROKER_URL", halfmoon)
    monkeypatch.setenv("OUTBOX_BROKER_URL", outbox)
    with pytest.raises(ConfigurationError, match="BROKER_URL"):
        OutboxSettings.from_env()


@pytest.mark.parametrize(("name", "value"), [("OUTBOX_GROUP_DATABASES", "{not json"),
                                             ("OUTBOX_GROUP_DATABASES", "[1]"),
                                             ("OUTBOX_CHECK_LOCK_TIMEOUT_MS", "soon"),
                                             ("OUTBOX_CHECK_CONNECT_TIMEOUT_S", "0"),
                                             ("OUTBOX_CHECK_STATEMENT_TIMEOUT_MS", "-1"),
                                             ("OUTBOX_BROKER_CHECK_MAX", "many"),
                                             ("OUTBOX_DEDUP_WINDOW_S", "-5")])
def test_a_bad_value_names_its_variable_and_value(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        OutboxSettings.from_env()
    assert f"{name}={value!r}" in str(caught.value)


def test_no_default_depends_on_the_working_directory(monkeypatch, tmp_path: Path) -> None:
    for name in ("OUTBOX_DATABASE_URL", "OUTBOX_CELERY_DATA_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    seen = []
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        monkeypatch.chdir(folder)
        for settings in (OutboxSettings(), OutboxSettings.from_env()):
            assert settings.celery_data_dir.is_absolute()
            assert Path(settings.database_url.removeprefix("sqlite:///")).is_absolute()
            seen.append((settings.celery_data_dir, settings.database_url))
    assert len(set(seen)) == 1
    assert seen[0][0] == Path.home() / ".local/share/halfmoon/celery"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    settings = OutboxSettings.from_env()
    assert settings.celery_data_dir == tmp_path / "data/halfmoon/celery"
    assert settings.database_url == f"sqlite:///{tmp_path / 'data/halfmoon/outbox.sqlite3'}"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # the XDG spec says: ignore it
    assert OutboxSettings.from_env().celery_data_dir == Path.home() / ".local/share/halfmoon/celery"
