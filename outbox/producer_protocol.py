"""What a producer does around its broker calls, without doing any I/O.

``outbox.producer.Producer`` (blocking) and ``outbox.aio_producer.AsyncProducer``
(asyncio) are two drivers of these steps, in the way httpx's sync and async clients share
one sans-I/O core: each step is a context manager that announces the instrumentation
operation (``outbox.instrumentation``), hands the driver what to send, and turns the
broker's answer or failure into the outbox's result::

    with sending_half(group, message, transaction_id) as stamped:
        return broker.send_half(stamped, ...)          # or: await broker.send_half(...)

so both producers send the same messages, raise the same errors and announce the same
events (metrics and tracing see async producers as they see blocking ones).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator

import msgspec

from broker_embedded import BrokerError, CheckRequest, Message, Resolution
from broker_embedded import errors as broker_errors

from . import instrumentation
from .errors import BrokerUnavailableError

log = logging.getLogger(__name__)

#: The message property carrying the transaction id: on the message a check listener is
#: given, and on each broker transaction of the ``rocketmq5://`` client (its
#: ``TRANSACTION_PROPERTY``, stored in the cluster), so a check-back through a RocketMQ 5
#: cluster carries it under one name. The embedded broker keeps it in its records' own
#: ``TRAN_ID`` (a storage field, not a message property).
TRANSACTION_ID_PROPERTY = "HALFMOON_TRANSACTION_ID"

#: ``END_TRANSACTION`` outcomes: the broker got it, or not (check-back will settle it).
END_SENT = "sent"
END_NOT_SENT = "not_sent"


def new_transaction_id() -> str:
    """A unique transaction id (32 hex digits)."""
    return uuid.uuid4().hex


@contextlib.contextmanager
def sending(producer_group: str, message: Message) -> Iterator[Message]:
    """A normal send: yields the message to send; ``BrokerUnavailableError`` if the broker
    cannot be reached."""
    with instrumentation.operation(instrumentation.SEND, producer_group=producer_group, message=message) as op:
        try:
            yield instrumentation.stamped(message, op)
        except broker_errors.BrokerUnavailableError as exc:
            raise BrokerUnavailableError(f"message {message.message_id} not sent: {exc}") from exc


@contextlib.contextmanager
def sending_half(producer_group: str, message: Message, transaction_id: str) -> Iterator[Message]:
    """A half message of ``transaction_id``: yields the message to send;
    ``BrokerUnavailableError`` if the broker cannot be reached (the local transaction must
    not run, or must not commit)."""
    with instrumentation.operation(instrumentation.SEND_HALF, producer_group=producer_group,
                                   transaction_id=transaction_id, message=message) as op:
        try:
            yield instrumentation.stamped(message, op)
        except broker_errors.BrokerUnavailableError as exc:
            raise BrokerUnavailableError(
                f"half message {message.message_id} of transaction {transaction_id} not sent: {exc}"
            ) from exc


@dataclasses.dataclass
class Ending:
    """The result of an ``ending`` block: whether the broker got the END_TRANSACTION."""

    sent: bool = False


@contextlib.contextmanager
def ending(producer_group: str, transaction_id: str, resolution: Resolution,
           from_check: bool = False) -> Iterator[Ending]:
    """END_TRANSACTION: a broker failure inside the block is logged and swallowed (the
    check-back will settle the transaction); ``Ending.sent`` tells which it was."""
    result = Ending()
    with instrumentation.operation(instrumentation.END_TRANSACTION, producer_group=producer_group,
                                   transaction_id=transaction_id, resolution=resolution,
                                   from_check=from_check) as op:
        try:
            yield result
        except BrokerError as exc:
            log.warning("END_TRANSACTION %s for %s not delivered (%s: %s); check-back will resolve it",
                        resolution.value, transaction_id, type(exc).__name__, exc)
            op.outcome = END_NOT_SENT
            return
        result.sent = True
        op.outcome = END_SENT


def local_transaction(producer_group: str, transaction_id: str) -> instrumentation.Operation:
    """The ``LOCAL_TRANSACTION`` operation; its outcome is the resolution's value."""
    return instrumentation.operation(instrumentation.LOCAL_TRANSACTION, producer_group=producer_group,
                                     transaction_id=transaction_id)


def checking_back(request: CheckRequest) -> instrumentation.Operation:
    """The ``CHECK_BACK`` operation of answering ``request`` in this process."""
    return instrumentation.operation(
        instrumentation.CHECK_BACK, producer_group=request.producer_group,
        transaction_id=request.transaction_id, message_id=request.message.message_id,
        context=instrumentation.carried_context(request.message.properties))


def check_message(request: CheckRequest) -> Message:
    """The message a check listener is given: the half message, with its transaction id
    in the ``TRANSACTION_ID_PROPERTY`` property."""
    properties = {**request.message.properties, TRANSACTION_ID_PROPERTY: request.transaction_id}
    return msgspec.structs.replace(request.message, properties=properties)


def answered(check: instrumentation.Operation, resolution: Resolution) -> bool:
    """Record a check listener's answer; whether it settles the transaction (UNKNOWN
    sends nothing, and the broker asks again later)."""
    check.outcome = resolution.value
    return resolution is not Resolution.UNKNOWN
