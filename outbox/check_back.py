"""A check-back's one body, ORM-free: the fence decides, END_TRANSACTION tells the broker.

Every way a check-back is answered runs ``fenced_resolution`` inside a ``CHECK_BACK``
operation (logged, counted, traced), and sends END_TRANSACTION unless the answer is
UNKNOWN: through ``answer_check_back`` the Celery task (the SQLAlchemy flavour's
``register(app)``, Django's autodiscovered task), a running producer that answers its own
group's check-backs (``Producer.answer_check_backs``; wired by ``@transactional_message``
and Django's producer), ``outbox check`` and ``manage.py outbox_check``;
``AsyncProducer.answer_check_backs`` runs the same two steps on its event loop. So the
answer is the same whichever way the check came. Each integration passes its fence
(``Answer``) and its ORM's error family (``TransactionLogRecorder.database_errors``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from broker_embedded import BrokerAPI, Resolution

from . import instrumentation
from .producer_protocol import ending

log = logging.getLogger(__name__)

#: What a check-back asks: ``answer(transaction_id, producer_group)``, by the fence.
Answer = Callable[[str, str], Resolution]


def checking(producer_group: str, transaction_id: str, message_id: str | None,
             context: Mapping[str, str] | None = None) -> instrumentation.Operation:
    """The ``CHECK_BACK`` operation around one check-back's answer, logged."""
    log.info("check-back of %s (group %s, message %s)", transaction_id, producer_group, message_id)
    return instrumentation.operation(instrumentation.CHECK_BACK, producer_group=producer_group,
                                     transaction_id=transaction_id, message_id=message_id,
                                     context=dict(context or {}))


def fenced_resolution(answer: Answer, producer_group: str, transaction_id: str,
                      database_errors: tuple[type[Exception], ...] = ()) -> Resolution:
    """``answer`` (the fencing check); UNKNOWN, logged, for one of ``database_errors``
    (e.g. the database is unreachable): the broker checks again at its next interval."""
    try:
        return answer(transaction_id, producer_group)
    except database_errors as exc:
        log.warning("check of %s: database error (%s); answering nothing, the broker will check again",
                    transaction_id, exc)
        return Resolution.UNKNOWN


def answer_check_back(answer: Answer, broker: Callable[[], BrokerAPI] | None, producer_group: str,
                      transaction_id: str, message_id: str | None = None, *,
                      context: Mapping[str, str] | None = None,
                      database_errors: tuple[type[Exception], ...] = ()) -> Resolution:
    """Answer one check-back: ``answer`` (the fencing check), then END_TRANSACTION to
    ``broker()`` (None: the answer is only returned, as ``outbox check`` without ``--send``).

    ``message_id`` (the half message the broker checked) is only logged and traced, with the
    half message's trace ``context``: the answer is per transaction. UNKNOWN (a lock,
    statement or connect timeout; one of ``database_errors``) sends nothing; the broker
    checks again at its next interval."""
    with checking(producer_group, transaction_id, message_id, context) as check:
        resolution = fenced_resolution(answer, producer_group, transaction_id, database_errors)
        check.outcome = resolution.value
        if broker is not None and resolution is not Resolution.UNKNOWN:  # not delivered: logged, checked again
            with ending(producer_group, transaction_id, resolution, from_check=True):
                broker().end_transaction(transaction_id, resolution, producer_group=producer_group,
                                         from_check=True)
        return resolution
