"""``AsyncBrokerClient``: the ``BrokerAPI`` over TCP for asyncio code.

The same protocol and semantics as :class:`broker_embedded.client.BrokerClient`, with
every method a coroutine: one connection, pipelined (any number of tasks may await
answers at once), re-opened by the next call after a drop (producer registrations are
renewed then), ``RequestTimeoutError`` after ``timeout_s``. Check-back callbacks given to
``register_producer`` may be plain functions or coroutine functions; they run as tasks on
the client's event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .api import BrokerStats, ParkedTransaction, TopicInfo
from .auth import CHALLENGE_REQUEST, credentials
from .client import TcpClientSettings, pushed_check, refusal
from .errors import (
    BrokerClosedError,
    BrokerError,
    BrokerUnavailableError,
    MalformedFrameError,
    RequestTimeoutError,
)
from .message import (
    CheckRequest,
    EndTransactionResult,
    Message,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
)
from .protocol import (
    CODES,
    READ_CHUNK,
    FrameBuffer,
    Kind,
    RequestCode,
    convert_result,
    decode_frame,
    encode_frame,
    outcome_from_wire,
    request_body,
    to_wire,
    unwrap_response,
)

log = logging.getLogger("broker_embedded.aio_client")

#: A check-back handler: called with the request, may return an awaitable.
AsyncCheckCallback = Callable[[CheckRequest], Awaitable[None] | None]


class _AsyncLink:
    """One connection, its reader task and the requests waiting on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.failure: str | None = None
        self.error: type[BrokerUnavailableError] = BrokerUnavailableError
        self.task: asyncio.Task[None] | None = None
        self.outgoing: list[bytes] = []

    def send(self, frame: bytes) -> None:
        """Queue a frame; the frames queued in one loop iteration go out in one write."""
        if not self.outgoing:
            asyncio.get_running_loop().call_soon(self.flush)
        self.outgoing.append(frame)

    def flush(self) -> None:
        frames, self.outgoing = self.outgoing, []
        if frames and not self.writer.is_closing():
            self.writer.write(b"".join(frames))

    def fail(self, reason: str, error: type[BrokerUnavailableError] = BrokerUnavailableError) -> None:
        if self.failure is None:
            self.failure, self.error = reason, error
        pending, self.pending = self.pending, {}
        self.writer.close()
        for future in pending.values():
            if not future.done():
                future.set_exception(error(reason))


