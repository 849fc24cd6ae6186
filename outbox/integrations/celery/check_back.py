"""The check-back task, ORM-free: its name, its queues, its one body, and its registration
in an app.

The broker's Celery checker sends task ``outbox.check_transaction(producer_group,
transaction_id, message_id)`` to queue ``outbox.check.<producer group>``. Whichever Celery
app runs it, the body is ``outbox.check_back.answer_check_back`` with the integration's own
fence and error family: the SQLAlchemy flavour's ``register(app)``
(``outbox.integrations.sqlalchemy.tasks``, also the standalone
``outbox.integrations.celery.worker``), or a Django project's autodiscovered
``outbox.integrations.django.tasks``. Nothing here imports an ORM.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, current_task

from broker_embedded import BrokerAPI, connect

from ... import instrumentation
from ...check_back import Answer, answer_check_back

CHECK_TASK = "outbox.check_transaction"

#: Options of the check task in any app: no result to store (the broker gets the answer),
#: acknowledged after it ran (a worker killed mid-check leaves it to another worker).
TASK_OPTIONS: dict[str, Any] = {"name": CHECK_TASK, "ignore_result": True, "acks_late": True}


#: The check task's message header that carries the half message's
#: ``outbox.instrumentation.CONTEXT_PROPERTIES`` (a mapping), when it has any.
CONTEXT_HEADER = "outbox_context"

#: The check task's body: ``(producer_group, transaction_id, message_id=None) -> answer``.
CheckTask = Callable[..., str]


def check_queue(producer_group: str) -> str:
    """The Celery queue of a producer group's check-backs."""
    return f"outbox.check.{producer_group}"


def carried_context() -> dict[str, str]:
    """The half message's ``CONTEXT_PROPERTIES`` the running check task carries in its
    ``CONTEXT_HEADER`` (none when its producer does not trace, or called directly)."""
    request = current_task.request if current_task else None
    carried = (request.headers or {}).get(CONTEXT_HEADER) if request else None
    return instrumentation.carried_context(carried) if isinstance(carried, Mapping) else {}


@functools.cache
def broker_client(url: str) -> BrokerAPI:
    """This process's connection to the broker at ``url``, opened on first use."""
    return connect(url)


def check_task(answer: Answer, database_errors: tuple[type[Exception], ...],
               broker: Callable[[], BrokerAPI]) -> CheckTask:
    """The check task's body for an integration: its fence ``answer``, the ORM errors that
    answer UNKNOWN, and the broker that receives the answer; traced with the context the
    task carries."""

    def check_transaction_task(producer_group: str, transaction_id: str, message_id: str | None = None) -> str:
        """Answer one check-back of the broker (``outbox.check_back.answer_check_back``)."""
        return answer_check_back(answer, broker, producer_group, transaction_id, message_id,
                                 context=carried_context(), database_errors=database_errors).value

    return check_transaction_task


def register_check_task(app: Celery, answer: Answer, database_errors: tuple[type[Exception], ...],
                        broker_url: str) -> Any:
    """Register ``check_task`` in ``app`` alone (not shared with other apps); returns the task."""
    body = check_task(answer, database_errors, lambda: broker_client(broker_url))
    return app.task(**TASK_OPTIONS, shared=False)(body)
