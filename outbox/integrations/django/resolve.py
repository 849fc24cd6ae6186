"""Resolving transactions from Django by the fencing rule: parked ones, and check-backs
answered in-process. Only transactions of the producer groups this project owns
(``outbox_settings().owned_groups``) are fenced here, each under its own group and on its
own database; another group's raises ``ForeignGroupError`` before anything is written."""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker_embedded import CheckRequest, EndTransactionResult, ParkedTransaction, Resolution
from broker_embedded.errors import UnknownTransactionError

from ...producer import Producer, checking_back
from .conf import ForeignGroupError, outbox_settings, producer
from .fence import fenced_answer


def parked_transaction(transaction_id: str) -> ParkedTransaction:
    """The broker's parked entry for ``transaction_id`` (it names the producer group);
    ``UnknownTransactionError`` if that transaction is not parked."""
    for parked in producer().broker.list_parked():
        if parked.transaction_id == transaction_id:
            return parked
    raise UnknownTransactionError(f"transaction {transaction_id} is not parked")


def broker_transaction(transaction_id: str, producer_group: str) -> EndTransactionResult:
    """The broker's state and message ids of ``transaction_id`` of ``producer_group``: an
    END_TRANSACTION with ``Resolution.UNKNOWN`` records nothing and answers them.
    ``UnknownTransactionError`` if the broker holds no such transaction of that group."""
    return producer().broker.end_transaction(transaction_id, Resolution.UNKNOWN, producer_group=producer_group)


def require_group(transaction_id: str, producer_group: str) -> None:
    """``ForeignGroupError`` if the broker holds ``transaction_id`` under another producer
    group than ``producer_group``. An id the broker does not know at all passes: fencing it
    only stops a local transaction of this group that has not started."""
    try:
        broker_transaction(transaction_id, producer_group)
    except UnknownTransactionError:
        try:
            producer().broker.transaction_state(transaction_id)
        except UnknownTransactionError:
            return
        raise ForeignGroupError(f"the broker holds transaction {transaction_id} under another producer "
                                f"group than {producer_group!r}: its own service checks it") from None


def resolve_parked(transaction_id: str, using: str | None = None) -> EndTransactionResult | None:
    """Resolve a parked transaction as its group's transaction_log decides; None if UNKNOWN.

    The group comes from the broker's parked entry and must be owned here
    (``ForeignGroupError`` otherwise); the fence runs on ``using`` or that group's alias.
    This process runs the fenced check itself, so the broker records its answer as given
    (``force``) instead of asking a checker of the group."""
    group = parked_transaction(transaction_id).producer_group
    alias = outbox_settings().database_for(group)
    resolution = fenced_answer(transaction_id, producer_group=group, using=using or alias)
    if resolution is Resolution.UNKNOWN:
        return None
    return producer().broker.resolve_parked(transaction_id, force=resolution)


def answer_check_backs(using: str = "default", sender: Producer | None = None) -> Callable[[], None]:
    """Answer this producer group's check-backs from this process (RocketMQ's way, an
    alternative to the Celery checker): each check is answered by ``fenced_answer`` on its
    own thread, so a lock wait never holds up the broker. Returns a function that stops it."""
    answering = sender or producer()

    def answer(request: CheckRequest) -> None:
        with checking_back(request) as check:
            resolution = fenced_answer(request.transaction_id, producer_group=answering.producer_group,
                                       using=using)
            check.outcome = resolution.value
            if resolution is not Resolution.UNKNOWN:
                answering.end_transaction(request.transaction_id, resolution, from_check=True)

    def on_check(request: CheckRequest) -> None:
        threading.Thread(target=answer, args=(request,), name=f"outbox-check-{request.transaction_id}",
                         daemon=True).start()

    answering.broker.register_producer(answering.producer_group, on_check)
    return lambda: answering.broker.unregister_producer(answering.producer_group, on_check)
