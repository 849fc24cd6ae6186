"""The asyncio TCP server: serves any ``BrokerAPI`` (normally an ``EmbeddedBroker``).

Each connection reads frames in a loop and runs every request as its own task, so requests
are pipelined and answered as they finish; a chunk of whole small requests that arrives
while the loop waits for bytes is served where it arrives, without waking it
(``serve_inline``). Broker calls run in a thread pool, which lets
concurrent sync-flush sends from many connections share fsyncs (group commit) and keeps
long-polling receives from blocking anything else. A producer connection that sends
HEART_BEAT for a group gets that group's check-backs pushed to it as
CHECK_TRANSACTION_STATE until it disconnects. What clients can hold of the server
(connections, requests, answers, long polls, partial frames, idle time) is bounded by
``ServerLimits`` (docs/server.md, "Limits"). The deadlines (authentication, idle time,
partial frames) read the broker's clock (``StoreConfig.clock``): the loop's own for the
wall clock, a simulation's in tests, which closes the overdue connections
(``close_overdue``) at the time it chooses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from ..api import DEFAULT_PORT, BrokerAPI
from ..broker.config import BrokerConfig, ServerLimits
from ..broker.writes import DeferredWrites, EndCall, HalfCall, RelayCall, SendCall
from ..clock import WALL, Clock
from ..errors import (
    AuthenticationError,
    BrokerClosedError,
    BrokerError,
    ExportPathError,
    InvalidMessageError,
    MalformedFrameError,
    ReplyTooLargeError,
    ServerBusyError,
    UnknownRequestCodeError,
)
from ..message import CheckRequest, Message
from ..wire.auth import Authenticator, RateLimitedLog, is_challenge_request, new_challenge
from ..wire.protocol import (
    CODES,
    LENGTH,
    MAX_FRAME_BYTES,
    MAX_MESSAGES,
    METHODS,
    READ_CHUNK,
    Frame,
    FrameBuffer,
    FrameError,
    Kind,
    RequestCode,
    encode_frame,
    encode_reply,
    error_to_wire,
    message_budget,
    outcome_to_wire,
    read_frame,
    to_wire,
    whole_frames,
)
from ..wire.requests import Request, decode_request, request_arguments
from .batching import Batcher, ack_batcher, write_batcher

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
#: How long a oneway END_TRANSACTION waits for another write's fsync to cover it before the
#: server fsyncs for it alone (asyncio's timers have a millisecond's resolution). Held only
#: while writes follow oneway ENDs that closely (``EndHolding``).
DEFERRED_SYNC_S = 0.001
#: After this many held oneway ENDs in a row that no write followed, the next ones are
#: written at once (``EndHolding``: one that misses now and then in a busy stream does not
#: end holding).
UNFOLLOWED_ENDS = 3
#: The longest a receive waits in the broker before the server looks at it again.
POLL_SLICE_S = 1.0


class _Connection:
    """One client connection: its writer, identity, the producer groups it answers for,
    and what it holds of the server, within ``limits``."""

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop, now: Callable[[], float],
                 authenticated: bool, limits: ServerLimits) -> None:
        self.writer = writer
        self.loop = loop
        #: The time its deadlines count in (``BrokerServer.now``).
        self.now = now
        self.authenticated = authenticated
        #: The AUTHENTICATE challenge issued on this connection and not yet answered.
        self.challenge: str | None = None
        self.limits = limits
        self.opened = now()
        self.peer = writer.get_extra_info("peername")
        self.producer_callbacks: list[tuple[str, Any]] = []
        self.outgoing: list[bytes] = []
        #: Requests read and not answered yet; receives of them waiting for messages.
        self.in_flight = 0
        self.long_polls = 0
        self.calls = asyncio.Semaphore(limits.max_calls_per_connection)
        #: Bytes of the server's budget for incomplete frames held for the frame arriving.
        self.reserved = 0
        #: The time of the last request or answer, and since when the frame arriving has
        #: been arriving (None: none is, or it waits for the budget).
        self.last_active = now()
        self.frame_started: float | None = None
        #: The bytes of the frame arriving, cut into payloads; whether the connection's task
        #: waits for bytes now (``_Front`` may then serve a chunk itself).
        self.frames = FrameBuffer()
        self.waiting = False
        #: The connection's protocol, when it is a ``_Front``.
        self.front: _Front | None = None
        self._answered = asyncio.Event()
        self._work: set[asyncio.Task[Any]] = set()
        reading = asyncio.current_task()
        assert reading is not None
        #: The task serving the connection; ``dropped`` once the server cancels it.
        self.reading = reading
        self.dropped = False
        #: The writer's transport, which the hot paths call directly (``StreamWriter``'s
        #: methods only forward to it).
        self.transport: asyncio.WriteTransport = writer.transport
        self.transport.set_write_buffer_limits(high=limits.max_reply_bytes)

    def send(self, frame: bytes) -> None:
        """Queue the answer to a request (never below zero in flight: a frame-level error is
        answered without one). The answer to the last request in flight goes out at once,
        with the answers queued before it: no other answer can join that write, and a
        sequential client's answer then costs no further loop iteration."""
        self.in_flight = in_flight = max(0, self.in_flight - 1)
        self.last_active = self.now()
        self._answered.set()
        if in_flight:
            self._queue(frame)
            return
        self.outgoing.append(frame)
        self.flush()

    def _queue(self, frame: bytes) -> None:
        """Queue a frame; the frames queued in one loop iteration go out in one write."""
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(frame)

    def flush(self) -> None:
        frames, self.outgoing = self.outgoing, []
        if frames and not self.transport.is_closing():
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def push_check(self, request: CheckRequest) -> None:
        """Called from a broker thread: push a check-back to this producer."""
        if self.writer.is_closing():
            raise ConnectionError(f"producer connection {self.peer} is closed")
        frame = encode_frame(RequestCode.CHECK_TRANSACTION_STATE, 0, Kind.PUSH, to_wire(request))
        self.loop.call_soon_threadsafe(self._queue, frame)

    def admit_now(self, count: int = 1) -> bool:
        """Count ``count`` more requests in flight if ``admit`` would not wait for any of
        them (``max_requests_in_flight`` leaves room, no answer is unwritten, the connection
        is open); False, counting nothing, when it would."""
        transport = self.transport
        if self.in_flight + count > self.limits.max_requests_in_flight or transport.is_closing() \
                or transport.get_write_buffer_size():
            return False
        self.in_flight += count
        self.last_active = self.now()
        return True

    async def admit(self) -> None:
        """Count one more request in flight, first waiting (reading nothing meanwhile) until
        fewer than ``max_requests_in_flight`` are and the unwritten answers are below
        ``max_reply_bytes``; ``ConnectionError`` if the connection is lost."""
        while self.in_flight >= self.limits.max_requests_in_flight:
            self._answered.clear()
            await self._answered.wait()
        await self.writer.drain()
        self.in_flight += 1
        self.last_active = self.now()

    async def call(self, executor: Executor, function: Callable[[], Any]) -> Any:
        """Run a broker call for this connection on ``executor``: at most
        ``max_calls_per_connection`` at once, each started once the unwritten answers are
        below ``max_reply_bytes``; cancelled if the connection closes first."""
        with self.cancelled_on_close():
            async with self.calls:
                if not self.writer.is_closing():
                    with contextlib.suppress(ConnectionError):
                        await self.writer.drain()
                return await self.loop.run_in_executor(executor, function)

    @contextlib.contextmanager
    def cancelled_on_close(self) -> Iterator[None]:
        """Within this block the current task is cancelled if the connection closes (broker
        calls already running finish in their thread; their answer is dropped)."""
        task = asyncio.current_task()
        assert task is not None
        outermost = task not in self._work
        self._work.add(task)
        try:
            yield
        finally:
            if outermost:
                self._work.discard(task)

    def overdue(self, now: float) -> str | None:
        """Why this connection should be closed at time ``now`` (``BrokerServer.now``), or None."""
        limits = self.limits
        if not self.authenticated and now - self.opened > limits.auth_timeout_s:
            return f"it did not authenticate within {limits.auth_timeout_s:g}s"
        if self.frame_started is not None and now - self.frame_started > limits.frame_timeout_s:
            return f"a request took over {limits.frame_timeout_s:g}s to arrive"
        if now - self.last_active <= limits.idle_timeout_s:
            return None
        if self.in_flight == 0 and not self.producer_callbacks:
            return f"idle for {limits.idle_timeout_s:g}s"
        if self.writer.transport.get_write_buffer_size():
            return f"its client read no answer for {limits.idle_timeout_s:g}s"
        return None

    def drop(self) -> None:
        """Stop serving this connection: its reading task ends and closes it at once."""
        self.dropped = True
        self.reading.cancel()

    def close(self) -> None:
        """Cancel the connection's waiting work, write what is queued and close; a dropped
        connection does not wait for its client to read the answers."""
        for task in self._work:
            task.cancel()
        self.flush()
        if self.dropped:
            self.writer.transport.abort()
        else:
            self.writer.close()


