"""``BrokerClient``: the ``BrokerAPI`` over TCP, synchronous and thread-safe.

One connection, pipelined: any number of threads may have requests in flight. Answers
are matched to their requests by request id, whoever reads them: a thread that waits for
its own answer reads the socket itself while no other thread does (the answer of a lone
call then needs no hand-off between threads), and completes the answers of the others it
reads on the way; a reader thread reads when no caller does: the answers nobody waits for
in a call (``start_send_half`` and ``start_end_transaction`` return a ``Future`` without
waiting: the request is on the wire, its answer comes later), and the check-backs pushed
while the client is idle, from ``LINGER_S`` after its last call. A ``start_*`` call with
``due=False`` leaves its answer to a caller: the one that waits for it later
(``BrokerClient.wait``), or any call that reads on the way; the reader thread reads it
only once the client has been quiet for ``LINGER_S``. A dropped connection
fails the requests in flight with ``BrokerUnavailableError`` and is re-opened by the next
call (producer registrations are renewed then). Check-backs pushed by the server run the
registered callbacks on a worker thread. The protocol state is the shared
``broker_embedded.wire.session.ClientSession``; this module does the socket I/O.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Generic, TypeVar

from ..api import BrokerStats, CheckCallback, DeletedGroup, GroupReset, ParkedTransaction, TopicInfo
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
from ..wire.protocol import READ_CHUNK, FrameBuffer, RequestCode
from ..wire.session import Call, Replies, SessionClient, raw_call

log = logging.getLogger(__name__)
T = TypeVar("T")


#: Guards every ``_Reply``'s settling and callbacks (each holds it for a few bytecodes).
_REPLIES_SETTLING = threading.Lock()


class _Reply(Generic[T]):
    """The answer to a call a thread waits for in that call (``BrokerClient._exchange``):
    set once, by whichever thread reads it. What a ``Future`` does for it, without a
    condition variable per answer: the waiting thread reads the socket itself, or sleeps on
    an event its done-callback sets (``_Link.await_answer``)."""

    __slots__ = ("_callbacks", "_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[_Reply[T]], None]] = []

    def done(self) -> bool:
        return self._done

    def set_result(self, result: T) -> None:
        self._settle(result, None)

    def set_exception(self, exception: BaseException) -> None:
        self._settle(None, exception)

    def _settle(self, result: T | None, error: BaseException | None) -> None:
        with _REPLIES_SETTLING:
            if self._done:  # answered and failed at once (the link died): the first one counts
                return
            self._result, self._error, self._done = result, error, True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[_Reply[T]], None]) -> None:
        with _REPLIES_SETTLING:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def result(self) -> T:
        """The result, or the error raised; only once ``done()``."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


#: What an ``_Answer`` completes: the ``Future`` of a ``start_*`` call, or the ``_Reply`` of a call waited for.
Completion = Future[T] | _Reply[T]


class _Answer(Generic[T]):
    """What waits in ``Replies`` for the answer to ``call``: completes ``future`` with the
    call's result or typed error, in the thread that reads it. ``due``: the reader thread
    reads it as soon as no caller reads (else a caller does, or the reader once the
    client is quiet)."""

    __slots__ = ("call", "due", "future")

    def __init__(self, call: Call[T], future: Completion[T], due: bool = True) -> None:
        self.call = call
        self.future = future
        self.due = due

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, body: Any) -> None:
        try:
            result = self.call.result(body)
        except Exception as exc:  # the typed error of a refusal, or an answer that does not decode
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def set_exception(self, exception: BaseException) -> None:
        self.future.set_exception(exception)


#: How long after a call the reader thread leaves the socket to the calling threads (calls
#: in a row read their own answers) unless an answer nobody waits for in a call is due.
LINGER_S = 0.05
#: The longest a thread waiting for another's read sleeps before looking again (a safety
#: net: the reader wakes it when it is done).
_NAP_S = 0.05
_POLL_SLICE_MS = 60_000


