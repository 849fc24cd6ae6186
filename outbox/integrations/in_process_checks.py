"""Check-backs answered by the fence in a long-running process, over the producer's own
broker connection.

A RocketMQ 5 cluster (``rocketmq5://``) sends check-backs to a live producer client, not to
a Celery queue: call ``answer_check_backs(producer)`` in the process that runs the producer
(a web server, a worker). Each check-back runs what the Celery check task runs
(``answer_check_back`` with the fence on the group's transaction_log), so the answer is the
same whichever way the check came. It needs the ``celery`` extra, where that body lives.
"""

from __future__ import annotations

from broker_embedded import CheckRequest
from broker_embedded.api import CheckCallback

from ..producer import Producer
from ..settings import OutboxSettings
from .celery.check_back import Answer, answer_check_back, fence_answer


def answer_check_backs(producer: Producer, settings: OutboxSettings | None = None, *,
                       answer: Answer | None = None) -> CheckCallback:
    """Answer ``producer``'s group's check-backs in this process with the fence on the
    group's database (``settings``, default ``OutboxSettings.from_env()``; or ``answer``).
    Returns the callback, for ``producer.broker.unregister_producer``."""
    fence = answer or fence_answer(settings or OutboxSettings.from_env())

    def on_check(request: CheckRequest) -> None:
        answer_check_back(fence, lambda: producer.broker, request.producer_group, request.transaction_id,
                          request.message.message_id)

    producer.broker.register_producer(producer.producer_group, on_check)
    return on_check