class _Budget:
    """Bytes shared by all connections, handed out in the order they were asked for."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, amount: int) -> None:
        if not self._waiting and amount <= self.free:
            self.free -= amount
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((amount, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.free += amount  # granted just as the wait was cancelled
            self._grant()
            raise

    def give(self, amount: int) -> None:
        self.free += amount
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            amount, granted = self._waiting[0]
            if not granted.cancelled():
                if amount > self.free:
                    return
                self.free -= amount
                granted.set_result(None)
            self._waiting.popleft()


#: The write requests, which share one batch (one append, one fsync) in ``EmbeddedBroker.produce``.
_WRITE_CALLS: dict[str, type[SendCall] | type[HalfCall] | type[EndCall] | type[RelayCall]] = {
    "send": SendCall, "send_half": HalfCall, "end_transaction": EndCall, "relay_committed": RelayCall,
}


class EndHolding:
    """Which oneway END_TRANSACTIONs the server holds for another write's fsync (written
    without one of their own, answered once one covers them). Held while writes follow
    oneway ENDs within ``DEFERRED_SYNC_S`` (a decorated call's END, then the next call's
    half message): one fsync then covers both. Once ``UNFOLLOWED_ENDS`` held ones in a row
    waited for nothing (the server synced them alone), oneway ENDs are written at once as
    waited ones (their clients still do not wait), until a write follows one that closely:
    a lone END is then durable, and its messages visible, a millisecond sooner. Starts
    writing them at once. Used on the event loop only."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        #: Whether oneway ENDs are held now; whether some held ones wait for a write; when
        #: the last one was written at once; how many held ones in a row no write followed.
        self.holding = False
        self._waiting = False
        self._written_at = float("-inf")
        self._unfollowed = 0

    def admit(self, item: Any) -> tuple[Any, bool]:
        """A write as it is to be batched (a oneway END written at once becomes a waited
        one), and whether it is a oneway END to hold. A write admitted while held ENDs
        wait is written after them, its fsync covering them: they were followed."""
        oneway_end = isinstance(item, EndCall) and item.oneway
        if self.holding:
            if oneway_end:
                self._waiting = True
            elif self._waiting:
                self._waiting, self._unfollowed = False, 0
            return item, oneway_end
        if oneway_end:
            self._written_at = self.now()
            return msgspec.structs.replace(item, oneway=False), False
        if self.now() - self._written_at < DEFERRED_SYNC_S:
            self.holding, self._unfollowed = True, 0  # it could have carried that END: hold the next
        return item, False

    def unfollowed(self) -> None:
        """The server synced the held ENDs alone: no write came for them."""
        self._waiting = False
        self._unfollowed += 1
        if self._unfollowed >= UNFOLLOWED_ENDS:
            self.holding = False


