"""``AsyncProducer``: the producer for asyncio code, over ``AsyncBrokerClient``.

The same sends, errors and instrumentation events as ``outbox.producer.Producer`` (both
drive ``outbox.producer_protocol``), with coroutines. Two things are its own:

* ``start_half`` sends a half message as a task, so the local transaction can run while
  the broker stores it (the caller awaits ``await_halves`` before its DB commit);
* ``finish`` starts END_TRANSACTION as a task that first waits for the transaction's
  half message, so a ROLLBACK can never overtake its half. Awaiting it waits for the
  broker; with ``oneway_end=True`` the decorator and ``send_message_in_transaction`` do
  not (RocketMQ's ``endTransactionOneway``), and ``flush``/``aclose`` wait instead.

End results never raise for a broker failure: the database already decided, and the
check-back will settle a transaction whose END did not arrive.

``on_broker_down`` is ``Producer``'s (``outbox.stored.BrokerDown``): in store mode a half
the broker cannot take makes ``await_halves`` return False instead of raising, and the
caller stores the transaction's messages in its DB transaction.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from broker_embedded import (
    AsyncBrokerClient,
    BrokerError,
    CheckRequest,
    Message,
    Resolution,
    SendResult,
)
from broker_embedded import errors as broker_errors

from .check_back import Answer, checking, fenced_resolution
from .errors import BrokerUnavailableError
from .instrumentation import carried_context
from .producer_protocol import (
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


class AsyncTransactionListener(Protocol):
    """RocketMQ's ``TransactionListener`` with coroutines."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> Resolution: ...

    async def check_local_transaction(self, message: Message) -> Resolution: ...


