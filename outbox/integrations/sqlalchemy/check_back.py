"""The fence as a check-back answer on SQLAlchemy engines, and check-backs answered by the
producer that runs the transactions.

``@transactional_message(producer, Session, ...)`` calls ``answer_own_check_backs``: the
producer answers its group's check-backs with the fence on the session factory's engine
while it runs, so no checker has to be started for them (the Celery checker is for when no
producer of the group is alive). ``answer_check_backs(producer, engine)`` does the same
for a producer used without the decorator (a RocketMQ 5 cluster, ``rocketmq5://``, sends
check-backs only to live producers). ``fence_answer(settings)`` is what the Celery check
task asks by default (``tasks.register``).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from broker_embedded import Resolution

from ...aio_producer import AsyncProducer
from ...check_back import Answer
from ...errors import ConfigurationError
from ...producer import Producer
from ...schema import DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS
from ...settings import OutboxSettings
from .engine import checker_engine
from .recorder import RECORDER, check_transaction

log = logging.getLogger(__name__)

#: The blocking driver the fence uses for an async engine's driver (others: the dialect's default).
SYNC_DRIVERS = {"aiosqlite": "pysqlite", "asyncpg": "psycopg", "psycopg_async": "psycopg"}


@functools.cache
def _engine(url: str, connect_timeout_s: int) -> Engine:
    return checker_engine(url, connect_timeout_s)


def fence_answer(settings: OutboxSettings) -> Answer:
    """The fence on each group's database (``settings.database_for(group)``), bounded by
    the settings' connect, lock and statement timeouts."""

    def answer(transaction_id: str, producer_group: str) -> Resolution:
        engine = _engine(settings.database_for(producer_group), settings.check_connect_timeout_s)
        return check_transaction(engine, transaction_id, producer_group,
                                 settings.check_lock_timeout_ms, settings.check_statement_timeout_ms)

    return answer


def engine_answer(engine: Engine, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                  statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS) -> Answer:
    """The fence on ``engine`` (the producer group's own database)."""

    def answer(transaction_id: str, producer_group: str) -> Resolution:
        return check_transaction(engine, transaction_id, producer_group, lock_timeout_ms, statement_timeout_ms)

    return answer


def sync_engine(bind: Any) -> Engine:
    """The blocking ``Engine`` the fence runs on for ``bind``: the engine itself, or for an
    ``AsyncEngine`` an engine of its own on the same database through a blocking driver
    (``SYNC_DRIVERS``: ``sqlite+aiosqlite`` -> ``sqlite+pysqlite``, ``postgresql+asyncpg``
    -> ``postgresql+psycopg``); ``ConfigurationError`` for anything else."""
    if isinstance(bind, Engine):
        return bind
    from sqlalchemy.ext.asyncio import AsyncEngine

    if isinstance(bind, AsyncEngine):
        backend, driver = bind.url.get_backend_name(), bind.url.get_driver_name()
        url = bind.url.set(drivername=f"{backend}+{SYNC_DRIVERS[driver]}" if driver in SYNC_DRIVERS else backend)
        return checker_engine(url.render_as_string(hide_password=False), 10)
    raise ConfigurationError(f"cannot answer check-backs on {bind!r}: give an Engine or AsyncEngine")


def factory_engine(session_factory: Any) -> Any:
    """The engine a ``sessionmaker``/``async_sessionmaker`` is bound to, or None (a plain
    function, an unbound factory)."""
    kw = getattr(session_factory, "kw", None)
    return kw.get("bind") if isinstance(kw, dict) else None


def answer_check_backs(producer: Producer | AsyncProducer, engine: Any = None, *,
                       settings: OutboxSettings | None = None, answer: Answer | None = None) -> bool:
    """Make ``producer`` answer its group's check-backs while it runs, by ``answer``, else
    the fence on ``engine`` (an ``Engine``, or an ``AsyncEngine`` for an ``AsyncProducer``),
    else on the group's database of ``settings`` (default ``OutboxSettings.from_env()``);
    False if it already answers them. An ``AsyncProducer`` starts on its next call."""
    if producer.answers_check_backs:
        return False
    if answer is None:
        answer = engine_answer(sync_engine(engine)) if engine is not None else \
            fence_answer(settings or OutboxSettings.from_env())
    return producer.answer_check_backs(answer, database_errors=RECORDER.database_errors)


def answer_own_check_backs(producer: Producer | AsyncProducer, session_factory: Any) -> None:
    """What ``@transactional_message`` does with its producer and session factory: the
    producer answers its group's check-backs on the factory's engine. A factory whose
    engine cannot be known (a plain function), or whose fence cannot run (an async
    engine's blocking driver is not installed), is logged and never fails the caller: then
    call ``answer_check_backs(producer, engine)`` or run the Celery checker."""
    if producer.answers_check_backs:
        return
    engine = factory_engine(session_factory)
    problem = f"cannot tell the database of {session_factory!r}" if engine is None else None
    if engine is not None:
        try:
            answer_check_backs(producer, engine)
        except (ImportError, SQLAlchemyError, ConfigurationError) as exc:  # e.g. no blocking driver installed
            problem = f"cannot run the fence on {engine!r} ({exc})"
    if problem:
        log.warning("producer group %s: %s, so this producer answers no check-backs; call "
                    "outbox.integrations.sqlalchemy.check_back.answer_check_backs(producer, engine) or run "
                    "the Celery checker", producer.producer_group, problem)