class BrokerServer:
    """Serve ``broker`` on ``host:port`` (port 0 picks a free one; see ``port`` after start)
    within ``limits``: by default those of the broker's ``BrokerConfig``. Connections'
    deadlines count on ``clock``: by default the broker's (``StoreConfig.clock``), else
    the wall clock."""

    def __init__(
        self,
        broker: BrokerAPI,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        access_key: str | None = None,
        secret_key: str | None = None,
        max_workers: int = 64,
        limits: ServerLimits | None = None,
        clock: Clock | None = None,
    ) -> None:
        config = getattr(broker, "config", None)  # an EmbeddedBroker's; a remote broker has none
        if isinstance(config, BrokerConfig):
            _check_messages_fit(config)
        self.broker = broker
        self.host = host
        self.port = port
        self.limits = limits or (config.limits if isinstance(config, BrokerConfig) else ServerLimits())
        self.clock = clock or (config.store.clock if isinstance(config, BrokerConfig) else WALL)
        #: Seconds on ``clock``'s monotonic time, set once the loop runs: the wall clock's
        #: is the loop's own ``time`` (uvloop's costs no system call).
        self.now: Callable[[], float] = self.clock.monotonic
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        self._authenticator = (
            Authenticator(access_key, secret_key) if access_key is not None and secret_key is not None else None
        )
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="broker-call")
        #: Receives wait in their own pool, so many idle long polls never hold up a send;
        #: a semaphore hands its threads out, so waiting receives take turns.
        self.poll_executor = ThreadPoolExecutor(max_workers=self.limits.max_long_polls,
                                                thread_name_prefix="broker-poll")
        self._poll_threads = asyncio.Semaphore(self.limits.max_long_polls)
        self._frame_budget = _Budget(self.limits.max_incomplete_frame_bytes)
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[_Connection] = set()
        #: The connections still to authenticate, oldest first.
        self._unauthenticated: dict[_Connection, None] = {}
        self._refusing = False
        self._auth_log = RateLimitedLog(log)
        #: Receives waiting for messages now, over all connections.
        self.long_polls = 0
        self._tasks: set[asyncio.Future[None]] = set()
        self._stopping = False
        #: Cheap calls that arrive together share one executor hop; writes share one fsync.
        writes = write_batcher(broker, self.executor, self._track)
        acks = ack_batcher(broker, self.executor, self._track)
        self._writes = writes
        #: The broker if it writes oneway ENDs without an fsync of their own, and the timer
        #: that fsyncs for them when no write does.
        self._deferring = broker if isinstance(broker, DeferredWrites) else None
        self._deferred_sync: asyncio.TimerHandle | None = None
        #: Which oneway ENDs wait for another write's fsync (read on ``now``).
        self._holding = EndHolding(lambda: self.now())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batched: dict[int, tuple[str, Batcher]] = {
            int(CODES[method]): (method, writes) for method in _WRITE_CALLS
        }
        self._batched[int(CODES["ack"])] = ("ack", acks)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.clock is WALL:
            self.now = self._loop.time
        loop = self._loop
        self._server = await loop.create_server(lambda: _Front(self, loop), self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.create_task(self._sweep())
        log.info("broker server listening on %s:%d", self.host, self.port)

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish, close connections."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        # the batchers' runs on the loop scheduled so far (not tracked, no request starts
        # one from now on) run before anything below
        await asyncio.sleep(0)
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._tasks:
            log.info("finishing %d requests in flight", len(self._tasks))
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        if self._deferred_sync is not None:
            self._deferred_sync.cancel()
            self._deferred_sync = None
        if self._deferring is not None and self._deferring.unsynced:  # answers the oneway ENDs
            await asyncio.get_running_loop().run_in_executor(self.executor, self._sync)
        reading = [connection.reading for connection in self._connections]
        for connection in list(self._connections):
            connection.drop()
        if reading:
            await asyncio.wait(reading, timeout=STOP_GRACE_S)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), STOP_GRACE_S)
            except TimeoutError:
                log.warning("connections still open after %.0fs; stopping anyway", STOP_GRACE_S)
        self.executor.shutdown(wait=True, cancel_futures=False)
        self.poll_executor.shutdown(wait=True, cancel_futures=False)
        log.info("broker server stopped")

    # -- connections ----------------------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        connection = _Connection(writer, loop, self.now, self._authenticator is None, self.limits)
        if len(self._connections) >= self.limits.max_connections:
            self._refuse(connection)
            return
        self._refusing = False
        self._connections.add(connection)
        if not connection.authenticated:
            self._wait_for_authentication(connection)
        log.debug("connection from %s", connection.peer)
        front = writer.transport.get_protocol()
        if isinstance(front, _Front):
            connection.front, front.connection = front, connection
        frames = connection.frames
        try:
            while data := await self._read(connection, reader, frames):
                for payload in frames.feed(data):
                    if connection.reserved:
                        self._frame_budget.give(connection.reserved)
                        connection.reserved = 0
                    connection.frame_started = None
                    if len(payload) > READ_CHUNK:  # small requests never wait behind big writes
                        await self._writes.lighter_than(self.limits.max_write_backlog_bytes)
                    if not connection.admit_now():  # the usual case costs no coroutine
                        await connection.admit()
                    if not self._on_frame(connection, payload):
                        return
                if frames.buffered and connection.frame_started is None:
                    connection.frame_started = self.now()
        except MalformedFrameError as exc:
            self._reply_error(connection, 0, 0, exc)
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            if not connection.dropped:
                raise
        finally:
            self._frame_budget.give(connection.reserved)
            for group, callback in connection.producer_callbacks:
                self.broker.unregister_producer(group, callback)
            self._connections.discard(connection)
            self._unauthenticated.pop(connection, None)
            connection.close()
            log.debug("connection from %s closed", connection.peer)

    async def _read(self, connection: _Connection, reader: asyncio.StreamReader, frames: FrameBuffer) -> bytes:
        """The next bytes from ``connection``. A frame declared longer than ``READ_CHUNK``
        first takes its length from the budget for incomplete frames, waiting (its clock
        stopped) while other connections hold the budget."""
        expected = frames.expected
        if expected > READ_CHUNK and not connection.reserved:
            connection.frame_started = None
            await self._frame_budget.take(expected)
            connection.reserved = expected
            connection.frame_started = self.now()
        connection.waiting = True
        try:
            data = await reader.read(READ_CHUNK)
        finally:
            connection.waiting = False
        if connection.front is not None:
            connection.front.unread -= len(data)
        return data

    def _wait_for_authentication(self, connection: _Connection) -> None:
        """Count ``connection`` among those still to authenticate; past the cap the oldest
        of them is closed (it had its turn), so they never fill ``max_connections``."""
        if len(self._unauthenticated) >= self.limits.unauthenticated_cap:
            oldest = next(iter(self._unauthenticated))
            del self._unauthenticated[oldest]
            self._auth_log.warning("%d connections wait to authenticate, the maximum: closing the oldest, from %s",
                                   self.limits.unauthenticated_cap, oldest.peer)
            oldest.drop()
            self._connections.discard(oldest)  # its slot is free now, not once its task has ended
        self._unauthenticated[connection] = None

    def _refuse(self, connection: _Connection) -> None:
        """Answer a connection over ``max_connections`` with ``ServerBusyError`` and close it."""
        if not self._refusing:
            log.warning("%d connections, the maximum: refusing new ones", len(self._connections))
            self._refusing = True
        self._reply_error(connection, 0, 0, ServerBusyError(
            f"the server has {len(self._connections)} connections, its maximum"))
        connection.close()

    async def _sweep(self) -> None:
        """Run ``close_overdue`` every quarter of the shortest deadline (at most 1 s)."""
        limits = self.limits
        interval = min(1.0, limits.idle_timeout_s / 4, limits.frame_timeout_s / 4, limits.auth_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.close_overdue()

    def close_overdue(self) -> int:
        """Close the connections past ``auth_timeout_s``, ``idle_timeout_s`` or
        ``frame_timeout_s`` at ``clock``'s time (on the server's loop); how many. A sweeper
        task runs it every quarter of the shortest deadline; a simulation that moves its
        own clock calls it."""
        now, closed = self.now(), 0
        for connection in list(self._connections):
            if connection.dropped:
                continue  # closing already
            try:
                reason = connection.overdue(now)
            except Exception:
                log.exception("cannot check the connection from %s", connection.peer)
                continue
            if reason:  # unauthenticated ones may be a flood: not one line each
                (log.info if connection.authenticated else log.debug)(
                    "closing the connection from %s: %s", connection.peer, reason)
                connection.drop()
                closed += 1
        return closed

    def serve_inline(self, connection: _Connection, data: bytes) -> bool:
        """Serve a chunk of bytes as the connection's task would, without waking it, if it
        is whole light requests (each at most ``READ_CHUNK``) of an authenticated connection
        with no frame arriving, for which ``max_requests_in_flight`` has room: a sequential
        client's request then costs no read wake-up and no task step. False, having done
        nothing, for any other chunk (the task reads it). A request that ends the connection
        ends it as the task would: the requests after it are not served."""
        if connection.frames.buffered or not connection.authenticated or connection.dropped:
            return False
        room = connection.limits.max_requests_in_flight - connection.in_flight
        payloads = whole_frames(data, READ_CHUNK, room)  # stops at the first frame past the room
        if not payloads or not connection.admit_now(len(payloads)):
            return False
        for payload in payloads:
            if not self._on_frame(connection, payload):
                assert connection.front is not None
                connection.front.end()
                break
        return True

    def _on_frame(self, connection: _Connection, payload: bytes) -> bool:
        """Handle one frame; False when the connection must be closed. Every frame gets an
        answer, with its request id when that can be read (0 when not)."""
        try:
            frame = read_frame(payload)
        except FrameError as exc:
            self._reply_error(connection, exc.request_code, exc.request_id, exc)
            return True
        try:
            return self._on_request(connection, frame)
        except Exception as exc:  # a bad request costs that request, never the connection
            self._reply_error(connection, frame.code, frame.request_id, _typed(exc))
            return True

    def _on_request(self, connection: _Connection, frame: Frame) -> bool:
        """Authenticate, decode and start one request; False when the connection must close."""
        code, request_id = frame.code, frame.request_id
        if frame.kind is not Kind.REQUEST:
            raise MalformedFrameError("expected a request")
        if code == RequestCode.AUTHENTICATE:  # wrong keys: answer, then close
            return self._authenticate(connection, code, request_id, decode_request(code, frame.body))
        if self._stopping:
            self._reply_error(connection, code, request_id, BrokerClosedError("the broker is stopping"))
            return True
        if not connection.authenticated:
            self._reply_error(connection, code, request_id, AuthenticationError("authenticate first"))
            return False
        request = decode_request(code, frame.body)  # typed and checked before any batch
        batched = self._batched.get(code)
        if batched is not None:  # the hot path: no task per request
            method, batcher = batched
            item = _batch_item(method, request)
            answer = functools.partial(self._answer, connection, code, request_id)
            if self._deferring is not None and batcher is self._writes:
                item, held = self._holding.admit(item)
                if held:
                    answer = functools.partial(self._answer_when_durable, answer)
            batcher.submit(item, answer, connection)
            return True
        self._track(asyncio.create_task(self._dispatch(connection, code, request_id, request)))
        return True

    def _answer_when_durable(self, answer: Callable[[Any], None], outcome: Any) -> None:
        """A oneway END's outcome, held for the next write (no write or fsync of its own):
        answered once an fsync covers it (a refusal at once), the next write's or,
        ``DEFERRED_SYNC_S`` later, the one ``_sync_deferred`` runs. The answer means what a
        waited END's means; an END dropped because it could not be written is answered
        with an error (its transaction stays pending, for the check-back)."""
        deferring, loop = self._deferring, self._loop
        assert deferring is not None and loop is not None
        if isinstance(outcome, BaseException):
            answer(outcome)
            return
        on_loop = threading.get_ident()

        def durable(result: Any = outcome) -> None:
            if threading.get_ident() == on_loop:  # a batch synced on the loop: no self-pipe
                self._durable(answer, result)
                return
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
                loop.call_soon_threadsafe(self._durable, answer, result)

        def lost(cause: Exception) -> None:
            durable(BrokerError(f"the oneway END could not be written and was dropped ({cause}); "
                                "its transaction stays pending until the check-back settles it"))

        deferring.when_durable(durable, lost)
        if self._deferred_sync is None and deferring.unsynced:
            self._deferred_sync = loop.call_later(DEFERRED_SYNC_S, self._sync_deferred)

    def _durable(self, answer: Callable[[Any], None], outcome: Any) -> None:
        """On the loop: answer a oneway END an fsync covered (or dropped); no timer is left for nothing."""
        answer(outcome)
        if self._deferred_sync is not None and self._deferring is not None and not self._deferring.unsynced:
            self._deferred_sync.cancel()
            self._deferred_sync = None

    def _sync_deferred(self) -> None:
        """Fsync the oneway ENDs that no write's fsync covered in ``DEFERRED_SYNC_S``."""
        self._deferred_sync = None
        if self._deferring is not None and self._deferring.unsynced and self._loop is not None:
            self._holding.unfollowed()
            self._track(self._loop.run_in_executor(self.executor, self._sync))

    def _sync(self) -> None:
        assert self._deferring is not None
        try:
            self._deferring.flush()
        except Exception:  # the store refuses writes from now on; the writes say why
            log.exception("fsync of the oneway END_TRANSACTIONs failed")

    def _track(self, work: asyncio.Future[None]) -> None:
        """Count ``work`` (a request's task, a batcher's drain) as in flight until it ends
        (``stop`` waits for these)."""
        self._tasks.add(work)
        work.add_done_callback(self._tasks.discard)

    def _reply(self, connection: _Connection, code: int, request_id: int, result: Any) -> None:
        frame = encode_reply(code, request_id, result)
        if len(frame) - LENGTH.size > MAX_FRAME_BYTES:  # the client could not read it
            error = ReplyTooLargeError(f"an answer of {len(frame)} bytes exceeds the frame limit")
            log.error("%s to %s: %s", RequestCode(code).name, connection.peer, error)
            self._reply_error(connection, code, request_id, error)
            return
        connection.send(frame)

    def _reply_error(self, connection: _Connection, code: int, request_id: int, error: BrokerError) -> None:
        connection.send(encode_frame(code, request_id, Kind.RESPONSE, error_to_wire(error)))

    async def _dispatch(self, connection: _Connection, code: int, request_id: int, body: Any) -> None:
        try:
            outcome = await self._execute(connection, code, body)
        except Exception as exc:
            outcome = exc
        self._answer(connection, code, request_id, outcome)

    def _answer(self, connection: _Connection, code: int, request_id: int, outcome: Any) -> None:
        """Reply with a result, or with the typed error an exception stands for."""
        if isinstance(outcome, BaseException):
            self._reply_error(connection, code, request_id, _typed(outcome))
        else:
            self._reply(connection, code, request_id, outcome)

    async def _execute(self, connection: _Connection, code: int, body: Any) -> Any:
        """Run a decoded request (``body``: its typed request, see ``requests``)."""
        if code == RequestCode.HEART_BEAT:
            group = body.producer_group
            if all(registered != group for registered, _ in connection.producer_callbacks):
                self.broker.register_producer(group, connection.push_check)
                connection.producer_callbacks.append((group, connection.push_check))
                log.info("producer %s registered for check-backs of group %s", connection.peer, group)
            return None
        if code == RequestCode.UNREGISTER_CLIENT:
            group = body.producer_group
            self.broker.unregister_producer(group, connection.push_check)
            connection.producer_callbacks = [p for p in connection.producer_callbacks if p[0] != group]
            return None
        if code == RequestCode.SEND_BATCH_MESSAGE:
            return await self._send_batch(connection, body.messages)
        if code == RequestCode.EXPORT_MESSAGES:
            out_dir, fmt = _text(body, "out_dir"), _text(body, "fmt", "parquet")
            log.info("exporting messages as %s to %s", fmt, out_dir)
            return await asyncio.get_running_loop().run_in_executor(self.executor, self._export, out_dir, fmt)
        method = METHODS[RequestCode(code)]
        arguments = request_arguments(body)
        if "max_bytes" in arguments:  # the answer is a list of messages: fit it in a frame
            arguments["max_messages"] = min(arguments["max_messages"], MAX_MESSAGES)
            budget = message_budget(arguments["max_messages"])
            arguments["max_bytes"] = budget if arguments["max_bytes"] is None else min(arguments["max_bytes"], budget)
        if method == "receive":
            return await self._long_poll(connection, arguments)
        if method == "ack_many":  # one outcome per receipt, in order
            outcomes = await connection.call(self.executor, functools.partial(self.broker.ack_many, **arguments))
            return [outcome_to_wire(outcome) for outcome in outcomes]
        call = functools.partial(getattr(self.broker, method), **arguments)
        return await connection.call(self.executor, call)

    async def _send_batch(self, connection: _Connection, messages: list[Message]) -> list[dict[str, Any]]:
        """SEND_BATCH_MESSAGE: every message joins the send batcher (and its fsync); the
        answer has one outcome per message, in order."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in messages]
        for message, future in zip(messages, futures, strict=True):
            self._writes.submit(SendCall(message), future.set_result, connection)
        outcomes = await asyncio.gather(*futures)
        return [outcome_to_wire(_typed(o) if isinstance(o, BaseException) else o) for o in outcomes]

    async def _long_poll(self, connection: _Connection, arguments: dict[str, Any]) -> Any:
        """A receive. Without a wait it is an ordinary call. With one it counts against
        ``max_long_polls_per_connection`` (``ServerBusyError`` past it) and waits in slices
        of at most ``POLL_SLICE_S``, each on one of the ``max_long_polls`` poll threads
        (taking turns when all are busy), so that a stopping server answers it at once with
        nothing and a closing connection ends it."""
        receive = functools.partial(self.broker.receive, **arguments)
        if arguments["wait_s"] <= 0:
            return await connection.call(self.executor, receive)
        if connection.long_polls >= self.limits.max_long_polls_per_connection:
            raise ServerBusyError(f"{connection.long_polls} receives already wait on this connection")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + arguments["wait_s"]
        connection.long_polls += 1
        self.long_polls += 1
        try:
            with connection.cancelled_on_close():
                while True:
                    if not await _acquire_before(self._poll_threads, deadline):
                        # no poll thread came free in time: one look without waiting
                        return await connection.call(self.executor, functools.partial(receive, wait_s=0.0))
                    if self._stopping:
                        self._poll_threads.release()
                        return []
                    wait_s = max(0.0, min(POLL_SLICE_S, deadline - loop.time()))
                    received = await self._poll_slice(functools.partial(receive, wait_s=wait_s))
                    if received or self._stopping or loop.time() >= deadline:
                        return received
        finally:
            connection.long_polls -= 1
            self.long_polls -= 1

    async def _poll_slice(self, receive: Callable[[], Any]) -> Any:
        """``receive`` on the poll thread the caller acquired; the thread is handed back
        when the call returns, even if the request was cancelled meanwhile."""
        loop = asyncio.get_running_loop()
        future = self.poll_executor.submit(receive)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._poll_threads.release))
        return await asyncio.wrap_future(future)

    def _export(self, out_dir: str, fmt: str) -> dict[str, int]:
        """EXPORT_MESSAGES into ``out_dir``, relative to the broker's export root or an
        absolute path inside it; one that resolves (``..``, symlinks) outside is refused."""
        from ..broker.export import export_messages
        from ..broker.facade import EmbeddedBroker

        if not isinstance(self.broker, EmbeddedBroker):
            raise UnknownRequestCodeError("this server's broker cannot export")
        root = Path(self.broker.config.export_root or self.broker.data_dir / "exports")
        root.mkdir(parents=True, exist_ok=True)
        root = root.resolve()
        target = (root / out_dir).resolve()
        if not target.is_relative_to(root):
            raise ExportPathError(f"{out_dir!r} is outside the export root {root}")
        return export_messages(self.broker, target, fmt)  # type: ignore[arg-type]

    def _authenticate(self, connection: _Connection, code: int, request_id: int, body: Any) -> bool:
        """Answer an AUTHENTICATE request: without a signature, with a new challenge for this
        connection; with one, check it against that challenge, which it uses up. False if
        the credentials are wrong (the connection is then closed)."""
        if is_challenge_request(body):
            connection.challenge = new_challenge()
            self._reply(connection, code, request_id, {"challenge": connection.challenge})
            return True
        challenge, connection.challenge = connection.challenge, None
        if self._authenticator is not None:
            try:
                self._authenticator.verify(body, challenge)
            except AuthenticationError as exc:
                self._auth_log.warning("authentication failed from %s: %s", connection.peer, exc)
                self._reply_error(connection, code, request_id, exc)
                return False
        connection.authenticated = True
        self._unauthenticated.pop(connection, None)
        self._reply(connection, code, request_id, None)
        return True


async def _acquire_before(semaphore: asyncio.Semaphore, deadline: float) -> bool:
    """Acquire ``semaphore`` unless loop time ``deadline`` passes first."""
    try:
        async with asyncio.timeout_at(deadline):
            await semaphore.acquire()
    except TimeoutError:
        return False
    return True


def _batch_item(method: str, request: Request) -> Any:
    """What a batched request queues: a write call, or the arguments of an ack."""
    arguments = request_arguments(request)
    write_call = _WRITE_CALLS.get(method)
    return arguments if write_call is None else write_call(**arguments)


#: What a stored message adds to its body and properties: the record header, topic and the
#: broker's own properties (real topic and queue, transaction and group, attempts).
_RECORD_EXTRA_BYTES = 4096


def _check_messages_fit(config: BrokerConfig) -> None:
    """``ValueError`` if the broker takes messages too large for one answer frame (a
    receive or read always returns at least one message)."""
    largest = config.max_body_size + config.max_properties_size + _RECORD_EXTRA_BYTES
    if largest > message_budget(1):
        raise ValueError(f"messages of up to {largest} bytes (max_body_size + max_properties_size) "
                         f"cannot fit in a frame of {MAX_FRAME_BYTES} bytes")


def _typed(error: BaseException) -> BrokerError:
    """The typed error to answer with: bad values are the caller's, anything else is ours."""
    if isinstance(error, BrokerError):
        return error
    if isinstance(error, ValueError | TypeError):
        return InvalidMessageError(str(error))
    log.error("a request failed", exc_info=error)
    return BrokerError(f"internal error: {error}")


def _text(body: Any, name: str, default: str | None = None) -> str:
    """A string field of a request body (``MalformedFrameError`` when absent or not text)."""
    value = body.get(name, default) if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise MalformedFrameError(f"the request needs a non-empty string {name!r}")
    return value


async def run_server(server: BrokerServer, stop: asyncio.Event,
                     listening: Callable[[bool], None] | None = None) -> None:
    """Start ``server`` and run it until ``stop`` is set; ``listening`` is told True once
    it accepts connections and False as it stops."""
    await server.start()
    if listening is not None:
        listening(True)
    await stop.wait()
    if listening is not None:
        listening(False)
    await server.stop()


class _Front(asyncio.StreamReaderProtocol):
    """A connection's protocol: what ``asyncio.start_server`` gives each connection (its
    task reads the bytes through a ``StreamReader``), with a short path. A chunk that arrives
    while the task waits for bytes, with none unread, goes to ``BrokerServer.serve_inline``
    first; only what that does not serve is fed to the reader."""

    def __init__(self, server: BrokerServer, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = asyncio.StreamReader(loop=loop)
        super().__init__(self.reader, server._serve_connection, loop=loop)
        self.server = server
        #: The connection once its task made it; bytes fed to the reader and not read yet.
        self.connection: _Connection | None = None
        self.unread = 0
        self._ended = False

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return  # the connection is ending: nothing more is read
        connection = self.connection
        if connection is not None and connection.waiting and not self.unread \
                and self.server.serve_inline(connection, data):
            return
        self.unread += len(data)
        super().data_received(data)

    def end(self) -> None:
        """End the connection after an inline request said so: its task reads the end of
        the stream and closes it as after any other (its answers written first)."""
        self._ended = True
        self.reader.feed_eof()
