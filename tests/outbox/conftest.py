"""Databases (SQLite and PostgreSQL) with the framework tables, and an in-process broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, event

from broker_embedded import BrokerConfig, EmbeddedBroker
from broker_embedded.store.config import StoreConfig
from outbox.integrations.sqlalchemy.tables import metadata


def make_engine(url: str) -> Engine:
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        # SQLite must take its write lock at BEGIN so the fence waits on a running
        # transaction exactly as PostgreSQL's unique index does.
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            dbapi_connection.isolation_level = None
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN IMMEDIATE")
    return engine


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(store=StoreConfig(segment_size=1 << 20), transaction_timeout_s=3600)
    broker = EmbeddedBroker(tmp_path / "broker", config)
    yield broker
    broker.close()
