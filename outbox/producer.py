"""The producer: normal sends, the half/end protocol, and RocketMQ's listener style.

``end_transaction`` never raises for a broker failure after the local transaction has
finished: the database already decided, and the broker's check-back will ask the
transaction_log. It logs a warning and returns False instead.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from broker_embedded import (
    BrokerAPI,
    BrokerError,
    CheckRequest,
    Message,
    Resolution,
    SendResult,
    connect,
)

from .check_back import Answer, answer_check_back
from .instrumentation import carried_context
from .producer_protocol import (
    END_NOT_SENT,
    END_SENT,
    TRANSACTION_ID_PROPERTY,
    answered,
    check_message,
    checking_back,
    ending,
    local_transaction,
    new_transaction_id,
    sending,
    sending_half,
)

log = logging.getLogger(__name__)

__all__ = ["END_NOT_SENT", "END_SENT", "TRANSACTION_ID_PROPERTY", "Producer", "TransactionListener",
           "checking_back", "new_transaction_id"]


class TransactionListener(Protocol):
    """RocketMQ's ``TransactionListener``: run the local transaction, answer check-backs."""

    def execute_local_transaction(self, message: Message, arg: Any) -> Resolution: ...

    def check_local_transaction(self, message: Message) -> Resolution: ...


class Producer:
    """Sends for one producer group, to a ``BrokerAPI`` or a broker URL.

    ``oneway_end=True`` sends the END_TRANSACTION that follows a local transaction in the
    background, as RocketMQ's producer does (``endTransactionOneway``): the caller returns
    right after its DB commit instead of waiting a broker round trip. Nothing is lost
    either way: an END_TRANSACTION that never arrives is settled by check-back.
    ``flush()`` waits for the ones under way; ``close()`` flushes first.

    ``answer_check_backs(answer)`` makes it answer its group's check-backs while it runs
    (RocketMQ's ``TransactionChecker``); ``@transactional_message`` and Django's producer
    call it with the fence on the group's database, so a producer in use answers them.
    """

    def __init__(self, broker: BrokerAPI | str, producer_group: str, *, oneway_end: bool = False) -> None:
        self.broker: BrokerAPI = connect(broker) if isinstance(broker, str) else broker
        self.producer_group = producer_group
        self._ends: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"outbox-end-{producer_group}")
            if oneway_end else None
        )
        self._pending_ends: set[Future[bool]] = set()
        self._lock = threading.Lock()
        self._on_check: Callable[[CheckRequest], None] | None = None

    def send(self, message: Message) -> SendResult:
        """A normal message, visible at once (after its delay, if any).

        Raises ``BrokerUnavailableError`` when the broker cannot be reached."""
        with sending(self.producer_group, message) as stamped:
            return self.broker.send(stamped)

    def send_half(self, message: Message, transaction_id: str) -> SendResult:
        """A half message of ``transaction_id``: stored, invisible until COMMIT.

        Raises ``BrokerUnavailableError`` when the broker cannot be reached: the caller must not
        run its local transaction."""
        with sending_half(self.producer_group, message, transaction_id) as stamped:
            return self.broker.send_half(stamped, producer_group=self.producer_group, transaction_id=transaction_id)

    def end_transaction(self, transaction_id: str, resolution: Resolution, from_check: bool = False) -> bool:
        """Tell the broker how the transaction ended; False (and a warning) if it could not."""
        with ending(self.producer_group, transaction_id, resolution, from_check) as ended:
            self.broker.end_transaction(transaction_id, resolution, producer_group=self.producer_group,
                                        from_check=from_check)
        return ended.sent

    def finish(self, transaction_id: str, resolution: Resolution) -> None:
        """END_TRANSACTION after the local transaction ended: sent now, or in the
        background with ``oneway_end``. Never raises for a broker failure."""
        if self._ends is None:
            self.end_transaction(transaction_id, resolution)
            return
        # In the caller's context (its trace, for instance), not the pool thread's.
        future = self._ends.submit(contextvars.copy_context().run, self.end_transaction, transaction_id, resolution)
        with self._lock:
            self._pending_ends.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[bool]) -> None:
        with self._lock:
            self._pending_ends.discard(future)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for background END_TRANSACTIONs; False if some were still under way."""
        with self._lock:
            pending = list(self._pending_ends)
        return not wait(pending, timeout_s).not_done

    def send_message_in_transaction(self, message: Message, arg: Any, listener: TransactionListener) -> Resolution:
        """RocketMQ's flow: half message, ``listener.execute_local_transaction``, then END.

        An exception from the listener ends the transaction with ROLLBACK and is re-raised.
        """
        transaction_id = new_transaction_id()
        self.send_half(message, transaction_id)
        try:
            with local_transaction(self.producer_group, transaction_id) as local:
                resolution = listener.execute_local_transaction(message, arg)
                local.outcome = resolution.value
        except BaseException:
            self.finish(transaction_id, Resolution.ROLLBACK)
            raise
        self.finish(transaction_id, resolution)
        return resolution

    def register_check_listener(self, listener: TransactionListener) -> None:
        """Answer this group's check-backs with ``listener.check_local_transaction``
        over this producer's own connection (RocketMQ's way; the Celery checker is the
        alternative that needs no live producer). The listener finds the transaction id in
        the message's ``TRANSACTION_ID_PROPERTY`` property; UNKNOWN sends nothing."""

        def on_check(request: CheckRequest) -> None:
            with checking_back(request) as check:
                resolution = listener.check_local_transaction(check_message(request))
                if answered(check, resolution):
                    self.end_transaction(request.transaction_id, resolution, from_check=True)

        self.broker.register_producer(self.producer_group, on_check)

    @property
    def answers_check_backs(self) -> bool:
        """Whether this producer answers its group's check-backs (``answer_check_backs``)."""
        return self._on_check is not None

    def answer_check_backs(self, answer: Answer, *,
                           database_errors: tuple[type[Exception], ...] = ()) -> bool:
        """Answer this group's check-backs while this producer runs, each by ``answer``
        (the fence on the group's database: ``answer(transaction_id, producer_group)``),
        then END_TRANSACTION; the broker sends a check to a connected producer of the group
        before any other checker (the Celery checker answers when none is connected).
        UNKNOWN, or one of ``database_errors``, sends nothing: the broker asks again.

        A check is answered where the broker hands it over: a ``BrokerClient``'s callback
        threads (a RocketMQ 5 client needs the answer there); an in-process
        ``EmbeddedBroker``'s check thread, which a lock wait then holds up to the fence's
        lock timeout.

        Once per producer: False (nothing changed) if it already answers them. A broker that
        cannot be reached now does not fail the call: the producer offers itself again on
        its next connection."""
        with self._lock:
            if self._on_check is not None:
                return False

            def on_check(request: CheckRequest) -> None:
                answer_check_back(answer, lambda: self.broker, request.producer_group, request.transaction_id,
                                  request.message.message_id, context=carried_context(request.message.properties),
                                  database_errors=database_errors)

            self._on_check = on_check
        try:
            self.broker.register_producer(self.producer_group, on_check)
        except BrokerError as exc:
            log.info("producer group %s: broker not reachable (%s); it answers check-backs once connected",
                     self.producer_group, exc)
        return True

    def stop_answering_check_backs(self) -> None:
        """Undo ``answer_check_backs`` (a no-op if it was not called)."""
        with self._lock:
            on_check, self._on_check = self._on_check, None
        if on_check is not None:
            try:
                self.broker.unregister_producer(self.producer_group, on_check)
            except BrokerError:
                pass  # the broker forgets a connection's producers when it closes

    def close(self) -> None:
        """Flush background END_TRANSACTIONs, stop answering check-backs, then close the
        broker connection."""
        self.stop_answering_check_backs()
        if self._ends is not None:
            self.flush()
            self._ends.shutdown()
        self.broker.close()
