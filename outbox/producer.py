"""The producer: normal sends, the half/end protocol, and RocketMQ's listener style.

``end_transaction`` never raises for a broker failure after the local transaction has
finished: the database already decided, and the broker's check-back will ask the
transaction_log. It logs a warning and returns False instead.

Over a ``BrokerClient`` (``tcp://``) the decorators wait for one broker round trip at
most: ``start_half`` puts the half message on the wire and returns, the local transaction
runs meanwhile, and ``await_halves`` waits for the acknowledgment just before the DB
commit, reading it in the calling thread; the END_TRANSACTION after the commit is written
without waiting for its answer (``oneway_end``, RocketMQ's ``endTransactionOneway``),
which the next call reads on its way (or ``flush``, or the client's reader thread once
the client is quiet). Other brokers (an in-process
``EmbeddedBroker``, a RocketMQ 5 cluster) are called at once, waiting as ``send_half`` does.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from broker_embedded import (
    BrokerAPI,
    BrokerClient,
    BrokerError,
    CheckRequest,
    Message,
    Resolution,
    SendResult,
    connect,
)
from broker_embedded import errors as broker_errors

from . import instrumentation
from .check_back import Answer, answer_check_back
from .errors import BrokerUnavailableError
from .instrumentation import END_TRANSACTION, SEND_HALF, carried_context
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
from .stored import PROBE_EVERY_S, BrokerDown, MessageHeld, OnBrokerDown

log = logging.getLogger(__name__)
S = TypeVar("S")

__all__ = ["END_NOT_SENT", "END_SENT", "TRANSACTION_ID_PROPERTY", "Producer", "TransactionListener",
           "checking_back", "new_transaction_id"]


class TransactionListener(Protocol):
    """RocketMQ's ``TransactionListener``: run the local transaction, answer check-backs."""

    def execute_local_transaction(self, message: Message, arg: Any) -> Resolution: ...

    def check_local_transaction(self, message: Message) -> Resolution: ...


