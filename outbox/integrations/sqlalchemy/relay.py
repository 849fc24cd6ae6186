"""The relay (``outbox.relay``) on SQLAlchemy engines: ``relays(database_urls, broker)``,
one ``Relay`` per database, as ``outbox relay`` and the Celery worker run them; and
``backlog(engine)``, what waits for them (``outbox status``)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, make_url

from broker_embedded import BrokerAPI

from ...relay import DEFAULT_BATCH_SIZE, Backlog, Relay, stored_backlog
from ...schema import DEFAULT_LOCK_TIMEOUT_MS
from .engine import checker_engine
from .recorder import RECORDER


def relay(engine: Engine, broker: BrokerAPI, *, batch_size: int = DEFAULT_BATCH_SIZE) -> Relay[Engine]:
    """The relay of ``engine``'s stored messages to ``broker`` (a SQLite engine made by
    ``engine.create_engine`` or ``prepare_engine``: its passes take the write lock at BEGIN)."""
    shown = make_url(engine.url).render_as_string(hide_password=True)
    return Relay(RECORDER, engine, broker, batch_size=batch_size, name=f"relay of {shown}")


def relays(database_urls: Iterable[str], broker: BrokerAPI, *, batch_size: int = DEFAULT_BATCH_SIZE,
           connect_timeout_s: int = 5) -> list[Relay[Engine]]:
    """A relay per database of ``database_urls`` to ``broker``; a PostgreSQL connection
    attempt gives up after ``connect_timeout_s``."""
    return [relay(checker_engine(url, connect_timeout_s), broker, batch_size=batch_size) for url in database_urls]


def backlog(engine: Engine) -> list[Backlog]:
    """The stored messages waiting for the relay in ``engine``'s database, per producer group."""
    with RECORDER.checker_transaction(engine, DEFAULT_LOCK_TIMEOUT_MS) as (execute, sql):
        return stored_backlog(execute, sql)
