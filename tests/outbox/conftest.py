"""Databases (SQLite and PostgreSQL) with the framework tables, and an in-process broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerConfig, EmbeddedBroker
from broker_embedded.store.config import StoreConfig
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.tables import metadata
from tests.conftest import redis_database


def make_engine(url: str) -> Engine:
    return create_engine(url)


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


@pytest.fixture
def celery_url(redis_url: str) -> Iterator[str]:
    """A Redis database of the Celery tests' own (``redis_url``'s is shared with other tests)."""
    import redis

    url = redis_url.rsplit("/", 1)[0] + f"/{redis_database(12)}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def shop_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions on a SQLite file with the outbox tables and the observability tests' orders."""
    from tests.outbox.observability import shop

    engine = make_engine(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    metadata.create_all(engine)
    shop.create_all(engine)
    yield sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def checking_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker that checks a transaction back 0.1 s after its half message."""
    config = BrokerConfig(store=StoreConfig(segment_size=1 << 20), transaction_timeout_s=0.1, check_interval_s=0.2)
    broker = EmbeddedBroker(tmp_path / "checking", config)
    yield broker
    broker.close()