class _Link:
    """One TCP connection, the requests waiting for an answer on it, and who reads it.

    ``reading`` is held by the one thread that reads the socket: a caller waiting for its
    own answer (``await_answer``), or the reader thread (``read_in_background``) while no
    caller does. Each reads whole frames into ``frames`` and hands each to ``take_in``."""

    def __init__(self, sock: socket.socket, take_in: Callable[[_Link, bytes], None]) -> None:
        self.sock = sock
        self.send_lock = threading.Lock()
        self.replies: Replies[_Answer[Any]] = Replies()
        self.take_in = take_in
        self.frames = FrameBuffer()
        self.reading = threading.Lock()
        self.poller = select.poll()  # the socket, for the caller that reads
        self.poller.register(sock, select.POLLIN)
        #: Callers waiting while another thread reads, each with the event that wakes it: set
        #: when its answer arrives (by a done-callback), or when the reader stops and it is the
        #: first still waiting (it reads next).
        self.sleepers: list[tuple[Completion[Any], threading.Event]] = []
        self.sleepers_lock = threading.Lock()
        #: The reader thread's state, under ``idle``: whether it reads, how many callers read
        #: their own answers (or wait to), when the last of them ended, whether it waits.
        self.idle = threading.Condition()
        self.background = False
        self.lingering = False
        self.callers = 0
        self.last_call = time.monotonic()
        self.wake_r, self.wake_w = os.pipe()  # takes the reader thread out of its poll
        os.set_blocking(self.wake_w, False)

    # -- callers ---------------------------------------------------------------------------
    def calling(self) -> None:
        """A caller is about to send a request and read its answer."""
        with self.idle:
            self.callers += 1

    def called(self) -> None:
        """That caller has its answer (or gave up): the reader thread reads again at once if
        answers nobody waits for in a call are due, else ``LINGER_S`` after the last call."""
        with self.idle:
            self.callers -= 1
            self.last_call = time.monotonic()
            if self.lingering and not self.callers and self._due():
                self.idle.notify()

    def expecting(self) -> None:
        """An answer nobody waits for in a call is due: the reader thread reads it (``_linger``
        saw it due, or waits and is woken: both under ``idle``)."""
        with self.idle:
            if self.lingering:
                self.idle.notify()

    def deferring(self) -> None:
        """An answer left to a caller is on its way: the reader thread leaves it for
        ``LINGER_S`` from now."""
        with self.idle:
            self.last_call = time.monotonic()

    def _due(self) -> bool:
        """Whether an answer the reader thread should read now is awaited."""
        with self.replies.lock:
            return any(answer.due for answer in self.replies.pending.values())

    def await_answer(self, future: Completion[Any], deadline: float | None) -> None:
        """Until ``future`` is done, reading the socket whenever no other thread does;
        ``FutureTimeout`` at ``deadline`` (monotonic)."""
        woken: threading.Event | None = None
        while not future.done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise FutureTimeout
            if self.reading.acquire(blocking=False):
                try:
                    self._read_until(future, deadline)
                finally:
                    self.reading.release()
                    self._pass_on()
                continue
            self._evict()
            if woken is None:
                woken = threading.Event()
                future.add_done_callback(lambda _, event=woken: event.set())  # type: ignore[misc]
            sleeper = (future, woken)
            with self.sleepers_lock:
                self.sleepers.append(sleeper)
            try:
                if self.reading.locked():  # else the reader left before this one slept: read
                    woken.wait(_NAP_S if remaining is None else min(remaining, _NAP_S))
            finally:
                with self.sleepers_lock:
                    self.sleepers.remove(sleeper)
                if not future.done():
                    woken.clear()

    def _read_until(self, future: Completion[Any], deadline: float | None) -> None:
        poller = self.poller
        while not future.done() and self.replies.alive:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            # in slices of a minute at most: poll takes up to about 24 days
            if poller.poll(_POLL_SLICE_MS if remaining is None else min(_POLL_SLICE_MS, int(remaining * 1000) + 1)):
                self._receive()

    def _pass_on(self) -> None:
        """The reading thread stopped: the first caller still waiting for its answer reads next."""
        if self.sleepers:
            with self.sleepers_lock:
                for future, woken in self.sleepers:
                    if not future.done():
                        woken.set()
                        break

    def _evict(self) -> None:
        """Have the reader thread leave the socket to the callers."""
        with self.idle:
            if self.background:
                try:
                    os.write(self.wake_w, b"\0")
                except BlockingIOError:  # the pipe is full of wake-ups already
                    pass

    # -- the reader thread -----------------------------------------------------------------
    def read_in_background(self) -> None:
        """The reader thread: read whenever no caller does, until the link dies; then close
        the wake-up pipe (nobody writes it once ``background`` is off under ``idle``)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        try:
            while self._linger():
                if not self.reading.acquire(blocking=False):
                    continue
                try:
                    with self.idle:
                        self.background = True
                    while self.replies.alive:
                        ready = {fd for fd, _ in poller.poll()}
                        if self.wake_r in ready:
                            os.read(self.wake_r, 4096)
                            break
                        self._receive()
                finally:
                    with self.idle:
                        self.background = False
                    self.reading.release()
                    self._pass_on()
        finally:
            with self.idle:
                os.close(self.wake_r)
                os.close(self.wake_w)

    def _linger(self) -> bool:
        """Wait until the reader thread may read (no caller reads, and an answer nobody
        waits for is due or the last call was ``LINGER_S`` ago); False once the link died."""
        with self.idle:
            while self.replies.alive:
                quiet_s = time.monotonic() - self.last_call
                if not self.callers and (quiet_s >= LINGER_S or self._due()):
                    return True
                self.lingering = True
                try:
                    self.idle.wait(LINGER_S - quiet_s if not self.callers else LINGER_S)
                finally:
                    self.lingering = False
            return False

    # -- both --------------------------------------------------------------------------------
    def _receive(self) -> None:
        """One read from the socket (it is readable), its whole frames handed on; a closed
        or broken connection fails the link."""
        try:
            data = self.sock.recv(READ_CHUNK)
            if not data:
                self.fail("connection closed by the broker")
                return
            for payload in self.frames.feed(data):
                self.take_in(self, payload)
                if not self.replies.alive:  # refused, or failed by a sender
                    self.close()
                    return
        except (OSError, MalformedFrameError, ValueError) as exc:
            self.fail(f"connection lost: {exc}")

    def fail(self, reason: str, error: type[BrokerUnavailableError] = BrokerUnavailableError) -> None:
        """Mark the link dead and fail everything waiting on it with ``error``."""
        self.replies.fail(reason, error)
        self.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread, sends FIN now
        except OSError:
            pass
        self.sock.close()
        with self.idle:
            self.idle.notify_all()


class BrokerClient(SessionClient[CheckCallback, _Link]):
    """A remote broker at ``tcp://host:port``; implements ``BrokerAPI``."""

    def _start(self) -> None:
        self._connect_lock = threading.Lock()
        self._callbacks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="check-callback")

    # -- connection -----------------------------------------------------------------------
    def _connection(self) -> _Link:
        """The live link, opening (and authenticating, re-registering) a new one if needed."""
        if (link := self._current()) is not None:
            return link
        with self._connect_lock:
            if (link := self._current()) is not None:
                return link
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self._session.connect_timeout_s)
            except OSError as exc:
                raise BrokerUnavailableError(f"cannot connect to {self.url}: {exc}") from None
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(sock, self._take_in)
            threading.Thread(target=link.read_in_background, daemon=True,
                             name=f"broker-client-{self.port}").start()
            try:
                ask = self._session.challenge()
                challenge = self._exchange(link, ask) if ask else None
                for call in self._session.opening(challenge):
                    self._exchange(link, call)
            except BrokerError as exc:
                link.fail(f"handshake with {self.url} failed: {exc}")
                raise
            self._link = link
            return link

    def _take_in(self, link: _Link, payload: bytes) -> None:
        """One frame read on ``link``: an answer goes to its waiter, a check-back to a worker thread."""
        if (check := self._session.received(link.replies, payload)) is not None:
            try:
                self._callbacks.submit(self._run_callback, *check)
            except RuntimeError:  # the client is closing: its callbacks no longer run
                log.debug("check-back for %s dropped: the client is closed", check[1].transaction_id)

    @staticmethod
    def _run_callback(callback: CheckCallback, request: CheckRequest) -> None:
        try:
            callback(request)
        except Exception:
            log.exception("check callback failed for transaction %s", request.transaction_id)

    # -- requests -------------------------------------------------------------------------
    def _submit(self, link: _Link, call: Call[T], completion: Completion[T], due: bool = True) -> int:
        """Write ``call`` on ``link``, its answer to complete ``completion``; its request id."""
        request_id = self._session.new_id()
        frame = call.frame(request_id)  # a body that does not encode raises here, nothing left waiting
        link.replies.expect(request_id, _Answer(call, completion, due))
        try:
            with link.send_lock:
                link.sock.sendall(frame)
        except OSError as exc:
            link.fail(f"cannot send to {self.url}: {exc}")
        return request_id

    def _put_on_wire(self, call: Call[T], future: Future[T] | None = None, due: bool = True) -> Future[T]:
        """Write ``call`` without waiting: the reader thread reads its answer (``due``), or
        a caller does (see ``wait``). The ``Future`` of its result: ``future`` if given."""
        link = self._connection()
        if not due:
            link.deferring()
        future = Future() if future is None else future
        future.set_running_or_notify_cancel()  # on the wire: it cannot be cancelled, only not waited for
        self._submit(link, call, future, due)
        if due:
            link.expecting()
        return future

    def wait(self, future: Future[Any], timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` for ``future``, a ``start_*`` call's (or one completed by
        its done-callbacks), reading the socket in this thread while no other does: an
        answer started with ``due=False`` needs no other thread. Whether it is done."""
        link = self._link
        if future.done() or link is None or not link.replies.alive:
            try:
                future.exception(timeout_s)  # done, or failed with its dead link
            except FutureTimeout:
                return False
            return True
        link.calling()
        try:
            link.await_answer(future, None if timeout_s is None else time.monotonic() + timeout_s)
        except FutureTimeout:
            return False
        finally:
            link.called()
        return True

    def _exchange(self, link: _Link, call: Call[T]) -> T:
        """Send ``call`` on ``link`` and wait for its result, reading it in this thread
        unless another one reads."""
        wait_s = self._session.wait_s(call)
        link.calling()
        try:
            reply: _Reply[T] = _Reply()
            request_id = self._submit(link, call, reply)
            try:
                link.await_answer(reply, None if wait_s is None else time.monotonic() + wait_s)
            except FutureTimeout:
                link.replies.forget(request_id)
                raise self._session.timed_out(call) from None
            return reply.result()
        finally:
            link.called()

    def _do(self, call: Call[T]) -> T:
        return self._exchange(self._connection(), call)

    @property
    def timeout_s(self) -> float:
        """How long a request waits for its answer (``start_*`` requests: wait this long)."""
        return self._session.timeout_s

    def _request(self, code: RequestCode, body: Any) -> Any:
        """Send a request as it is (the tests send malformed ones); its ``ok`` value."""
        return self._do(raw_call(code, body))

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        if (call := self._session.register_producer(producer_group, on_check)) is not None:
            self._do(call)

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        if (call := self._session.unregister_producer(producer_group, on_check)) is not None:
            self._do(call)

    # -- BrokerAPI ---------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        return self._do(self._session.create_topic(topic, queues))

    def list_topics(self) -> list[TopicInfo]:
        return self._do(self._session.list_topics())

    def send(self, message: Message) -> SendResult:
        return self._do(self._session.send(message))

    def send_batch(self, messages: list[Message]) -> list[SendResult | BrokerError]:
        """Send many messages in one request (SEND_BATCH_MESSAGE); per message, in order, its
        result or the typed error that refused it (the others are still sent)."""
        return self._do(self._session.send_batch(messages))

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        return self._do(self._session.send_half(message, producer_group=producer_group, transaction_id=transaction_id))

    def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                        from_check: bool = False, oneway: bool = False) -> EndTransactionResult:
        return self._do(self._session.end_transaction(transaction_id, resolution, producer_group=producer_group,
                                                      from_check=from_check, oneway=oneway))

    def relay_committed(self, messages: list[Message], *, producer_group: str, transaction_id: str) -> list[SendResult]:
        return self._do(self._session.relay_committed(messages, producer_group=producer_group,
                                                      transaction_id=transaction_id))

    def start_relay_committed(self, messages: list[Message], *, producer_group: str,
                              transaction_id: str) -> Future[list[SendResult]]:
        """``relay_committed`` without waiting, as ``start_send_half``: a relay puts many
        transactions on the wire and the server stores them in one group commit."""
        call = self._session.relay_committed(messages, producer_group=producer_group, transaction_id=transaction_id)
        return self._put_on_wire(call)

    def start_send_half(self, message: Message, *, producer_group: str, transaction_id: str,
                        future: Future[SendResult] | None = None, due: bool = True) -> Future[SendResult]:
        """``send_half`` without waiting: the request is on the wire when this returns, and
        the ``Future`` completes with the answer (or the typed error; a dropped connection:
        ``BrokerUnavailableError``). The ``Future`` has no deadline of its own: wait for it
        up to ``timeout_s``. No connection: ``BrokerUnavailableError`` now. ``future``: the
        (new, pending) ``Future`` to complete, of the caller's own kind, so the answer needs
        no second ``Future`` chained to this one. ``due=False``: the caller reads the answer
        when it waits for it with ``wait`` (the reader thread does not wake for it)."""
        call = self._session.send_half(message, producer_group=producer_group, transaction_id=transaction_id)
        return self._put_on_wire(call, future, due)

    def start_end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                              from_check: bool = False, oneway: bool = False,
                              future: Future[EndTransactionResult] | None = None,
                              due: bool = True) -> Future[EndTransactionResult]:
        """``end_transaction`` without waiting, as ``start_send_half`` (RocketMQ's
        ``endTransactionOneway`` with ``oneway``: the broker then needs no fsync of its own
        for it, and answers once its next fsync covers it)."""
        call = self._session.end_transaction(transaction_id, resolution, producer_group=producer_group,
                                             from_check=from_check, oneway=oneway)
        return self._put_on_wire(call, future, due)

    def recall(self, topic: str, recall_handle: str) -> str:
        return self._do(self._session.recall(topic, recall_handle))

    def transaction_state(self, transaction_id: str) -> TransactionState:
        return self._do(self._session.transaction_state(transaction_id))

    def receive(self, group: str, topic: str, *, max_messages: int = 32, invisible_duration_s: float = 30.0, wait_s: float = 0.0, max_bytes: int | None = None, filter_expression: str = "*", filter_type: str = "TAG") -> list[ReceivedMessage]:
        return self._do(self._session.receive(group, topic, max_messages=max_messages, invisible_duration_s=invisible_duration_s, wait_s=wait_s, max_bytes=max_bytes, filter_expression=filter_expression, filter_type=filter_type))

    def ack(self, group: str, receipt_handle: str) -> None:
        return self._do(self._session.ack(group, receipt_handle))

    def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        """Ack many receipts in one request (ACK_MESSAGE_BATCH); per receipt, in order,
        None or the typed error that refused it."""
        return self._do(self._session.ack_many(group, receipt_handles))

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float, *,
                                  keep_receipt: bool = False) -> str:
        return self._do(self._session.change_invisible_duration(group, receipt_handle, invisible_duration_s,
                                                                keep_receipt))

    def dead_letter(self, group: str, receipt_handle: str) -> None:
        self._do(self._session.dead_letter(group, receipt_handle))

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, max_bytes: int | None = None) -> list[StoredMessage]:
        return self._do(self._session.read(topic, queue_id, offset, max_messages, max_bytes))

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._do(self._session.offset_for_timestamp(topic, queue_id, timestamp_ms))

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        return self._do(self._session.query_by_id(message_id))

    def query_by_key(self, topic: str, key: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return self._do(self._session.query_by_key(topic, key, max_messages, max_bytes))

    def list_parked(self) -> list[ParkedTransaction]:
        return self._do(self._session.list_parked())

    def open_transactions(self, producer_group: str | None = None) -> list[str]:
        return self._do(self._session.open_transactions(producer_group))

    def resolve_parked(self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0) -> EndTransactionResult:
        return self._do(self._session.resolve_parked(transaction_id, force=force, wait_s=wait_s))

    def recheck_parked(self, transaction_id: str) -> None:
        return self._do(self._session.recheck_parked(transaction_id))

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        return self._do(self._session.list_dlq(group, max_messages, max_bytes))

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        return self._do(self._session.resend_dlq(group, message_id))

    def delete_group(self, group: str) -> DeletedGroup:
        return self._do(self._session.delete_group(group))

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> GroupReset:
        return self._do(self._session.reset_group(group, topic, timestamp_ms))

    def stats(self) -> BrokerStats:
        return self._do(self._session.stats())

    def export(self, out_dir: str, fmt: str = "parquet") -> dict[str, int]:
        """Have the server export its messages to ``out_dir`` on the server's machine."""
        return self._do(self._session.export(out_dir, fmt))

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
