"""Batching of the requests that arrive while others run: one executor hop for all of
them (and for the batches that follow while more arrive), and for writes group commit
(one append and one fsync for every write in flight). Shared by the native TCP server and
the gRPC front."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..api import BrokerAPI
from ..broker.writes import EndCall, HalfCall, RelayCall, SendCall, WriteCall
from ..errors import BrokerError
from ..wire.protocol import READ_CHUNK

#: The message bodies one write batch holds at most (or one message): another client's
#: small write waits behind one such batch, not behind a backlog of big ones.
MAX_WRITE_BATCH_BYTES = 4 * 1024 * 1024
#: How many light requests arriving together at an idle batcher run on the event loop
#: (``Batcher.on_loop_up_to``): a sequential client's, or a decorated call's END with the
#: next call's half message.
FEW_ON_LOOP = 4


class Batcher:
    """Groups the calls that arrive while a batch is running into the next batch. ``run_batch``
    takes the list of items and returns, per item, a result or the exception that refused it.
    For writes this is group commit: one append and one fsync for every write in flight. Up
    to ``max_batches`` drains run at once on ``executor``, so one fills and appends while the
    one before it waits for its fsync. A drain is one hand-off from the event loop: its
    thread runs batch after batch while items wait, and hands each batch's outcomes back to
    the loop with one callback. ``backlog`` is what ``weigh`` says the items queued or in a
    running batch hold (bytes); ``track`` is given one future per drain, done when it ends.
    A run on the loop (below) gets none: it is a loop callback, done once the loop has run
    the callbacks scheduled before a front's stop (``BrokerServer.stop`` yields once for
    them).

    The heavy items of a batch (over ``READ_CHUNK``) weigh at most ``max_batch_weight``
    together (or are one item): one that does not fit waits for the next batch, and so does
    everything after it from the same ``source`` (a connection's items keep their order),
    while light items of other sources go ahead, so a small write never waits behind more
    than the running batches, whatever other clients have queued.

    With ``on_loop_up_to`` = n > 0, light items that find nothing running and are still at
    most n one loop iteration later (the requests that arrived together) run on the event
    loop itself: a sequential client's write (or a decorated call's END with the next
    call's half message) then costs no thread hand-off in and none back (the executor's
    wake-up, the GIL passed twice, the loop's self-pipe), at the price of the loop waiting
    for that batch's fsync. More items, or a heavy one, go to a drain as before, so a busy
    broker keeps reading requests while a batch syncs. A run on the loop happens inside
    ``answering_first()`` (for writes, the broker's): its answers go out as soon as its fsync
    returns, and the records are dispatched after, while the clients read them."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], executor: Executor,
                 track: Callable[[asyncio.Future[None]], None], max_batches: int = 1,
                 weigh: Callable[[Any], int] = lambda item: 0, max_batch_weight: int = 0,
                 on_loop_up_to: int = 0,
                 answering_first: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        self.run_batch = run_batch
        self.answering_first = answering_first
        self.executor = executor
        self.track = track
        self.max_batches = max_batches
        self.weigh = weigh
        self.max_batch_weight = max_batch_weight
        #: Queued items: the item, its ``on_done``, its source and its weight. ``waiting``
        #: and ``running`` are shared with the drains' threads, under ``_lock``.
        self.waiting: list[tuple[Any, Callable[[Any], None], object, int]] = []
        self.running = 0
        self.on_loop_up_to = on_loop_up_to
        #: A run on the loop is scheduled (the items submitted meanwhile wait for it).
        self._on_loop_pending = False
        self._lock = threading.Lock()
        self.backlog = 0
        self._lighter = asyncio.Event()
        #: The event loop submits come from, kept until it closes (asking asyncio for it
        #: costs a ``getpid`` per call on CPython 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, item: Any, on_done: Callable[[Any], None], source: object = None) -> None:
        """Queue ``item`` from ``source``; ``on_done`` gets its result or exception on the
        event loop."""
        weight = self.weigh(item)
        self.backlog += weight
        with self._lock:
            self.waiting.append((item, on_done, source, weight))
            if self._on_loop_pending or self.running >= self.max_batches:
                return
            self.running += 1
            on_loop = self._on_loop_pending = self.running == 1 and 0 < self.on_loop_up_to and weight <= READ_CHUNK
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        if on_loop:
            loop.call_soon(self._run_on_loop, loop)
        else:
            self._start_drain(loop)

    def _start_drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand a drain (already counted in ``running``) to the executor."""
        ended: asyncio.Future[None] = loop.create_future()
        self.track(ended)
        try:
            self.executor.submit(self._drain, loop, ended)
        except RuntimeError as exc:  # the executor is shut down: the server is stopping
            with self._lock:
                self.running -= 1
                batch, self.waiting = self.waiting, []
            self._deliver(batch, [exc] * len(batch), ended)

    def _run_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop, an iteration after a light item found nothing running: the items
        queued since run here if they are few and light, else they go to a drain."""
        with self._lock:
            self._on_loop_pending = False
            few = len(self.waiting) <= self.on_loop_up_to and all(
                entry[3] <= READ_CHUNK for entry in self.waiting)
            batch, self.waiting = (self.waiting, []) if few else ([], self.waiting)
        if not few:
            self._start_drain(loop)
            return
        with self.answering_first():
            outcomes = self._run(batch)
            with self._lock:
                self.running -= 1
            self._deliver(batch, outcomes, None)

    def _drain(self, loop: asyncio.AbstractEventLoop, ended: asyncio.Future[None]) -> None:
        """On a thread of ``executor``: run batches until none waits; the last batch's
        outcomes go back with the end of the drain, in one callback."""
        batch = self._take()
        if not batch:  # another drain took the items
            loop.call_soon_threadsafe(ended.set_result, None)
        while batch:
            outcomes = self._run(batch)
            following = self._take()
            loop.call_soon_threadsafe(self._deliver, batch, outcomes, None if following else ended)
            batch = following

    def _run(self, batch: list[tuple[Any, Callable[[Any], None], object, int]]) -> Sequence[Any]:
        """``run_batch`` over the batch's items: per item its result or exception, or the
        one exception for every item when the whole batch failed (e.g. the disk is full)."""
        try:
            return self.run_batch([entry[0] for entry in batch])
        except Exception as exc:
            return [exc] * len(batch)

    def _take(self) -> list[tuple[Any, Callable[[Any], None], object, int]]:
        """The next batch; when there is none the calling drain ends (no longer ``running``)."""
        with self._lock:
            batch = self._next_batch()
            if not batch:
                self.running -= 1
            return batch

    def _deliver(self, batch: list[tuple[Any, Callable[[Any], None], object, int]], outcomes: Sequence[Any],
                 ended: asyncio.Future[None] | None) -> None:
        """On the loop: hand a batch's outcomes to their ``on_done``."""
        self.backlog -= sum(entry[3] for entry in batch)
        self._lighter.set()
        try:
            for (_, on_done, _, _), outcome in zip(batch, outcomes, strict=True):
                on_done(outcome)
        finally:
            if ended is not None:
                ended.set_result(None)

    def _next_batch(self) -> list[tuple[Any, Callable[[Any], None], object, int]]:
        """Take the items of the next batch out of ``waiting`` (see the class docstring)."""
        if not self.max_batch_weight:
            batch, self.waiting = self.waiting, []
            return batch
        batch, left, held = [], [], set()
        heavy = 0
        for entry in self.waiting:
            weight = entry[3]
            if weight <= READ_CHUNK:
                weight = 0  # light: always fits
            if entry[2] in held or (heavy and heavy + weight > self.max_batch_weight):
                held.add(entry[2])
                left.append(entry)
            else:
                batch.append(entry)
                heavy += weight
        self.waiting = left
        return batch

    async def lighter_than(self, limit: int) -> None:
        """Until the backlog is at most ``limit``."""
        while self.backlog > limit:
            self._lighter.clear()
            await self._lighter.wait()


def each(call: Callable[..., Any]) -> Callable[[list[Any]], list[Any]]:
    """A ``run_batch`` that makes one call per item (keyword arguments if a map), catching each error."""

    def run(items: list[Any]) -> list[Any]:
        outcomes: list[Any] = []
        for item in items:
            try:
                outcomes.append(call(**item) if isinstance(item, dict) else call(item))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    return run


def body_bytes(call: WriteCall) -> int:
    """What a write holds while it waits for its batch: its message bodies."""
    if isinstance(call, RelayCall):
        return sum(len(message.body) for message in call.messages)
    return len(call.message.body) if isinstance(call, SendCall | HalfCall) else 0


def write_one_by_one(broker: BrokerAPI) -> Callable[[list[WriteCall]], list[Any]]:
    """A ``run_batch`` for a broker without ``produce``: one API call per write."""

    def write(call: WriteCall) -> Any:
        if isinstance(call, SendCall):
            return broker.send(call.message)
        if isinstance(call, HalfCall):
            return broker.send_half(call.message, producer_group=call.producer_group,
                                    transaction_id=call.transaction_id)
        if isinstance(call, EndCall):
            return broker.end_transaction(call.transaction_id, call.resolution, producer_group=call.producer_group,
                                          from_check=call.from_check)
        return broker.relay_committed(call.messages, producer_group=call.producer_group,
                                      transaction_id=call.transaction_id)

    return each(write)


def write_batcher(broker: BrokerAPI, executor: Executor,
                  track: Callable[[asyncio.Future[None]], None]) -> Batcher:
    """The batcher of a front's writes: ``broker.produce`` when it has one (one append and
    one fsync per batch), two batches at a time, big bodies capped per batch, up to
    ``FEW_ON_LOOP`` light writes that arrive together at an idle broker on the loop, answered
    before their dispatch where the broker can (``EmbeddedBroker.answering_first``)."""
    produce = getattr(broker, "produce", None)
    return Batcher(produce or write_one_by_one(broker), executor, track, max_batches=2, weigh=body_bytes,
                   max_batch_weight=MAX_WRITE_BATCH_BYTES, on_loop_up_to=FEW_ON_LOOP,
                   answering_first=getattr(broker, "answering_first", nullcontext))


def ack_by_group(broker: BrokerAPI, items: list[dict[str, str]]) -> list[BrokerError | None]:
    """A ``run_batch`` for acks (``{"group": ..., "receipt_handle": ...}`` each): one
    ``ack_many`` per group (one lock and one consumer-state write for all), each ack's outcome
    in its place."""
    outcomes: list[BrokerError | None] = [None] * len(items)
    by_group: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_group.setdefault(item["group"], []).append(index)
    for group, indexes in by_group.items():
        acked = broker.ack_many(group, [items[index]["receipt_handle"] for index in indexes])
        for index, outcome in zip(indexes, acked, strict=True):
            outcomes[index] = outcome
    return outcomes


def ack_batcher(broker: BrokerAPI, executor: Executor, track: Callable[[asyncio.Future[None]], None]) -> Batcher:
    """The batcher of a front's acks: the acks that arrive together share one executor hop;
    a few at an idle broker run on the loop."""
    return Batcher(functools.partial(ack_by_group, broker), executor, track, on_loop_up_to=FEW_ON_LOOP)
