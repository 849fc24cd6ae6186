"""The check-back task: its name, its queues, its one body, and its registration in an app.

The broker's Celery checker sends task ``outbox.check_transaction(producer_group,
transaction_id, message_id)`` to queue ``outbox.check.<producer group>``. Whichever Celery
app runs it (yours through ``register(app)``, a Django project's through autodiscovery of
``outbox.integrations.django.tasks``, or the standalone ``outbox.integrations.celery.worker``),
the body is ``answer_check_back``: the fence decides, END_TRANSACTION tells the broker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, current_task

from broker_embedded import BrokerAPI, connect

from ... import check_back, instrumentation
from ...check_back import Answer
from ...settings import OutboxSettings
from ..sqlalchemy.check_back import DATABASE_ERRORS, fence_answer

CHECK_TASK = "outbox.check_transaction"

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
    """``outbox.check_back.answer_check_back`` in a check task: traced with the context the
    task carries, a database error of SQLAlchemy's is UNKNOWN."""
    return check_back.answer_check_back(answer, broker, producer_group, transaction_id, message_id,
                                        context=carried_context(), database_errors=DATABASE_ERRORS)


@functools.cache
def broker_client(url: str) -> BrokerAPI:
    """This process's connection to the broker at ``url``, opened on first use."""
    return connect(url)


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
