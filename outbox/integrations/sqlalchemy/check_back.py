"""The fence as a check-back answer on SQLAlchemy engines, and check-backs answered in a
long-running process.

``fence_answer(settings)`` is what the Celery check task asks by default. A RocketMQ 5
cluster (``rocketmq5://``) sends check-backs to a live producer client, not to a Celery
queue: call ``answer_check_backs(producer)`` in the process that runs the producer (a web
server, a worker); Django projects have ``outbox.integrations.django.resolve.answer_check_backs``.
"""

from __future__ import annotations

import functools

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from broker_embedded import CheckRequest, Resolution
from broker_embedded.api import CheckCallback

from ...check_back import Answer, answer_check_back
from ...producer import Producer
from ...settings import OutboxSettings
from .engine import checker_engine
from .fence import check_transaction

#: Errors of the fence's database that make a check-back's answer UNKNOWN.
DATABASE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError,)


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


def answer_check_backs(producer: Producer, settings: OutboxSettings | None = None, *,
                       answer: Answer | None = None) -> CheckCallback:
    """Answer ``producer``'s group's check-backs in this process with the fence on the
    group's database (``settings``, default ``OutboxSettings.from_env()``; or ``answer``),
    as the Celery check task would. Returns the callback, for
    ``producer.broker.unregister_producer``."""
    fence = answer or fence_answer(settings or OutboxSettings.from_env())

    def on_check(request: CheckRequest) -> None:
        answer_check_back(fence, lambda: producer.broker, request.producer_group, request.transaction_id,
                          request.message.message_id, context=request.message.properties,
                          database_errors=DATABASE_ERRORS)

    producer.broker.register_producer(producer.producer_group, on_check)
    return on_check
