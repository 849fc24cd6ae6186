"""The asyncio TCP server: serves any ``BrokerAPI`` (normally an ``EmbeddedBroker``).

Each connection reads frames in a loop and runs every request as its own task, so requests
are pipelined and answered as they finish; broker calls run in a thread pool, which lets
concurrent sync-flush sends from many connections share fsyncs (group commit) and keeps
long-polling receives from blocking anything else. A producer connection that sends
HEART_BEAT for a group gets that group's check-backs pushed to it as
CHECK_TRANSACTION_STATE until it disconnects.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from .api import BrokerAPI
from .auth import Authenticator
from .errors import (
    AuthenticationError,
    BrokerClosedError,
    BrokerError,
    InvalidMessageError,
    MalformedFrameError,
    UnknownRequestCodeError,
)
from .message import CheckRequest, Message
from .protocol import (
    CODES,
    METHODS,
    READ_CHUNK,
    FrameBuffer,
    Kind,
    RequestCode,
    convert_arguments,
    decode_frame,
    encode_frame,
    outcome_to_wire,
    to_wire,
)
from .writes import EndCall, HalfCall, SendCall, WriteCall

log = logging.getLogger("broker_embedded.server")

STOP_GRACE_S = 10.0
#: The longest a receive waits in the broker before the server looks at it again.
POLL_SLICE_S = 1.0


class _Connection:
    """One client connection: its writer, identity and the producer groups it answers for."""

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop,
                 authenticated: bool) -> None:
        self.writer = writer
        self.loop = loop
        self.authenticated = authenticated
        self.peer = writer.get_extra_info("peername")
        self.producer_callbacks: list[tuple[str, Any]] = []
        self.outgoing: list[bytes] = []

    def send(self, frame: bytes) -> None:
        """Queue a frame; the frames queued in one loop iteration go out in one write."""
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(frame)

    def flush(self) -> None:
        frames, self.outgoing = self.outgoing, []
        if frames and not self.writer.is_closing():
            self.writer.write(b"".join(frames))

    def push_check(self, request: CheckRequest) -> None:
        """Called from a broker thread: push a check-back to this producer."""
        if self.writer.is_closing():
            raise ConnectionError(f"producer connection {self.peer} is closed")
        frame = encode_frame(RequestCode.CHECK_TRANSACTION_STATE, 0, Kind.PUSH, to_wire(request))
        self.loop.call_soon_threadsafe(self.send, frame)


class _Batcher:
    """Groups the calls that arrive while a batch is running into the next batch: one
    executor hop for all of them. ``run_batch`` takes the list of items and returns, per
    item, a result or the exception that refused it. For writes this is group commit: one
    append and one fsync for every write in flight. Up to ``max_batches`` batches run at
    once, so one fills and appends while the one before it waits for its fsync."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], executor: ThreadPoolExecutor,
                 track: Callable[[asyncio.Task[None]], None], max_batches: int = 1) -> None:
        self.run_batch = run_batch
        self.executor = executor
        self.track = track
        self.max_batches = max_batches
        self.waiting: list[tuple[Any, Callable[[Any], None]]] = []
        self.running = 0

    def submit(self, item: Any, on_done: Callable[[Any], None]) -> None:
        """Queue ``item``; ``on_done`` gets its result or exception on the event loop."""
        self.waiting.append((item, on_done))
        if self.running < self.max_batches:
            self.running += 1
            self.track(asyncio.get_running_loop().create_task(self._drain()))

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                try:
                    outcomes = await loop.run_in_executor(self.executor, self.run_batch, [item for item, _ in batch])
                except Exception as exc:  # the whole batch failed (e.g. the disk is full)
                    outcomes = [exc] * len(batch)
                for (_, on_done), outcome in zip(batch, outcomes, strict=True):
                    on_done(outcome)
        finally:
            self.running -= 1


def _each(call: Callable[..., Any]) -> Callable[[list[Any]], list[Any]]:
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


#: The write requests, which share one batch (one append, one fsync) in ``EmbeddedBroker.produce``.
_WRITE_CALLS: dict[str, type[SendCall] | type[HalfCall] | type[EndCall]] = {
    "send": SendCall, "send_half": HalfCall, "end_transaction": EndCall,
}