class AsyncBrokerClient(TcpClientSettings):
    """A remote broker at ``tcp://host:port`` for asyncio; ``BrokerAPI`` with coroutines."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        super().__init__(url, timeout_s, connect_timeout_s, access_key, secret_key)
        self._connect_lock = asyncio.Lock()
        self._link: _AsyncLink | None = None
        self._ids = itertools.count(1)
        self._producers: dict[str, list[AsyncCheckCallback]] = {}
        self._callback_tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- connection -----------------------------------------------------------------------
    async def _connection(self) -> _AsyncLink:
        link = self._link
        if link is not None and link.failure is None:
            return link
        async with self._connect_lock:
            if self._closed:
                raise BrokerClosedError("the client is closed")
            link = self._link
            if link is not None and link.failure is None:
                return link
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                raise BrokerUnavailableError(f"cannot connect to {self.url}: {exc!r}") from None
            link = _AsyncLink(reader, writer)
            link.task = asyncio.create_task(self._read_loop(link))
            try:
                if self.access_key and self.secret_key:
                    challenge = await self._exchange(link, RequestCode.AUTHENTICATE, CHALLENGE_REQUEST)
                    await self._exchange(link, RequestCode.AUTHENTICATE,
                                         credentials(self.access_key, self.secret_key, challenge))
                for group in list(self._producers):
                    await self._exchange(link, RequestCode.HEART_BEAT, {"producer_group": group})
            except BrokerError as exc:
                link.fail(f"handshake with {self.url} failed: {exc}")
                raise
            self._link = link
            return link

    async def _read_loop(self, link: _AsyncLink) -> None:
        try:
            frames = FrameBuffer()
            while data := await link.reader.read(READ_CHUNK):
                for payload in frames.feed(data):
                    code, request_id, kind, body = decode_frame(payload)
                    if kind is Kind.PUSH:
                        self._on_push(code, body)
                        continue
                    if (refused := refusal(request_id, body)) is not None:
                        link.fail(str(refused), type(refused))
                        return
                    future = link.pending.pop(request_id, None)
                    if future is not None and not future.done():
                        future.set_result(body)
            link.fail(f"connection to {self.url} closed by the broker")
        except (OSError, MalformedFrameError, ValueError) as exc:
            link.fail(f"connection to {self.url} lost: {exc!r}")

    def _on_push(self, code: int, body: Any) -> None:
        request = pushed_check(code, body)
        callbacks = self._producers.get(request.producer_group) if request else None
        if request and callbacks:
            task = asyncio.create_task(self._run_callback(callbacks[0], request))
            self._callback_tasks.add(task)
            task.add_done_callback(self._callback_tasks.discard)

    @staticmethod
    async def _run_callback(callback: AsyncCheckCallback, request: CheckRequest) -> None:
        try:
            outcome = callback(request)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("check callback failed for transaction %s", request.transaction_id)

    # -- requests -------------------------------------------------------------------------
    async def _exchange(self, link: _AsyncLink, code: RequestCode, arguments: dict[str, Any],
                        extra_wait_s: float = 0.0) -> Any:
        if link.failure is not None:
            raise link.error(link.failure)
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        link.send(encode_frame(code, request_id, Kind.REQUEST, arguments))
        try:
            await link.writer.drain()
        except OSError as exc:
            link.fail(f"cannot send to {self.url}: {exc!r}")
        try:
            body = await asyncio.wait_for(future, self.timeout_s + extra_wait_s)
        except TimeoutError:
            link.pending.pop(request_id, None)
            raise RequestTimeoutError(
                f"{code.name} got no answer from {self.url} within {self.timeout_s + extra_wait_s:.1f}s"
            ) from None
        return unwrap_response(body)

    async def _request(self, code: RequestCode, arguments: dict[str, Any], extra_wait_s: float = 0.0) -> Any:
        return await self._exchange(await self._connection(), code, arguments, extra_wait_s)

    async def _call(self, method: str, extra_wait_s: float = 0.0, **arguments: Any) -> Any:
        raw = await self._request(CODES[method], request_body(arguments), extra_wait_s)
        return convert_result(method, raw)

    # -- BrokerAPI, as coroutines ---------------------------------------------------------
    async def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        return await self._call("create_topic", topic=topic, queues=queues)  # type: ignore[no-any-return]

    async def list_topics(self) -> list[TopicInfo]:
        return await self._call("list_topics")  # type: ignore[no-any-return]

    async def send(self, message: Message) -> SendResult:
        return await self._call("send", message=message)  # type: ignore[no-any-return]

    async def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages in one request (SEND_BATCH_MESSAGE); per message, in order, its
        result or the typed error that refused it (the others are still sent)."""
        items = await self._request(RequestCode.SEND_BATCH_MESSAGE, {"messages": [to_wire(m) for m in messages]})
        return [outcome_from_wire(item, SendResult) for item in items]

    async def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        return await self._call(  # type: ignore[no-any-return]
            "send_half", message=message, producer_group=producer_group, transaction_id=transaction_id
        )

    async def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                              from_check: bool = False) -> EndTransactionResult:
        return await self._call(  # type: ignore[no-any-return]
            "end_transaction", transaction_id=transaction_id, resolution=resolution,
            producer_group=producer_group, from_check=from_check,
        )

    async def transaction_state(self, transaction_id: str) -> TransactionState:
        return await self._call("transaction_state", transaction_id=transaction_id)  # type: ignore[no-any-return]

    async def register_producer(self, producer_group: str, on_check: AsyncCheckCallback) -> None:
        """Answer check-backs of ``producer_group`` with ``on_check`` (kept across reconnects)."""
        first = producer_group not in self._producers
        self._producers.setdefault(producer_group, []).append(on_check)
        if first:
            await self._request(RequestCode.HEART_BEAT, {"producer_group": producer_group})

    async def unregister_producer(self, producer_group: str, on_check: AsyncCheckCallback) -> None:
        callbacks = self._producers.get(producer_group, [])
        if on_check in callbacks:
            callbacks.remove(on_check)
        if not callbacks and producer_group in self._producers:
            del self._producers[producer_group]
            await self._request(RequestCode.UNREGISTER_CLIENT, {"producer_group": producer_group})

    async def receive(self, group: str, topic: str, *, max_messages: int = 32,
                      invisible_duration_s: float = 30.0, wait_s: float = 0.0,
                      max_bytes: int | None = None) -> list[ReceivedMessage]:
        return await self._call(  # type: ignore[no-any-return]
            "receive", extra_wait_s=wait_s, group=group, topic=topic, max_messages=max_messages,
            invisible_duration_s=invisible_duration_s, wait_s=wait_s, max_bytes=max_bytes,
        )

    async def ack(self, group: str, receipt_handle: str) -> None:
        await self._call("ack", group=group, receipt_handle=receipt_handle)

    async def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float) -> str:
        return await self._call(  # type: ignore[no-any-return]
            "change_invisible_duration", group=group, receipt_handle=receipt_handle,
            invisible_duration_s=invisible_duration_s,
        )

    async def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                   max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._call(  # type: ignore[no-any-return]
            "read", topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages, max_bytes=max_bytes
        )

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._call(  # type: ignore[no-any-return]
            "offset_for_timestamp", topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms
        )

    async def query_by_id(self, message_id: str) -> StoredMessage | None:
        return await self._call("query_by_id", message_id=message_id)  # type: ignore[no-any-return]

    async def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                           max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._call(  # type: ignore[no-any-return]
            "query_by_key", topic=topic, key=key, max_messages=max_messages, max_bytes=max_bytes
        )

    async def list_parked(self) -> list[ParkedTransaction]:
        return await self._call("list_parked")  # type: ignore[no-any-return]

    async def open_transactions(self, producer_group: str | None = None) -> list[str]:
        return await self._call("open_transactions", producer_group=producer_group)  # type: ignore[no-any-return]

    async def resolve_parked(
        self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0,
    ) -> EndTransactionResult:
        return await self._call(  # type: ignore[no-any-return]
            "resolve_parked", extra_wait_s=wait_s, transaction_id=transaction_id, force=force, wait_s=wait_s
        )

    async def recheck_parked(self, transaction_id: str) -> None:
        await self._call("recheck_parked", transaction_id=transaction_id)

    async def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._call(  # type: ignore[no-any-return]
            "list_dlq", group=group, max_messages=max_messages, max_bytes=max_bytes
        )

    async def resend_dlq(self, group: str, message_id: str) -> SendResult:
        return await self._call("resend_dlq", group=group, message_id=message_id)  # type: ignore[no-any-return]

    async def stats(self) -> BrokerStats:
        return await self._call("stats")  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close the connection; later calls raise ``BrokerClosedError``."""
        async with self._connect_lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.fail("client closed")
            if link.task is not None:
                link.task.cancel()
                await asyncio.gather(link.task, return_exceptions=True)
            try:
                await link.writer.wait_closed()
            except OSError:
                pass

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
