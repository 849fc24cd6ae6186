"""Resolving transactions from Django by the fencing rule: parked ones, and check-backs
answered in-process. Only transactions of the producer groups this project owns
(``outbox_settings().owned_groups``) are fenced here, each under its own group and on its
own database; another group's raises ``ForeignGroupError`` before anything is written."""

from __future__ import annotations

from collections.abc import Callable

from django.db import DatabaseError

from broker_embedded import EndTransactionResult, ParkedTransaction, Resolution
from broker_embedded.errors import UnknownTransactionError

from ...producer import Producer
from .conf import ForeignGroupError, outbox_settings, producer
from .recorder import fenced_answer


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
    """Answer ``sender``'s group's check-backs from this process with ``fenced_answer`` on
    ``using`` (``Producer.answer_check_backs``). Returns a function that stops it.

    This project's own producer (``conf.producer()``) already answers its group's
    check-backs on the group's alias: this is for another producer, or another alias."""
    answering = sender or producer()
    answering.stop_answering_check_backs()
    answering.answer_check_backs(
        lambda transaction_id, group: fenced_answer(transaction_id, producer_group=group, using=using),
        database_errors=(DatabaseError,))
    return answering.stop_answering_check_backs
