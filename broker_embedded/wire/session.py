"""The client side of the TCP protocol without I/O: what ``BrokerClient`` and
``AsyncBrokerClient`` share, as httpx and psycopg share one core under their sync and
async clients.

``ClientSession`` holds the request ids, the producer registrations, the opening of a
connection (authentication, then the registrations replayed) and what a received frame
means (an answer for a waiter, a refusal of the connection, a check-back to run). Each
``BrokerAPI`` method is a ``Call``: the request to send and how to read its answer.
``Replies`` are the requests of one connection waiting for their answers. The clients
only move bytes, wait and run callbacks.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast
from urllib.parse import urlparse

import msgspec

from ..api import BrokerStats, DeletedGroup, GroupReset, ParkedTransaction, TopicInfo
from ..errors import (
    BrokerClosedError,
    BrokerError,
    BrokerUnavailableError,
    RequestTimeoutError,
    error_for_code,
)
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
from .auth import CHALLENGE_REQUEST, credentials
from .protocol import (
    CODES,
    UNDECODABLE,
    Kind,
    RequestCode,
    answer_decoder,
    convert_result,
    decode_body,
    encode_frame,
    outcome_from_wire,
    read_frame,
    request_body,
    unwrap_response,
)

T = TypeVar("T")
#: A check-back callback, as the client takes it (sync, or possibly a coroutine function).
C = TypeVar("C")


class Waiter(Protocol):
    """What waits for an answer: a ``concurrent.futures.Future`` or an ``asyncio.Future``."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


W = TypeVar("W", bound=Waiter)


class Link(Protocol):
    """A client's connection: its I/O, and ``replies``."""

    @property
    def replies(self) -> Replies[Any]: ...


L = TypeVar("L", bound=Link)


def parse_tcp_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``tcp://host:port``."""
    parsed = urlparse(url)
    if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
        raise ValueError(f"expected tcp://host:port, got {url!r}")
    return parsed.hostname, parsed.port


class Call(msgspec.Struct, Generic[T], frozen=True):
    """One request and how its answer becomes the method's result."""

    code: RequestCode
    body: Any
    #: The result of an answer's ``ok`` value, decoded as it is.
    read: Callable[[Any], T]
    #: Waited for on top of the client's ``timeout_s`` (a receive's ``wait_s``).
    extra_wait_s: float = 0.0
    #: Decodes an answer straight to its result (``answer_decoder``); None: as it is, then ``read``.
    typed: msgspec.msgpack.Decoder[Any] | None = None

    def frame(self, request_id: int) -> bytes:
        """The request's frame under ``request_id``."""
        return encode_frame(self.code, request_id, Kind.REQUEST, self.body)

    def result(self, body: msgspec.Raw | bytes) -> T:
        """The result of the encoded answer ``body``, or its typed error raised. An answer
        the typed decoder does not take (no ``ok``, or not of the result's shape) goes the
        general way, which says what is wrong with it as it always did."""
        if self.typed is not None:
            try:
                answer = self.typed.decode(body)
            except (msgspec.ValidationError, *UNDECODABLE):
                pass
            else:
                if answer.error is not msgspec.UNSET:
                    raise error_for_code(*answer.error)
                if answer.ok is not msgspec.UNSET:
                    return cast(T, answer.ok)
        return self.read(unwrap_response(decode_body(body)))


def _method(name: str, extra_wait_s: float = 0.0, **arguments: Any) -> Call[Any]:
    """The call of the ``BrokerAPI`` method ``name``, its result of the method's type."""
    return Call(CODES[name], request_body(arguments), lambda raw: convert_result(name, raw), extra_wait_s,
                answer_decoder(name))


def raw_call(code: RequestCode, body: Any) -> Call[Any]:
    """A request of ``code`` with ``body`` as it is, its result the answer's ``ok`` value."""
    return Call(code, body, lambda raw: raw)


