"""``BrokerClient``: the ``BrokerAPI`` over TCP, synchronous and thread-safe.

One connection, pipelined: any number of threads may have requests in flight; a reader
thread matches answers to waiting callers by request id. A dropped connection fails the
requests in flight with ``BrokerUnavailableError`` and is re-opened by the next call
(producer registrations are renewed then). Check-backs pushed by the server run the
registered callbacks on a worker thread.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlparse

import msgspec

from .api import BrokerStats, CheckCallback, ParkedTransaction, TopicInfo
from .auth import CHALLENGE_REQUEST, credentials
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

log = logging.getLogger("broker_embedded.client")


def parse_tcp_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``tcp://host:port``."""
    parsed = urlparse(url)
    if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
        raise ValueError(f"expected tcp://host:port, got {url!r}")
    return parsed.hostname, parsed.port


class _Link:
    """One TCP connection and the requests waiting for an answer on it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.pending: dict[int, Future[Any]] = {}
        self.failure: str | None = None
        self.error: type[BrokerUnavailableError] = BrokerUnavailableError

    def fail(self, reason: str, error: type[BrokerUnavailableError] = BrokerUnavailableError) -> None:
        """Mark the link dead and fail everything waiting on it with ``error``."""
        with self.lock:
            if self.failure is None:
                self.failure, self.error = reason, error
            pending, self.pending = self.pending, {}
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread, sends FIN now
        except OSError:
            pass
        self.sock.close()
        for future in pending.values():
            if not future.done():
                future.set_exception(error(reason))


class TcpClientSettings:
    """Where and how a client connects; shared by ``BrokerClient`` and ``AsyncBrokerClient``."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float,
                 access_key: str | None, secret_key: str | None) -> None:
        self.url = url
        self.host, self.port = parse_tcp_url(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.access_key = access_key
        self.secret_key = secret_key


def refusal(request_id: int, body: Any) -> BrokerUnavailableError | None:
    """The error of an answer to no request (id 0) saying the server will not serve the
    connection (``ServerBusyError`` past its connection cap), or None."""
    if request_id != 0:
        return None
    try:
        unwrap_response(body)
    except BrokerUnavailableError as exc:
        return exc
    except (BrokerError, ValueError):
        return None
    return None


def pushed_check(code: int, body: Any) -> CheckRequest | None:
    """The check-back a server push carries (CHECK_TRANSACTION_STATE), or None for others."""
    if code != RequestCode.CHECK_TRANSACTION_STATE:
        return None
    return msgspec.convert(body, CheckRequest)


class BrokerClient(TcpClientSettings):
    """A remote broker at ``tcp://host:port``; implements ``BrokerAPI``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        super().__init__(url, timeout_s, connect_timeout_s, access_key, secret_key)
        self._connect_lock = threading.Lock()
        self._link: _Link | None = None
        self._ids = itertools.count(1)
        self._producers: dict[str, list[CheckCallback]] = {}
        self._callbacks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="check-callback")
        self._closed = False

    # -- connection -----------------------------------------------------------------------
    def _connection(self) -> _Link:
        """The live link, opening (and authenticating, re-registering) a new one if needed."""
        link = self._link
        if link is not None and link.failure is None:
            return link
        with self._connect_lock:
            if self._closed:
                raise BrokerClosedError("the client is closed")
            link = self._link
            if link is not None and link.failure is None:
                return link
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
            except OSError as exc:
                raise BrokerUnavailableError(f"cannot connect to {self.url}: {exc}") from None
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(sock)
            threading.Thread(target=self._read_loop, args=(link,), daemon=True,
                             name=f"broker-client-{self.port}").start()
            try:
                if self.access_key and self.secret_key:
                    challenge = self._exchange(link, RequestCode.AUTHENTICATE, CHALLENGE_REQUEST)
                    self._exchange(link, RequestCode.AUTHENTICATE,
                                   credentials(self.access_key, self.secret_key, challenge))
                for group in list(self._producers):
                    self._exchange(link, RequestCode.HEART_BEAT, {"producer_group": group})
            except BrokerError as exc:
                link.fail(f"handshake with {self.url} failed: {exc}")
                raise
            self._link = link
            return link

    def _read_loop(self, link: _Link) -> None:
        frames = FrameBuffer()
        try:
            while data := link.sock.recv(READ_CHUNK):
                for payload in frames.feed(data):
                    code, request_id, kind, body = decode_frame(payload)
                    if kind is Kind.PUSH:
                        self._on_push(code, body)
                        continue
                    if (refused := refusal(request_id, body)) is not None:
                        link.fail(str(refused), type(refused))
                        return
                    with link.lock:
                        future = link.pending.pop(request_id, None)
                    if future is not None and not future.done():
                        future.set_result(body)
            link.fail(f"connection to {self.url} closed by the broker")
        except (OSError, MalformedFrameError, ValueError) as exc:
            link.fail(f"connection to {self.url} lost: {exc}")

    def _on_push(self, code: int, body: Any) -> None:
        request = pushed_check(code, body)
        callbacks = self._producers.get(request.producer_group) if request else None
        if request and callbacks:
            self._callbacks.submit(self._run_callback, callbacks[0], request)

    @staticmethod
    def _run_callback(callback: CheckCallback, request: CheckRequest) -> None:
        try:
            callback(request)
        except Exception:
            log.exception("check callback failed for transaction %s", request.transaction_id)

    # -- requests -------------------------------------------------------------------------
    def _exchange(self, link: _Link, code: RequestCode, arguments: dict[str, Any], extra_wait_s: float = 0.0) -> Any:
        """Send one request on ``link`` and wait for its answer (the ``ok`` value)."""
        request_id = next(self._ids)
        future: Future[Any] = Future()
        with link.lock:
            if link.failure is not None:
                raise link.error(link.failure)
            link.pending[request_id] = future
        try:
            with link.send_lock:
                link.sock.sendall(encode_frame(code, request_id, Kind.REQUEST, arguments))
        except OSError as exc:
            link.fail(f"cannot send to {self.url}: {exc}")
        try:
            body = future.result(self.timeout_s + extra_wait_s)
        except FutureTimeout:
            with link.lock:
                link.pending.pop(request_id, None)
            raise RequestTimeoutError(
                f"{code.name} got no answer from {self.url} within {self.timeout_s + extra_wait_s:.1f}s"
            ) from None
        return unwrap_response(body)

    def _request(self, code: RequestCode, arguments: dict[str, Any], extra_wait_s: float = 0.0) -> Any:
        return self._exchange(self._connection(), code, arguments, extra_wait_s)

    def _call(self, method: str, extra_wait_s: float = 0.0, **arguments: Any) -> Any:
        raw = self._request(CODES[method], request_body(arguments), extra_wait_s)
        return convert_result(method, raw)

    # -- BrokerAPI ------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        return self._call("create_topic", topic=topic, queues=queues)  # type: ignore[no-any-return]

    def list_topics(self) -> list[TopicInfo]:
        return self._call("list_topics")  # type: ignore[no-any-return]

    def send(self, message: Message) -> SendResult:
        return self._call("send", message=message)  # type: ignore[no-any-return]

    def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages in one request (SEND_BATCH_MESSAGE); per message, in order, its
        result or the typed error that refused it (the others are still sent)."""
        items = self._request(RequestCode.SEND_BATCH_MESSAGE, {"messages": [to_wire(m) for m in messages]})
        return [outcome_from_wire(item, SendResult) for item in items]

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        return self._call(  # type: ignore[no-any-return]
            "send_half", message=message, producer_group=producer_group, transaction_id=transaction_id
        )

    def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                        from_check: bool = False) -> EndTransactionResult:
        return self._call(  # type: ignore[no-any-return]
            "end_transaction", transaction_id=transaction_id, resolution=resolution,
            producer_group=producer_group, from_check=from_check,
        )

    def transaction_state(self, transaction_id: str) -> TransactionState:
        return self._call("transaction_state", transaction_id=transaction_id)  # type: ignore[no-any-return]

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        first = producer_group not in self._producers
        self._producers.setdefault(producer_group, []).append(on_check)
        if first:
            self._request(RequestCode.HEART_BEAT, {"producer_group": producer_group})

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        callbacks = self._producers.get(producer_group, [])
        if on_check in callbacks:
            callbacks.remove(on_check)
        if not callbacks and producer_group in self._producers:
            del self._producers[producer_group]
            self._request(RequestCode.UNREGISTER_CLIENT, {"producer_group": producer_group})

    def receive(self, group: str, topic: str, *, max_messages: int = 32,
                invisible_duration_s: float = 30.0, wait_s: float = 0.0,
                max_bytes: int | None = None) -> list[ReceivedMessage]:
        return self._call(  # type: ignore[no-any-return]
            "receive", extra_wait_s=wait_s, group=group, topic=topic, max_messages=max_messages,
            invisible_duration_s=invisible_duration_s, wait_s=wait_s, max_bytes=max_bytes,
        )

    def ack(self, group: str, receipt_handle: str) -> None:
        self._call("ack", group=group, receipt_handle=receipt_handle)

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float) -> str:
        return self._call(  # type: ignore[no-any-return]
            "change_invisible_duration", group=group, receipt_handle=receipt_handle,
            invisible_duration_s=invisible_duration_s,
        )

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             max_bytes: int | None = None) -> list[StoredMessage]:
        return self._call(  # type: ignore[no-any-return]
            "read", topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages, max_bytes=max_bytes
        )

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._call(  # type: ignore[no-any-return]
            "offset_for_timestamp", topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms
        )

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        return self._call("query_by_id", message_id=message_id)  # type: ignore[no-any-return]

    def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                     max_bytes: int | None = None) -> list[StoredMessage]:
        return self._call(  # type: ignore[no-any-return]
            "query_by_key", topic=topic, key=key, max_messages=max_messages, max_bytes=max_bytes
        )

    def list_parked(self) -> list[ParkedTransaction]:
        return self._call("list_parked")  # type: ignore[no-any-return]

    def open_transactions(self, producer_group: str | None = None) -> list[str]:
        return self._call("open_transactions", producer_group=producer_group)  # type: ignore[no-any-return]

    def resolve_parked(
        self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0,
    ) -> EndTransactionResult:
        return self._call(  # type: ignore[no-any-return]
            "resolve_parked", extra_wait_s=wait_s, transaction_id=transaction_id, force=force, wait_s=wait_s
        )

    def recheck_parked(self, transaction_id: str) -> None:
        self._call("recheck_parked", transaction_id=transaction_id)

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return self._call(  # type: ignore[no-any-return]
            "list_dlq", group=group, max_messages=max_messages, max_bytes=max_bytes
        )

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        return self._call("resend_dlq", group=group, message_id=message_id)  # type: ignore[no-any-return]

    def stats(self) -> BrokerStats:
        return self._call("stats")  # type: ignore[no-any-return]

    def export(self, out_dir: str, fmt: str = "parquet") -> dict[str, int]:
        """Have the server export its messages to ``out_dir`` on the server's machine."""
        result = self._request(RequestCode.EXPORT_MESSAGES, {"out_dir": out_dir, "fmt": fmt}, 600)
        return {str(k): int(v) for k, v in result.items()}

    def close(self) -> None:
        """Close the connection; later calls raise ``BrokerClosedError``."""
        with self._connect_lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.fail("client closed")
        self._callbacks.shutdown(wait=False)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
