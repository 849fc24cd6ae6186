"""``AsyncBrokerClient``: the ``BrokerAPI`` over TCP for asyncio code.

The same protocol and semantics as :class:`broker_embedded.client.BrokerClient`, with
every method a coroutine: one connection, pipelined (any number of tasks may await
answers at once), re-opened by the next call after a drop (producer registrations are
renewed then), ``RequestTimeoutError`` after ``timeout_s``. Check-back callbacks given to
``register_producer`` may be plain functions or coroutine functions; they run as tasks on
the client's event loop. The protocol state is the shared
``broker_embedded.wire.session.ClientSession``; this module does the asyncio I/O.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..api import BrokerStats, DeletedGroup, GroupReset, ParkedTransaction, TopicInfo
from ..errors import BrokerError, BrokerUnavailableError, MalformedFrameError
from ..message import (
    CheckRequest,
    EndTransactionResult,
    Message,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
)
from ..wire.protocol import READ_CHUNK, FrameBuffer
from ..wire.session import Call, Replies, SessionClient

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A check-back handler: called with the request, may return an awaitable.
AsyncCheckCallback = Callable[[CheckRequest], Awaitable[None] | None]


class _AsyncLink:
    """One connection, its reader task and the requests waiting on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.replies: Replies[asyncio.Future[Any]] = Replies()
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
        self.replies.fail(reason, error)
        self.writer.close()