class Producer:
    """Sends for one producer group, to a ``BrokerAPI`` or a broker URL.

    ``oneway_end`` (the default) sends the END_TRANSACTION that follows a local transaction
    without waiting for the broker's answer, as RocketMQ's producer does
    (``endTransactionOneway``): the caller returns right after its DB commit. An END that
    never arrives (the broker or the connection died) is settled by check-back, which
    delivers the message later (after the broker's transaction timeout). ``flush()`` waits
    for the ENDs under way; ``close()`` and the interpreter's exit flush them.
    ``oneway_end=False`` waits for each END: the message is visible when the call returns.

    ``on_broker_down`` says what a call does when the broker cannot take its half message
    in time: ``"raise"`` (the default) raises ``BrokerUnavailableError`` and nothing of the
    call commits; ``"store"`` lets the call commit with its messages stored in its own
    database, for the relay to hand over later (``outbox.stored``); while the broker is
    down a thread asks it every ``outbox.stored.PROBE_EVERY_S`` whether it answers again,
    so calls go to it again within about a second of its return.

    ``answer_check_backs(answer)`` makes it answer its group's check-backs while it runs
    (RocketMQ's ``TransactionChecker``); ``@transactional_message`` and Django's producer
    call it with the fence on the group's database, so a producer in use answers them.
    """

    def __init__(self, broker: BrokerAPI | str, producer_group: str, *, oneway_end: bool = True,
                 on_broker_down: OnBrokerDown = "raise") -> None:
        self.broker: BrokerAPI = connect(broker) if isinstance(broker, str) else broker
        self.producer_group = producer_group
        self.oneway_end = oneway_end
        #: ``on_broker_down``, the outage a store-mode producer is in, and the transactions
        #: whose messages were stored.
        self.broker_down = BrokerDown(on_broker_down, producer_group, self._start_probe)
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None
        #: The broker when it is a ``BrokerClient``: requests go on the wire without waiting.
        self._client = self.broker if isinstance(self.broker, BrokerClient) else None
        self._halves: dict[str, list[Future[SendResult]]] = {}
        self._pending_ends: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._on_check: Callable[[CheckRequest], None] | None = None
        if oneway_end:
            _flushed_at_exit.add(self)

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

    def start_half(self, message: Message, transaction_id: str) -> Future[SendResult]:
        """``send_half`` without waiting for the broker (over a ``BrokerClient``; other
        brokers store it now): the half message is on the wire when this returns, and the
        ``Future`` completes with its acknowledgment or ``BrokerUnavailableError``. The local
        transaction may run meanwhile; ``await_halves(transaction_id)`` must succeed before
        its commit. A broker that cannot be reached raises ``BrokerUnavailableError`` now
        (in store mode the ``Future`` holds it, and nothing is sent while the producer
        backs off after an outage)."""
        if self.broker_down.skipping():
            return self.hold(message, transaction_id)
        if self._client is None:
            half: Future[SendResult] = Future()
            try:
                half.set_result(self.send_half(message, transaction_id))
            except BrokerUnavailableError as exc:
                if not self.broker_down.stores:
                    raise
                half.set_exception(exc)
        else:
            client = self._client
            half = self._under_way(
                SEND_HALF, functools.partial(sending_half, self.producer_group, message, transaction_id), message,
                lambda stamped, future: client.start_send_half(stamped, producer_group=self.producer_group,
                                                               transaction_id=transaction_id, future=future,
                                                               due=False))
            if not self.broker_down.stores and half.done() and (error := half.exception()) is not None:
                raise error
        with self._lock:
            self._halves.setdefault(transaction_id, []).append(half)
        return half

    def hold(self, message: Message, transaction_id: str) -> Future[SendResult]:
        """Store mode: keep ``message`` of ``transaction_id`` out of the broker (it is down,
        or its message group's stored messages wait for the relay); ``await_halves`` then
        tells the caller to store the transaction's messages."""
        held: Future[SendResult] = Future()
        held.set_exception(MessageHeld(message, transaction_id))
        with self._lock:
            self._halves.setdefault(transaction_id, []).append(held)
        return held

    def await_halves(self, transaction_id: str) -> bool:
        """Wait for the half messages of ``transaction_id`` sent by ``start_half``, each up
        to the broker client's request timeout; call it just before the DB commit. True
        when the broker holds them all. If one was not stored (or not acknowledged in
        time): ``BrokerUnavailableError`` (the local transaction must roll back), or in
        store mode False: the caller stores the transaction's messages in its transaction
        (``outbox.stored.store_messages``) and commits; no END follows the commit."""
        with self._lock:
            halves = self._halves.pop(transaction_id, [])
        try:
            for half in halves:
                if not self._wait(half, self._answer_timeout_s):
                    raise BrokerUnavailableError(
                        f"a half message of transaction {transaction_id} was not acknowledged within "
                        f"{self._answer_timeout_s:.1f}s")
                half.result()
        except BrokerUnavailableError as exc:
            self.broker_down.not_taken(exc, transaction_id)
            return False
        finally:
            if unanswered := [half for half in halves if not half.done()]:
                with self._lock:  # the ROLLBACK that follows waits for them (finish)
                    self._halves.setdefault(transaction_id, []).extend(unanswered)
        if halves:
            self.broker_down.answered()
        return True

    @property
    def _answer_timeout_s(self) -> float | None:
        return self._client.timeout_s if self._client is not None else None

    def _wait(self, answer: Future[Any], timeout_s: float | None) -> bool:
        """Wait for the answer of a request this producer started, reading it in this thread
        over a ``BrokerClient`` (its reader thread leaves it to us); whether it came in time."""
        if self._client is not None:
            return self._client.wait(answer, timeout_s)
        return not wait([answer], timeout_s).not_done

    def _wait_all(self, answers: list[Future[Any]], timeout_s: float | None) -> bool:
        """``_wait`` for each of ``answers`` within ``timeout_s`` in all."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for answer in answers:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._wait(answer, remaining):
                return False
        return True

    def end_transaction(self, transaction_id: str, resolution: Resolution, from_check: bool = False) -> bool:
        """Tell the broker how the transaction ended; False (and a warning) if it could not."""
        with ending(self.producer_group, transaction_id, resolution, from_check) as ended:
            self.broker.end_transaction(transaction_id, resolution, producer_group=self.producer_group,
                                        from_check=from_check)
        return ended.sent

    def finish(self, transaction_id: str, resolution: Resolution) -> None:
        """END_TRANSACTION after the local transaction ended, once the transaction's half
        messages not yet awaited are answered (an END never overtakes its half): written
        without waiting for the answer with ``oneway_end`` over a ``BrokerClient``, sent and
        waited for otherwise. Never raises for a broker failure."""
        with self._lock:
            unanswered = self._halves.pop(transaction_id, [])
        if not self.broker_down.ends(transaction_id, resolution):
            return  # its messages are in the database: the relay hands them over
        if unanswered:  # a local transaction that failed before awaiting them
            self._wait_all(unanswered, self._answer_timeout_s)
        if not self.oneway_end or self._client is None:
            self.end_transaction(transaction_id, resolution)
            return
        client = self._client
        # observed, its answer ends the step (a span, a duration): read as soon as it comes
        due = instrumentation.observed(END_TRANSACTION)
        end = self._under_way(
            END_TRANSACTION, functools.partial(ending, self.producer_group, transaction_id, resolution), None,
            lambda _, future: client.start_end_transaction(transaction_id, resolution, oneway=True,
                                                           producer_group=self.producer_group, future=future,
                                                           due=due))
        with self._lock:
            self._pending_ends.add(end)
        end.add_done_callback(self._forget)

    def _under_way(self, event: str, make_step: Callable[[], AbstractContextManager[Any]], unobserved: Any,
                   start: Callable[[Any, Future[S] | None], Future[S]]) -> Future[S]:
        """The step ``make_step()`` makes (a ``producer_protocol`` block announcing
        ``event``) around the request ``start`` writes, ended when its answer arrives (in
        the thread that reads it: the client's reader thread, or a caller reading for its own answer): the ``Future`` of the answer, or of the error the block
        raises. ``start`` is given what the block yields and the ``Future`` to complete (None:
        its own).

        Observed, the block runs in a copy of the caller's context, so what its listeners make
        current (a span) stays out of the caller's; it ends in a done-callback of the client's
        ``Future``. Unobserved, nothing has to run on success: ``start`` is given
        ``unobserved`` (what the block would yield) and a ``_Settled`` future, which the
        thread reading the answer completes with it, or with what the block makes of an error."""
        if not instrumentation.observed(event):
            settled: Future[S] = _Settled(functools.partial(_through, make_step))
            try:
                return start(unobserved, settled)
            except Exception as exc:
                settled.set_exception(exc)
                return settled
        step = make_step()
        context = contextvars.copy_context()
        outcome: Future[S] = Future()

        def end(error: BaseException | None, result: Any = None) -> None:
            try:
                kept = context.run(step.__exit__, type(error) if error else None, error,
                                   error.__traceback__ if error else None)
            except BaseException as raised:  # the block's own error for the failure
                outcome.set_exception(raised)
                return
            if error is None or kept:
                outcome.set_result(result)
            else:
                outcome.set_exception(error)

        stamped = context.run(step.__enter__)
        try:
            answer = start(stamped, None)
        except Exception as exc:
            end(exc)
            return outcome
        answer.add_done_callback(lambda done: end(done.exception(), None if done.exception() else done.result()))
        return outcome

    def _forget(self, end: Future[Any]) -> None:
        with self._lock:
            self._pending_ends.discard(end)
        if (error := end.exception()) is not None:
            log.error("END_TRANSACTION failed", exc_info=error)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the oneway END_TRANSACTIONs under way (None: up to the broker client's
        request timeout); False if some were still under way. The broker answers one once it
        is durable, so after ``flush()`` their messages are visible."""
        with self._lock:
            pending = list(self._pending_ends)
        return self._wait_all(pending, self._answer_timeout_s if timeout_s is None else timeout_s)

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

    def _start_probe(self) -> None:
        if self._prober is None or not self._prober.is_alive():
            self._prober = threading.Thread(target=self._probe, name=f"outbox-probe-{self.producer_group}",
                                            daemon=True)
            self._prober.start()

    def _probe(self) -> None:
        """Store mode, during an outage: ask the broker every ``PROBE_EVERY_S`` until it
        answers (any answer but ``BrokerUnavailableError``), then end the outage."""
        while self.broker_down.down and not self._closed.wait(PROBE_EVERY_S):
            try:
                self.broker.list_topics()
            except broker_errors.BrokerUnavailableError:  # the client's own error, not translated here
                continue
            except Exception:  # an answer, if a refusal: the next call meets it itself
                pass
            self.broker_down.answered()

    def close(self) -> None:
        """Stop answering check-backs, flush the oneway END_TRANSACTIONs, then close the
        broker connection."""
        self._closed.set()
        self.stop_answering_check_backs()
        self.flush()
        _flushed_at_exit.discard(self)
        self.broker.close()


class _Settled(Future[S]):
    """A request's ``Future`` when nobody observes its step: its failure becomes what
    ``failed`` makes of it (in the thread reading the answer): the error ``failed`` raises
    (the outbox's typed error), or, if it returns, a result (the step swallowed it)."""

    def __init__(self, failed: Callable[[BaseException], Any]) -> None:
        super().__init__()
        self._failed = failed
        self._settled = False

    def done(self) -> bool:
        """Whether the answer is in, read without the ``Future``'s lock (the thread waiting
        for it asks after every read of the socket). It turns True as the answer is set,
        before the done-callbacks run (a sleeper they wake finds it done); ``result()`` and
        ``exception()`` wait the moment until the value is in. It is never cancelled (it
        is on the wire once started) and settles only through the two methods below."""
        return self._settled

    def set_result(self, result: S) -> None:
        self._settled = True
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settled = True
        try:
            result: Any = self._failed(exception) if exception is not None else None
        except BaseException as raised:
            super().set_exception(raised)
        else:
            super().set_result(result)


def _through(make_step: Callable[[], AbstractContextManager[Any]], error: BaseException) -> None:
    """``error`` raised in a new step: the step's error for it raised, or None if the step
    swallows it."""
    with make_step():
        raise error


#: Producers whose oneway END_TRANSACTIONs are flushed when the interpreter exits.
_flushed_at_exit: weakref.WeakSet[Producer] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """A process that exits right after a call still delivers that call's END_TRANSACTION
    (the client's reader thread runs until the interpreter's end)."""
    for producer in list(_flushed_at_exit):
        producer.flush()