def _write_one_by_one(broker: BrokerAPI) -> Callable[[list[WriteCall]], list[Any]]:
    """A ``run_batch`` for a broker without ``produce``: one API call per write."""

    def write(call: WriteCall) -> Any:
        if isinstance(call, SendCall):
            return broker.send(call.message)
        if isinstance(call, HalfCall):
            return broker.send_half(call.message, producer_group=call.producer_group,
                                    transaction_id=call.transaction_id)
        return broker.end_transaction(call.transaction_id, call.resolution, producer_group=call.producer_group,
                                      from_check=call.from_check)

    return _each(write)


class BrokerServer:
    """Serve ``broker`` on ``host:port`` (port 0 picks a free one; see ``port`` after start)."""

    def __init__(
        self,
        broker: BrokerAPI,
        host: str = "127.0.0.1",
        port: int = 9876,
        access_key: str | None = None,
        secret_key: str | None = None,
        max_workers: int = 64,
        max_pollers: int = 256,
    ) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        self._authenticator = (
            Authenticator(access_key, secret_key) if access_key is not None and secret_key is not None else None
        )
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="broker-call")
        #: Receives wait in their own pool, so many idle long polls never hold up a send.
        self.poll_executor = ThreadPoolExecutor(max_workers=max_pollers, thread_name_prefix="broker-poll")
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        #: Cheap calls that arrive together share one executor hop; writes share one fsync.
        produce = getattr(broker, "produce", None)
        writes = _Batcher(produce or _write_one_by_one(broker), self.executor, self._track, max_batches=2)
        acks = _Batcher(_each(broker.ack), self.executor, self._track)
        self._writes = writes
        self._batched: dict[int, tuple[str, _Batcher]] = {
            int(CODES[method]): (method, writes) for method in _WRITE_CALLS
        }
        self._batched[int(CODES["ack"])] = ("ack", acks)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
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
        if self._tasks:
            log.info("finishing %d requests in flight", len(self._tasks))
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        for connection in list(self._connections):
            connection.flush()
            connection.writer.close()
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
        connection = _Connection(writer, asyncio.get_running_loop(), self._authenticator is None)
        self._connections.add(connection)
        log.debug("connection from %s", connection.peer)
        frames = FrameBuffer()
        try:
            while data := await reader.read(READ_CHUNK):
                for payload in frames.feed(data):
                    if not self._on_frame(connection, payload):
                        return
                await writer.drain()
        except MalformedFrameError as exc:
            self._reply_error(connection, 0, 0, exc)
        except ConnectionError:
            pass
        finally:
            for group, callback in connection.producer_callbacks:
                self.broker.unregister_producer(group, callback)
            self._connections.discard(connection)
            connection.flush()
            writer.close()
            log.debug("connection from %s closed", connection.peer)

    def _on_frame(self, connection: _Connection, payload: bytes) -> bool:
        """Handle one request frame; False when the connection must be closed."""
        try:
            code, request_id, kind, body = decode_frame(payload)
        except MalformedFrameError as exc:
            self._reply_error(connection, 0, 0, exc)
            return True
        if kind is not Kind.REQUEST:
            self._reply_error(connection, code, request_id, MalformedFrameError("expected a request"))
            return True
        if code == RequestCode.AUTHENTICATE:
            return self._authenticate(connection, code, request_id, body)  # wrong keys: answer, then close
        if self._stopping:
            self._reply_error(connection, code, request_id, BrokerClosedError("the broker is stopping"))
            return True
        if not connection.authenticated:
            self._reply_error(connection, code, request_id, AuthenticationError("authenticate first"))
            return False
        batched = self._batched.get(code)
        if batched is not None:  # the hot path: no task per request
            method, batcher = batched
            try:
                item = _batch_item(method, convert_arguments(method, body))
            except MalformedFrameError as exc:
                self._reply_error(connection, code, request_id, exc)
                return True
            batcher.submit(item, functools.partial(self._answer, connection, code, request_id))
            return True
        self._track(asyncio.create_task(self._dispatch(connection, code, request_id, body)))
        return True

    def _track(self, task: asyncio.Task[None]) -> None:
        """Count ``task`` as in flight until it ends (``stop`` waits for these)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _reply(self, connection: _Connection, code: int, request_id: int, result: Any) -> None:
        connection.send(encode_frame(code, request_id, Kind.RESPONSE, {"ok": to_wire(result)}))

    def _reply_error(self, connection: _Connection, code: int, request_id: int, error: BrokerError) -> None:
        connection.send(encode_frame(code, request_id, Kind.RESPONSE, {"error": [error.code, str(error)]}))

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
        if code == RequestCode.HEART_BEAT:
            group = _text(body, "producer_group")
            if all(registered != group for registered, _ in connection.producer_callbacks):
                self.broker.register_producer(group, connection.push_check)
                connection.producer_callbacks.append((group, connection.push_check))
                log.info("producer %s registered for check-backs of group %s", connection.peer, group)
            return None
        if code == RequestCode.UNREGISTER_CLIENT:
            group = _text(body, "producer_group")
            self.broker.unregister_producer(group, connection.push_check)
            connection.producer_callbacks = [p for p in connection.producer_callbacks if p[0] != group]
            return None
        if code == RequestCode.SEND_BATCH_MESSAGE:
            return await self._send_batch(body)
        if code == RequestCode.EXPORT_MESSAGES:
            out_dir, fmt = _text(body, "out_dir"), _text(body, "fmt", "parquet")
            log.info("exporting messages as %s to %s", fmt, out_dir)
            return await asyncio.get_running_loop().run_in_executor(self.executor, self._export, out_dir, fmt)
        try:
            method = METHODS[RequestCode(code)]
        except (ValueError, KeyError):
            raise UnknownRequestCodeError(f"unknown request code {code}") from None
        arguments = convert_arguments(method, body)
        if method == "receive":
            return await self._long_poll(arguments)
        call = functools.partial(getattr(self.broker, method), **arguments)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def _send_batch(self, body: Any) -> list[dict[str, Any]]:
        """SEND_BATCH_MESSAGE: every message joins the send batcher (and its fsync); the
        answer has one outcome per message, in order."""
        raw = body.get("messages") if isinstance(body, dict) else None
        try:
            messages = msgspec.convert(raw, list[Message])
        except msgspec.ValidationError as exc:
            raise MalformedFrameError(f"SEND_BATCH_MESSAGE: {exc}") from None
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in messages]
        for message, future in zip(messages, futures, strict=True):
            self._writes.submit(SendCall(message), future.set_result)
        outcomes = await asyncio.gather(*futures)
        return [outcome_to_wire(_typed(o) if isinstance(o, BaseException) else o) for o in outcomes]

    async def _long_poll(self, arguments: dict[str, Any]) -> Any:
        """A receive, its wait cut into slices so that a stopping server answers it at once
        (with nothing) instead of holding shutdown for the rest of the wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, arguments["wait_s"])
        while True:
            wait_s = min(POLL_SLICE_S, max(0.0, deadline - loop.time()))
            call = functools.partial(self.broker.receive, **{**arguments, "wait_s": wait_s})
            received = await loop.run_in_executor(self.poll_executor, call)
            if received or self._stopping or loop.time() >= deadline:
                return received

    def _export(self, out_dir: str, fmt: str) -> dict[str, int]:
        from .broker import EmbeddedBroker
        from .export import export_messages

        if not isinstance(self.broker, EmbeddedBroker):
            raise UnknownRequestCodeError("this server's broker cannot export")
        return export_messages(self.broker, out_dir, fmt)  # type: ignore[arg-type]

    def _authenticate(self, connection: _Connection, code: int, request_id: int, body: Any) -> bool:
        """Answer an AUTHENTICATE request; False if the credentials are wrong."""
        if self._authenticator is not None:
            try:
                self._authenticator.verify(body)
            except AuthenticationError as exc:
                log.warning("authentication failed from %s: %s", connection.peer, exc)
                self._reply_error(connection, code, request_id, exc)
                return False
        connection.authenticated = True
        self._reply(connection, code, request_id, None)
        return True


def _batch_item(method: str, arguments: dict[str, Any]) -> Any:
    """What a batched request queues: a write call, or the arguments of an ack."""
    write_call = _WRITE_CALLS.get(method)
    if write_call is None:
        return arguments
    try:
        return write_call(**arguments)
    except TypeError as exc:
        raise MalformedFrameError(f"{method}: {exc}") from None


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


async def run_server(server: BrokerServer, stop: asyncio.Event) -> None:
    """Start ``server`` and run it until ``stop`` is set."""
    await server.start()
    await stop.wait()
    await server.stop()
