"""The relay beside the check-back worker: the standalone Celery worker relays the stored
messages of ``OUTBOX_DATABASE_URL`` to the broker while it runs; ``OUTBOX_RELAY`` says
whether it does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient
from outbox.errors import ConfigurationError
from outbox.integrations.celery import check_queue
from outbox.integrations.sqlalchemy.relay import backlog
from outbox.settings import OutboxSettings

from ..server.conftest import ServerProcess
from .celery_workers import CeleryWorker, wait_until
from .test_relay import GROUP, assert_exactly_once_in_group_order, shop, store_while_down


@pytest.mark.parametrize(("environment", "relays"), [
    ({}, False),
    ({"OUTBOX_DATABASE_URL": "sqlite:///shop.sqlite3"}, True),
    ({"OUTBOX_DATABASE_URL": "sqlite:///shop.sqlite3", "OUTBOX_RELAY": "0"}, False),
    ({"OUTBOX_RELAY": "yes"}, True),
])
def test_outbox_relay_defaults_to_whether_a_database_is_configured(
        monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], relays: bool) -> None:
    for name in ("OUTBOX_DATABASE_URL", "OUTBOX_RELAY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert OutboxSettings.from_env().relay is relays


def test_a_bad_outbox_relay_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_RELAY", "maybe")
    with pytest.raises(ConfigurationError, match="OUTBOX_RELAY='maybe'"):
        OutboxSettings.from_env()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(BrokerClient, "relay_committed"), reason="needs relay_committed")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the relay is the same on PostgreSQL (test_relay)
def test_the_check_back_worker_relays_the_stored_messages(engine: Engine, db_url: str, tmp_path: Path) -> None:
    shop.create_all(engine)
    store_while_down(sessionmaker(engine, class_=Session), range(12))
    server = ServerProcess(tmp_path / "broker").start()
    worker = CeleryWorker(tmp_path / "worker.log", "outbox.integrations.celery.worker", [check_queue(GROUP)], {
        "OUTBOX_DATABASE_URL": db_url, "HALFMOON_BROKER_URL": server.url,
        "OUTBOX_CELERY_DATA_DIR": str(tmp_path / "celery"), "PYTHONPATH": os.getcwd()})
    try:
        wait_until(lambda: not backlog(engine), 60, f"the worker's relay (see {worker.log})")
        assert worker.stop() == 0
        assert_exactly_once_in_group_order(server.url, range(12))
    finally:
        worker.kill()
        server.kill()