class AsyncProducer:
    """Sends for one producer group over an ``AsyncBrokerClient`` (or a ``tcp://`` URL).

    Use it on one event loop; ``async with AsyncProducer(...) as producer`` closes it.
    ``answer_check_backs(answer)`` makes it answer its group's check-backs, as
    ``Producer.answer_check_backs`` does (``@transactional_message`` calls it).
    ``on_broker_down``: ``"raise"`` (the default) or ``"store"``, as for ``Producer`` (the
    probe during an outage is a task of the loop)."""

    def __init__(self, broker: AsyncBrokerClient | str, producer_group: str, *, oneway_end: bool = False,
                 on_broker_down: OnBrokerDown = "raise") -> None:
        self.broker = AsyncBrokerClient(broker) if isinstance(broker, str) else broker
        self.producer_group = producer_group
        self.oneway_end = oneway_end
        #: ``on_broker_down``, the outage a store-mode producer is in, and the transactions
        #: whose messages were stored.
        self.broker_down = BrokerDown(on_broker_down, producer_group, self._start_probe)
        self._probe_task: asyncio.Task[None] | None = None
        self._halves: dict[str, list[asyncio.Future[SendResult]]] = {}
        self._ends: dict[str, asyncio.Task[bool]] = {}
        self._on_check: Any = None  # the check-back callback, once answer_check_backs was called
        self._offered = False  # whether the broker was given it

    async def send(self, message: Message) -> SendResult:
        """A normal message, visible at once (after its delay, if any).

        Raises ``BrokerUnavailableError`` when the broker cannot be reached."""
        with sending(self.producer_group, message) as stamped:
            return await self.broker.send(stamped)

    async def send_half(self, message: Message, transaction_id: str) -> SendResult:
        """A half message of ``transaction_id``: stored, invisible until COMMIT.

        Raises ``BrokerUnavailableError`` when the broker cannot be reached: the caller must
        not run (or must not commit) its local transaction."""
        await self.offer_check_backs()
        with sending_half(self.producer_group, message, transaction_id) as stamped:
            return await self.broker.send_half(stamped, producer_group=self.producer_group,
                                               transaction_id=transaction_id)

    def start_half(self, message: Message, transaction_id: str) -> asyncio.Future[SendResult]:
        """``send_half`` as a task of the running loop, remembered until the transaction's
        END is sent after it; ``await_halves(transaction_id)`` before the DB commit. In store
        mode, while the producer backs off after an outage, the message is held instead."""
        if self.broker_down.skipping():
            return self.hold(message, transaction_id)
        half = asyncio.ensure_future(self.send_half(message, transaction_id))
        self._halves.setdefault(transaction_id, []).append(half)
        return half

    def hold(self, message: Message, transaction_id: str) -> asyncio.Future[SendResult]:
        """Store mode: keep ``message`` out of the broker (``Producer.hold``)."""
        held: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        held.set_exception(MessageHeld(message, transaction_id))
        self._halves.setdefault(transaction_id, []).append(held)
        return held

    async def await_halves(self, transaction_id: str) -> bool:
        """Wait for the half messages of ``transaction_id`` that ``start_half`` sent; True
        when the broker holds them all. One that was not stored: ``BrokerUnavailableError``
        (the local transaction must roll back), or in store mode False: the caller stores
        the transaction's messages in its transaction and commits; no END follows."""
        halves = self._halves.pop(transaction_id, [])
        outcomes = await asyncio.gather(*halves, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BrokerUnavailableError):
                self.broker_down.not_taken(outcome, transaction_id)
                return False
            if isinstance(outcome, BaseException):
                raise outcome
        if halves:
            self.broker_down.answered()
        return True

    async def end_transaction(self, transaction_id: str, resolution: Resolution, from_check: bool = False,
                              oneway: bool = False) -> bool:
        """Tell the broker how the transaction ended; False (and a warning) if it could not.
        ``oneway``: nobody waits for this END (``BrokerAPI.end_transaction``)."""
        with ending(self.producer_group, transaction_id, resolution, from_check) as ended:
            await self.broker.end_transaction(transaction_id, resolution, producer_group=self.producer_group,
                                              from_check=from_check, oneway=oneway)
        return ended.sent

    def finish(self, transaction_id: str, resolution: Resolution) -> asyncio.Task[bool]:
        """END_TRANSACTION after the local transaction ended, as a task of the running loop
        that waits for the transaction's half message first (no END if that failed: the
        broker has no such transaction, or its check-back will settle it). Callable from
        SQLAlchemy's session events, which run on the loop's thread."""
        task = asyncio.create_task(self._end_after_half(transaction_id, resolution))
        self._ends[transaction_id] = task
        task.add_done_callback(lambda _: self._ends.pop(transaction_id, None))
        return task

    async def _end_after_half(self, transaction_id: str, resolution: Resolution) -> bool:
        halves = self._halves.pop(transaction_id, [])
        if not self.broker_down.ends(transaction_id, resolution):
            return False  # its messages are in the database: the relay hands them over
        for outcome in await asyncio.gather(*halves, return_exceptions=True):
            if isinstance(outcome, BaseException):
                return False  # announced by SEND_HALF, raised to whoever awaited the half
        return await self.end_transaction(transaction_id, resolution, oneway=self.oneway_end)

    async def ended(self, transaction_id: str) -> None:
        """Wait for the END_TRANSACTION of ``transaction_id`` started by ``finish``, if any."""
        task = self._ends.get(transaction_id)
        if task is not None:
            await asyncio.shield(task)

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the END_TRANSACTIONs under way; False if some still were after ``timeout_s``."""
        pending = list(self._ends.values())
        if not pending:
            return True
        _, not_done = await asyncio.wait(pending, timeout=timeout_s)
        return not not_done

    async def send_message_in_transaction(self, message: Message, arg: Any,
                                          listener: AsyncTransactionListener) -> Resolution:
        """RocketMQ's flow: half message, ``await listener.execute_local_transaction``, then
        END (awaited unless ``oneway_end``). An exception from the listener ends the
        transaction with ROLLBACK and is re-raised."""
        transaction_id = new_transaction_id()
        await self.send_half(message, transaction_id)
        try:
            with local_transaction(self.producer_group, transaction_id) as local:
                resolution = await listener.execute_local_transaction(message, arg)
                local.outcome = resolution.value
        except BaseException:
            await self._settle(self.finish(transaction_id, Resolution.ROLLBACK))
            raise
        await self._settle(self.finish(transaction_id, resolution))
        return resolution

    async def _settle(self, end: asyncio.Task[bool]) -> None:
        if not self.oneway_end:
            await asyncio.shield(end)

    async def register_check_listener(self, listener: AsyncTransactionListener) -> None:
        """Answer this group's check-backs with ``await listener.check_local_transaction``
        over this producer's connection. The listener finds the transaction id in the
        message's ``TRANSACTION_ID_PROPERTY`` property; UNKNOWN sends nothing."""

        async def on_check(request: CheckRequest) -> None:
            with checking_back(request) as check:
                resolution = await listener.check_local_transaction(check_message(request))
                if answered(check, resolution):
                    await self.end_transaction(request.transaction_id, resolution, from_check=True)

        await self.broker.register_producer(self.producer_group, on_check)

    @property
    def answers_check_backs(self) -> bool:
        """Whether this producer answers its group's check-backs (``answer_check_backs``)."""
        return self._on_check is not None

    def answer_check_backs(self, answer: Answer, *,
                           database_errors: tuple[type[Exception], ...] = ()) -> bool:
        """Answer this group's check-backs while this producer runs: each by ``answer`` (the
        fence on the group's database, a blocking call run in a worker thread), then
        END_TRANSACTION; see ``Producer.answer_check_backs``. Callable without a running
        loop (at import, by ``@transactional_message``): the broker is told on the first
        half message, or when ``offer_check_backs()`` is awaited (e.g. at the app's
        start-up). Once per producer: False (nothing changed) if it already answers them."""
        if self._on_check is not None:
            return False

        async def on_check(request: CheckRequest) -> None:
            group, transaction_id = request.producer_group, request.transaction_id
            with checking(group, transaction_id, request.message.message_id,
                          carried_context(request.message.properties)) as check:
                resolution = await asyncio.to_thread(fenced_resolution, answer, group, transaction_id,
                                                     database_errors)
                if answered(check, resolution):
                    await self.end_transaction(transaction_id, resolution, from_check=True)

        self._on_check = on_check
        return True

    async def offer_check_backs(self) -> None:
        """Tell the broker that this producer answers its group's check-backs (once; a no-op
        without ``answer_check_backs``). A broker that cannot be reached is not an error: the
        producer offers itself again on its next connection."""
        if self._on_check is None or self._offered:
            return
        self._offered = True
        try:
            await self.broker.register_producer(self.producer_group, self._on_check)
        except BrokerError as exc:
            log.info("producer group %s: broker not reachable (%s); it answers check-backs once connected",
                     self.producer_group, exc)

    def _start_probe(self) -> None:
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Store mode, during an outage: ask the broker every ``PROBE_EVERY_S`` until it
        answers, then end the outage (``Producer._probe``)."""
        while self.broker_down.down:
            await asyncio.sleep(PROBE_EVERY_S)
            try:
                await self.broker.list_topics()
            except broker_errors.BrokerUnavailableError:  # the client's own error, not translated here
                continue
            except Exception:  # an answer, if a refusal: the next call meets it itself
                pass
            self.broker_down.answered()

    async def aclose(self) -> None:
        """Wait for the END_TRANSACTIONs under way, then close the broker connection."""
        if self._probe_task is not None:
            self._probe_task.cancel()
        await self.flush()
        await self.broker.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