@dataclass
class Replies(Generic[W]):
    """The requests of one connection waiting for their answers; thread-safe."""

    pending: dict[int, W] = field(default_factory=dict)
    failure: str | None = None
    error: type[BrokerUnavailableError] = BrokerUnavailableError
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.failure is None

    def expect(self, request_id: int, waiter: W) -> None:
        """Wait for the answer to ``request_id``; the connection's error if it failed."""
        with self.lock:
            if self.failure is not None:
                raise self.error(self.failure)
            self.pending[request_id] = waiter

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (it timed out)."""
        with self.lock:
            self.pending.pop(request_id, None)

    def answer(self, request_id: int, body: msgspec.Raw | bytes) -> None:
        with self.lock:
            waiter = self.pending.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(body)

    def fail(self, reason: str, error: type[BrokerUnavailableError] = BrokerUnavailableError) -> None:
        """The connection is dead: everything waiting gets ``error``, and so does every later request."""
        with self.lock:
            if self.failure is None:
                self.failure, self.error = reason, error
            pending, self.pending = self.pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(error(reason))


def refusal(body: Any) -> BrokerUnavailableError | None:
    """The error of an answer to no request (id 0) saying the server will not serve the
    connection (``ServerBusyError`` past its connection cap), or None."""
    try:
        unwrap_response(body)
    except BrokerUnavailableError as exc:
        return exc
    except (BrokerError, ValueError):
        return None
    return None


class ClientSession(Generic[C]):
    """Where and how a client connects, and the protocol state it keeps across connections."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float,
                 access_key: str | None, secret_key: str | None) -> None:
        self.url = url
        self.host, self.port = parse_tcp_url(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.access_key = access_key
        self.secret_key = secret_key
        self.producers: dict[str, list[C]] = {}
        self._ids = itertools.count(1)

    # -- connections ----------------------------------------------------------------------
    def new_id(self) -> int:
        return next(self._ids)

    def wait_s(self, call: Call[Any]) -> float:
        """How long a client waits for the answer to ``call``."""
        return self.timeout_s + call.extra_wait_s

    def timed_out(self, call: Call[Any]) -> RequestTimeoutError:
        return RequestTimeoutError(f"{call.code.name} got no answer from {self.url} within {self.wait_s(call):.1f}s")

    def challenge(self) -> Call[Any] | None:
        """The first request on a new connection when the client has keys: ask for a challenge."""
        if self.access_key and self.secret_key:
            return raw_call(RequestCode.AUTHENTICATE, CHALLENGE_REQUEST)
        return None

    def opening(self, challenge: Any) -> list[Call[Any]]:
        """The rest of a new connection's opening: the answer to ``challenge`` (if one was
        asked), then the producer registrations renewed."""
        calls = []
        if challenge is not None and self.access_key and self.secret_key:
            calls.append(raw_call(RequestCode.AUTHENTICATE, credentials(self.access_key, self.secret_key, challenge)))
        calls.extend(raw_call(RequestCode.HEART_BEAT, {"producer_group": group}) for group in list(self.producers))
        return calls

    def received(self, replies: Replies[Any], payload: bytes) -> tuple[C, CheckRequest] | None:
        """Take in one frame: an answer goes to its waiter; a refusal of the connection fails
        ``replies`` (the client then stops reading); a check-back pushed for a registered
        producer group returns the callback to run with it."""
        frame = read_frame(payload)
        if frame.kind is Kind.PUSH:
            if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
                return None
            request = msgspec.convert(decode_body(frame.body), CheckRequest)
            callbacks = self.producers.get(request.producer_group)
            return (callbacks[0], request) if callbacks else None
        if frame.request_id != 0:
            replies.answer(frame.request_id, frame.body)  # decoded by its call (``Call.result``)
        elif (refused := refusal(decode_body(frame.body))) is not None:
            replies.fail(str(refused), type(refused))
        return None

    # -- registrations --------------------------------------------------------------------
    def register_producer(self, producer_group: str, on_check: C) -> Call[None] | None:
        """Add a callback; the HEART_BEAT to send for a group's first one."""
        first = producer_group not in self.producers
        self.producers.setdefault(producer_group, []).append(on_check)
        return raw_call(RequestCode.HEART_BEAT, {"producer_group": producer_group}) if first else None

    def unregister_producer(self, producer_group: str, on_check: C) -> Call[None] | None:
        """Remove a callback; the UNREGISTER_CLIENT to send when it was the group's last."""
        callbacks = self.producers.get(producer_group, [])
        if on_check in callbacks:
            callbacks.remove(on_check)
        if not callbacks and producer_group in self.producers:
            del self.producers[producer_group]
            return raw_call(RequestCode.UNREGISTER_CLIENT, {"producer_group": producer_group})
        return None

    # -- BrokerAPI as calls ---------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4) -> Call[TopicInfo]:
        return _method("create_topic", topic=topic, queues=queues)

    def list_topics(self) -> Call[list[TopicInfo]]:
        return _method("list_topics")

    def send(self, message: Message) -> Call[SendResult]:
        return _method("send", message=message)

    def send_batch(self, messages: list[Message]) -> Call[list[SendResult | BrokerError]]:
        return Call(RequestCode.SEND_BATCH_MESSAGE, {"messages": messages},
                    lambda items: [outcome_from_wire(item, SendResult) for item in items])

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> Call[SendResult]:
        return _method("send_half", message=message, producer_group=producer_group, transaction_id=transaction_id)

    def relay_committed(self, messages: list[Message], *, producer_group: str,
                        transaction_id: str) -> Call[list[SendResult]]:
        return _method("relay_committed", messages=messages, producer_group=producer_group,
                       transaction_id=transaction_id)

    def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                        from_check: bool = False, oneway: bool = False) -> Call[EndTransactionResult]:
        # oneway only when set: a broker from before it takes the waited END as it was
        extra = {"oneway": True} if oneway else {}
        return _method("end_transaction", transaction_id=transaction_id, resolution=resolution,
                       producer_group=producer_group, from_check=from_check, **extra)

    def recall(self, topic: str, recall_handle: str) -> Call[str]:
        return _method("recall", topic=topic, recall_handle=recall_handle)

    def transaction_state(self, transaction_id: str) -> Call[TransactionState]:
        return _method("transaction_state", transaction_id=transaction_id)

    def receive(self, group: str, topic: str, *, max_messages: int = 32, invisible_duration_s: float = 30.0,
                wait_s: float = 0.0, max_bytes: int | None = None,
                filter_expression: str = "*", filter_type: str = "TAG") -> Call[list[ReceivedMessage]]:
        # each sent only when it is not the default: a broker from before filters (or before
        # SQL92) takes the request as it was
        filtering = {name: value for name, value, default in (("filter_expression", filter_expression, "*"),
                                                             ("filter_type", filter_type, "TAG")) if value != default}
        return _method("receive", wait_s, group=group, topic=topic, max_messages=max_messages,
                       invisible_duration_s=invisible_duration_s, wait_s=wait_s, max_bytes=max_bytes, **filtering)

    def ack(self, group: str, receipt_handle: str) -> Call[None]:
        return _method("ack", group=group, receipt_handle=receipt_handle)

    def ack_many(self, group: str, receipt_handles: list[str]) -> Call[list[BrokerError | None]]:
        return Call(RequestCode.ACK_MESSAGE_BATCH, {"group": group, "receipt_handles": list(receipt_handles)},
                    lambda items: [outcome_from_wire(item, None) for item in items])

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float,
                                  keep_receipt: bool = False) -> Call[str]:
        # sent only when set: a broker from before it takes the request as it was
        keeping = {"keep_receipt": True} if keep_receipt else {}
        return _method("change_invisible_duration", group=group, receipt_handle=receipt_handle,
                       invisible_duration_s=invisible_duration_s, **keeping)

    def dead_letter(self, group: str, receipt_handle: str) -> Call[None]:
        return _method("dead_letter", group=group, receipt_handle=receipt_handle)

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             max_bytes: int | None = None) -> Call[list[StoredMessage]]:
        return _method("read", topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages,
                       max_bytes=max_bytes)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> Call[int]:
        return _method("offset_for_timestamp", topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms)

    def query_by_id(self, message_id: str) -> Call[StoredMessage | None]:
        return _method("query_by_id", message_id=message_id)

    def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                     max_bytes: int | None = None) -> Call[list[StoredMessage]]:
        return _method("query_by_key", topic=topic, key=key, max_messages=max_messages, max_bytes=max_bytes)

    def list_parked(self) -> Call[list[ParkedTransaction]]:
        return _method("list_parked")

    def open_transactions(self, producer_group: str | None = None) -> Call[list[str]]:
        return _method("open_transactions", producer_group=producer_group)

    def resolve_parked(self, transaction_id: str, *, force: Resolution | None = None,
                       wait_s: float = 10.0) -> Call[EndTransactionResult]:
        return _method("resolve_parked", wait_s, transaction_id=transaction_id, force=force, wait_s=wait_s)

    def recheck_parked(self, transaction_id: str) -> Call[None]:
        return _method("recheck_parked", transaction_id=transaction_id)

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> Call[list[StoredMessage]]:
        return _method("list_dlq", group=group, max_messages=max_messages, max_bytes=max_bytes)

    def resend_dlq(self, group: str, message_id: str) -> Call[SendResult]:
        return _method("resend_dlq", group=group, message_id=message_id)

    def delete_group(self, group: str) -> Call[DeletedGroup]:
        return _method("delete_group", group=group)

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> Call[GroupReset]:
        return _method("reset_group", group=group, topic=topic, timestamp_ms=timestamp_ms)

    def stats(self) -> Call[BrokerStats]:
        return _method("stats")

    def export(self, out_dir: str, fmt: str = "parquet") -> Call[dict[str, int]]:
        """The server exports its messages to ``out_dir`` on its machine (waited for up to 600 s more)."""
        return Call(RequestCode.EXPORT_MESSAGES, {"out_dir": out_dir, "fmt": fmt},
                    lambda result: {str(k): int(v) for k, v in result.items()}, 600)


class SessionClient(Generic[C, L]):
    """What both TCP clients hold: their session and their current connection."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self._session: ClientSession[C] = ClientSession(url, timeout_s, connect_timeout_s, access_key, secret_key)
        self.url, self.host, self.port = url, self._session.host, self._session.port
        self._link: L | None = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        """Set up the client's own I/O state (its locks, its callback runner)."""

    def _current(self) -> L | None:
        """The connection if it is alive; ``BrokerClosedError`` once the client is closed."""
        if self._closed:
            raise BrokerClosedError("the client is closed")
        link = self._link
        return link if link is not None and link.replies.alive else None