class AsyncBrokerClient(SessionClient[AsyncCheckCallback, _AsyncLink]):
    """A remote broker at ``tcp://host:port`` for asyncio; ``BrokerAPI`` with coroutines."""

    def _start(self) -> None:
        self._connect_lock = asyncio.Lock()
        self._callback_tasks: set[asyncio.Task[None]] = set()

    # -- connection -----------------------------------------------------------------------
    async def _connection(self) -> _AsyncLink:
        if (link := self._current()) is not None:
            return link
        async with self._connect_lock:
            if (link := self._current()) is not None:
                return link
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self._session.connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                raise BrokerUnavailableError(f"cannot connect to {self.url}: {exc!r}") from None
            link = _AsyncLink(reader, writer)
            link.task = asyncio.create_task(self._read_loop(link))
            try:
                ask = self._session.challenge()
                challenge = await self._exchange(link, ask) if ask else None
                for call in self._session.opening(challenge):
                    await self._exchange(link, call)
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
                    if (check := self._session.received(link.replies, payload)) is not None:
                        task = asyncio.create_task(self._run_callback(*check))
                        self._callback_tasks.add(task)
                        task.add_done_callback(self._callback_tasks.discard)
                    if not link.replies.alive:  # refused, or failed by a sender
                        link.writer.close()
                        return
            link.fail(f"connection to {self.url} closed by the broker")
        except (OSError, MalformedFrameError, ValueError) as exc:
            link.fail(f"connection to {self.url} lost: {exc!r}")

    @staticmethod
    async def _run_callback(callback: AsyncCheckCallback, request: CheckRequest) -> None:
        try:
            outcome = callback(request)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("check callback failed for transaction %s", request.transaction_id)

    # -- requests -------------------------------------------------------------------------
    async def _exchange(self, link: _AsyncLink, call: Call[T]) -> T:
        request_id = self._session.new_id()
        frame = call.frame(request_id)  # a body that does not encode raises here, nothing left waiting
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.replies.expect(request_id, future)
        link.send(frame)
        try:
            await link.writer.drain()
        except OSError as exc:
            link.fail(f"cannot send to {self.url}: {exc!r}")
        try:
            body = await asyncio.wait_for(future, self._session.wait_s(call))
        except TimeoutError:
            link.replies.forget(request_id)
            raise self._session.timed_out(call) from None
        return call.result(body)

    async def _do(self, call: Call[T]) -> T:
        return await self._exchange(await self._connection(), call)

    async def register_producer(self, producer_group: str, on_check: AsyncCheckCallback) -> None:
        """Answer check-backs of ``producer_group`` with ``on_check`` (kept across reconnects)."""
        if (call := self._session.register_producer(producer_group, on_check)) is not None:
            await self._do(call)

    async def unregister_producer(self, producer_group: str, on_check: AsyncCheckCallback) -> None:
        if (call := self._session.unregister_producer(producer_group, on_check)) is not None:
            await self._do(call)

    # -- BrokerAPI, as coroutines ------------------------------------------
    async def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        return await self._do(self._session.create_topic(topic, queues))

    async def list_topics(self) -> list[TopicInfo]:
        return await self._do(self._session.list_topics())

    async def send(self, message: Message) -> SendResult:
        return await self._do(self._session.send(message))

    async def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages in one request (SEND_BATCH_MESSAGE); per message, in order, its
        result or the typed error that refused it (the others are still sent)."""
        return await self._do(self._session.send_batch(messages))

    async def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        return await self._do(self._session.send_half(message, producer_group=producer_group, transaction_id=transaction_id))

    async def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                              from_check: bool = False, oneway: bool = False) -> EndTransactionResult:
        return await self._do(self._session.end_transaction(transaction_id, resolution, producer_group=producer_group,
                                                            from_check=from_check, oneway=oneway))

    async def relay_committed(self, messages: list[Message], *, producer_group: str,
                              transaction_id: str) -> list[SendResult]:
        return await self._do(self._session.relay_committed(messages, producer_group=producer_group,
                                                            transaction_id=transaction_id))

    async def recall(self, topic: str, recall_handle: str) -> str:
        return await self._do(self._session.recall(topic, recall_handle))

    async def transaction_state(self, transaction_id: str) -> TransactionState:
        return await self._do(self._session.transaction_state(transaction_id))

    async def receive(self, group: str, topic: str, *, max_messages: int = 32, invisible_duration_s: float = 30.0, wait_s: float = 0.0, max_bytes: int | None = None, filter_expression: str = "*", filter_type: str = "TAG") -> list[ReceivedMessage]:
        return await self._do(self._session.receive(group, topic, max_messages=max_messages, invisible_duration_s=invisible_duration_s, wait_s=wait_s, max_bytes=max_bytes, filter_expression=filter_expression, filter_type=filter_type))

    async def ack(self, group: str, receipt_handle: str) -> None:
        return await self._do(self._session.ack(group, receipt_handle))

    async def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        """Ack many receipts in one request (ACK_MESSAGE_BATCH); per receipt, in order,
        None or the typed error that refused it."""
        return await self._do(self._session.ack_many(group, receipt_handles))

    async def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float, *,
                                        keep_receipt: bool = False) -> str:
        return await self._do(self._session.change_invisible_duration(group, receipt_handle, invisible_duration_s,
                                                                      keep_receipt))

    async def dead_letter(self, group: str, receipt_handle: str) -> None:
        await self._do(self._session.dead_letter(group, receipt_handle))

    async def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._do(self._session.read(topic, queue_id, offset, max_messages, max_bytes))

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._do(self._session.offset_for_timestamp(topic, queue_id, timestamp_ms))

    async def query_by_id(self, message_id: str) -> StoredMessage | None:
        return await self._do(self._session.query_by_id(message_id))

    async def query_by_key(self, topic: str, key: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._do(self._session.query_by_key(topic, key, max_messages, max_bytes))

    async def list_parked(self) -> list[ParkedTransaction]:
        return await self._do(self._session.list_parked())

    async def open_transactions(self, producer_group: str | None = None) -> list[str]:
        return await self._do(self._session.open_transactions(producer_group))

    async def resolve_parked(self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0) -> EndTransactionResult:
        return await self._do(self._session.resolve_parked(transaction_id, force=force, wait_s=wait_s))

    async def recheck_parked(self, transaction_id: str) -> None:
        return await self._do(self._session.recheck_parked(transaction_id))

    async def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return await self._do(self._session.list_dlq(group, max_messages, max_bytes))

    async def resend_dlq(self, group: str, message_id: str) -> SendResult:
        return await self._do(self._session.resend_dlq(group, message_id))

    async def delete_group(self, group: str) -> DeletedGroup:
        return await self._do(self._session.delete_group(group))

    async def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> GroupReset:
        return await self._do(self._session.reset_group(group, topic, timestamp_ms))

    async def stats(self) -> BrokerStats:
        return await self._do(self._session.stats())

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
