"""``settings.OUTBOX``: the app's settings, with defaults.

    OUTBOX = {
        "BROKER_URL": "tcp://127.0.0.1:9876",    # or "embedded:///path/to/dir"
        "PRODUCER_GROUP": "default",
        "CHECK_LOCK_TIMEOUT_MS": 2000,
    }

Changing ``OUTBOX`` at run time (``override_settings`` in tests) closes the producer; the
next use connects to the new broker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL

from ...producer import Producer


@dataclass(frozen=True)
class DjangoOutboxSettings:
    broker_url: str
    producer_group: str
    check_lock_timeout_ms: int


def outbox_settings() -> DjangoOutboxSettings:
    """``settings.OUTBOX`` checked and completed with defaults."""
    raw: dict[str, Any] = dict(getattr(settings, "OUTBOX", {}))
    unknown = set(raw) - {"BROKER_URL", "PRODUCER_GROUP", "CHECK_LOCK_TIMEOUT_MS"}
    if unknown:
        raise ImproperlyConfigured(f"unknown OUTBOX settings: {sorted(unknown)}")
    url = raw.get("BROKER_URL", "tcp://127.0.0.1:9876")
    if not isinstance(url, str) or not url.startswith(("tcp://", "embedded://")):
        raise ImproperlyConfigured("OUTBOX['BROKER_URL'] must be a tcp://host:port or embedded:///path URL")
    timeout = raw.get("CHECK_LOCK_TIMEOUT_MS", 2000)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise ImproperlyConfigured("OUTBOX['CHECK_LOCK_TIMEOUT_MS'] must be a positive integer")
    group = raw.get("PRODUCER_GROUP", "default")
    if not isinstance(group, str) or not group:
        raise ImproperlyConfigured("OUTBOX['PRODUCER_GROUP'] must be a non-empty string")
    return DjangoOutboxSettings(url, group, timeout)


@functools.cache
def producer() -> Producer:
    """This process's producer for ``OUTBOX['PRODUCER_GROUP']``."""
    conf = outbox_settings()
    return Producer(conf.broker_url, conf.producer_group)


def reset_producer(*, setting: str, **_: Any) -> None:
    """``setting_changed`` receiver: close the producer when ``OUTBOX`` changes."""
    if setting != "OUTBOX" or producer.cache_info().currsize == 0:
        return
    producer().close()
    producer.cache_clear()


#: Keys of a PostgreSQL alias's OPTIONS that Django consumes; the rest go to psycopg.
_DJANGO_ONLY_PG_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role"})


def sqlalchemy_engine(using: str = "default") -> Engine:
    """An engine on the same database as Django's alias ``using`` (for the fencing check)."""
    db = settings.DATABASES[using]
    engine = db["ENGINE"]
    if engine.endswith("sqlite3"):
        name = str(db["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"database {using!r} is in memory: the outbox check needs a second connection to it, use a file"
            )
        return create_engine(f"sqlite:///{name}")
    if engine.endswith("postgresql"):
        url = URL.create("postgresql+psycopg", username=db.get("USER") or None, password=db.get("PASSWORD") or None,
                         host=db.get("HOST") or None, port=int(db["PORT"]) if db.get("PORT") else None,
                         database=db["NAME"])
        options = {k: v for k, v in db.get("OPTIONS", {}).items() if k not in _DJANGO_ONLY_PG_OPTIONS}
        return create_engine(url, connect_args=options)
    raise ImproperlyConfigured(f"the outbox check supports SQLite and PostgreSQL, not {engine}")
