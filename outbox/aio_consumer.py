"""``arun_consumer``: ``run_consumer`` for asyncio, over ``AsyncBrokerClient``.

The same loop and rules as ``outbox.consumer`` (its ``ConsumerRun``): receive with a long
poll, await the handler, ack; a handler that raises leaves its message un-acked, so the
broker redelivers it with a growing back-off and dead-letters it after
``max_delivery_attempts``; while the broker is down it backs off the same way; it
announces the same ``DELIVERY`` events.

Two ways to stop it, neither loses a message:

* ``stop.set()`` (graceful): no new receive; the handler in progress finishes and it is
  acked with the others of its batch already handled; the messages of its batch not handed to the handler yet are released (made
  visible again at once, for the next consumer); then it returns. A long poll under way
  is not abandoned: stopping takes up to ``wait_s`` more.
* cancelling its task (immediate): the handler in progress is cancelled at its next
  ``await`` and not acked (an ``idempotent_consumer``'s transaction rolls back), so that
  message, and the rest of its batch, come back after ``invisible_duration_s`` (those of
  the batch already handled too, unless ``batch_acks=False``: their duplicate check skips them).

The messages of a batch that were handled are acked together in one ``ack_many`` after the
batch (``batch_acks=False``: each right after its handler).
  ``CancelledError`` propagates, as asyncio expects.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence

from broker_embedded import AsyncBrokerClient, ReceivedMessage
from broker_embedded.errors import BrokerError, BrokerUnavailableError

from .consumer import ACK_ERRORS, RELEASED_INVISIBLE_S, ConsumerRun
from .errors import ConfigurationError

#: An async handler; False means the message was skipped (a duplicate), anything else handled.
AsyncHandler = Callable[[ReceivedMessage], Awaitable[bool | None]]


async def arun_consumer(
    broker: AsyncBrokerClient,
    group: str,
    topic: str,
    handler: AsyncHandler,
    stop: asyncio.Event | None = None,
    batch_size: int = 16,
    invisible_duration_s: float = 30.0,
    wait_s: float = 1.0,
    batch_acks: bool = True,
    filter_expression: str = "*",
    filter_type: str = "TAG",
) -> int:
    """Receive, await ``handler`` and ack until ``stop`` is set (or the task is cancelled);
    returns how many messages were handled. ``handler`` must be a coroutine function
    (``ConfigurationError`` otherwise): a blocking handler would stall the event loop.
    ``filter_expression`` and ``filter_type``: the group's subscription, as for ``run_consumer``."""
    if not inspect.iscoroutinefunction(handler):
        raise ConfigurationError(f"arun_consumer takes an async handler (async def), not {handler!r}; "
                                 "a sync handler runs with outbox.run_consumer")
    stop = stop or asyncio.Event()
    run = ConsumerRun(group, topic)
    try:
        while not stop.is_set():
            try:
                batch = await broker.receive(group, topic, max_messages=batch_size,
                                             invisible_duration_s=invisible_duration_s, wait_s=wait_s,
                                             filter_expression=filter_expression, filter_type=filter_type)
            except BrokerUnavailableError as exc:
                await _pause(stop, run.outage.failed(exc))
                continue
            run.outage.recovered()
            handled: list[ReceivedMessage] = []
            for index, received in enumerate(batch):
                if stop.is_set():
                    await _release(broker, run, batch[index:])
                    break
                if await _deliver(run, handler, received):
                    handled.append(received)
                    if not batch_acks:
                        await _ack(broker, run, handled)
                        handled = []
            await _ack(broker, run, handled)
    finally:
        run.stopped()
    return run.handled


async def _deliver(run: ConsumerRun, handler: AsyncHandler, received: ReceivedMessage) -> bool:
    """Hand ``received`` to the handler; whether it was handled (to ack)."""
    with run.delivering(received) as delivery:
        try:
            result = await handler(received)
        except Exception:
            run.failed(received, delivery)
            return False
        run.succeeded(delivery, result)
        return True


async def _ack(broker: AsyncBrokerClient, run: ConsumerRun, handled: list[ReceivedMessage]) -> None:
    """Ack the handled messages in one request (none: no request)."""
    if not handled:
        return
    try:
        outcomes: Sequence[BrokerError | None] = await broker.ack_many(
            run.group, [r.receipt_handle for r in handled])
    except ACK_ERRORS as exc:
        outcomes = [exc] * len(handled)
    run.acked(handled, outcomes)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def _release(broker: AsyncBrokerClient, run: ConsumerRun, unhandled: Sequence[ReceivedMessage]) -> None:
    """``outbox.consumer._release``, awaited."""
    for received in unhandled:
        try:
            await broker.change_invisible_duration(run.group, received.receipt_handle, RELEASED_INVISIBLE_S)
        except BrokerError as exc:
            run.not_released(received, exc)
