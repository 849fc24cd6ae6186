"""The check-back task: its name, its queues, its one body, and its registration in an app.

The broker's Celery checker sends task ``outbox.check_transaction(producer_group,
transaction_id, message_id)`` to queue ``outbox.check.<producer group>``. Whichever Celery
app runs it (yours through ``register(app)``, a Django project's through autodiscovery of
``outbox.integrations.django.tasks``, or the standalone ``outbox.integrations.celery.worker``),
the body is ``answer_check_back``: the fence decides, END_TRANSACTION tells the broker.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, current_task
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from broker_embedded import BrokerAPI, Resolution, connect

from ... import instrumentation
from ...producer import Producer
from ...settings import OutboxSettings
from ..sqlalchemy.engine import checker_engine
from ..sqlalchemy.fence import check_transaction

log = logging.getLogger("outbox.celery")

CHECK_TASK = "outbox.check_transaction"

#: What a check-back asks: ``answer(transaction_id, producer_group)``, by the fence.
Answer = Callable[[str, str], Resolution]

#: Options of the check task in any app: no result to store (the broker gets the answer),
#: acknowledged after it ran (a worker killed mid-check leaves it to another worker).
TASK_OPTIONS: dict[str, Any] = {"name": CHECK_TASK, "ignore_result": True, "acks_late": True}


#: The check task's message header that carries the half message's
#: ``outbox.instrumentation.CONTEXT_PROPERTIES`` (a mapping), when it has any.
CONTEXT_HEADER = "outbox_context"


def check_queue(producer_group: str) -> str:
    """The Celery queue of a producer group's check-backs."""
    return f"outbox.check.{producer_group}"


def carried_context() -> dict[str, str]:
    """The half message's ``CONTEXT_PROPERTIES`` the running check task carries in its
    ``CONTEXT_HEADER`` (none when its producer does not trace, or called directly)."""
    request = current_task.request if current_task else None
    carried = (request.headers or {}).get(CONTEXT_HEADER) if request else None
    return instrumentation.carried_context(carried) if isinstance(carried, Mapping) else {}


def answer_check_back(answer: Answer, broker: Callable[[], BrokerAPI], producer_group: str,
                      transaction_id: str, message_id: str | None = None) -> str:
    """Answer one check-back: ``answer`` (the fencing check), then END_TRANSACTION to
    ``broker()``; the resolution's value.

    ``message_id`` (the half message the broker checked) is only logged and traced: the
    answer is per transaction. UNKNOWN (a lock, statement or connect timeout, or the database is
    unreachable) sends nothing; the broker checks again at its next interval."""
    log.info("check-back of %s (group %s, message %s)", transaction_id, producer_group, message_id)
    with instrumentation.operation(instrumentation.CHECK_BACK, producer_group=producer_group,
                                   transaction_id=transaction_id, message_id=message_id,
                                   context=carried_context()) as check:
        try:
            resolution = answer(transaction_id, producer_group)
        except SQLAlchemyError as exc:
            log.warning("check of %s: database error (%s); answering nothing, the broker will check again",
                        transaction_id, exc)
            resolution = Resolution.UNKNOWN
        check.outcome = resolution.value
        if resolution is not Resolution.UNKNOWN:  # not delivered: logged, and the broker checks again
            Producer(broker(), producer_group).end_transaction(transaction_id, resolution, from_check=True)
        return resolution.value


@functools.cache
def broker_client(url: str) -> BrokerAPI:
    """This process's connection to the broker at ``url``, opened on first use."""
    return connect(url)


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


def register(app: Celery, *, answer: Answer | None = None, settings: OutboxSettings | None = None) -> Any:
    """Register the check-back task in ``app``; returns the task.

    ``settings`` (default: ``OutboxSettings.from_env()``) give the broker that receives the
    answers and, unless ``answer`` is given, the databases the fence runs on. Run a worker
    on the group's queue: ``celery -A yourapp worker -Q celery,outbox.check.<group>``."""
    settings = settings or OutboxSettings.from_env()
    fence = answer or fence_answer(settings)
    broker_url = settings.broker_url

    def check_transaction_task(producer_group: str, transaction_id: str, message_id: str | None = None) -> str:
        """Answer one check-back of the broker (see ``answer_check_back``)."""
        return answer_check_back(fence, lambda: broker_client(broker_url), producer_group, transaction_id,
                                 message_id)

    return app.task(**TASK_OPTIONS, shared=False)(check_transaction_task)  # in ``app`` alone
