"""``rocketmq5://host:port``: the ``BrokerAPI`` on a RocketMQ 5 proxy, through the official
Python client (``rocketmq-python-client``, the ``rocketmq5`` extra).

What differs from the native protocol, and how it is bridged:

* The client ends one message per transaction. An outbox transaction with several half
  messages becomes several broker transactions that carry the outbox's transaction id in
  the ``TRANSACTION_PROPERTY`` property; ``end_transaction(outbox id)`` commits or rolls
  back each of them, and a check-back of any of them asks about the outbox id.
* Check-backs arrive in the client's ``TransactionChecker.check``: it hands a
  ``CheckRequest`` to the callback given to ``register_producer`` for the producer group
  named in ``GROUP_PROPERTY``; that callback's ``end_transaction(..., from_check=True)``
  (in the same thread) is the checker's answer. No answer, or UNKNOWN, sends nothing and
  the proxy checks again.
* Only the process that sent a transaction's half messages can end it outside a
  check-back (the client needs each message's id and endpoints).
* ``relay_committed`` is a half message per message and COMMIT: at least once, as a
  RocketMQ cluster cannot recognise messages it already holds.
* The client ends a transaction once; this process remembers the last ``ENDED_KEPT`` it
  ended, so that a repeated END is a no-op and a contradicting one raises
  ``TransactionConflictError``, as on the native transports.
* Admin features the proxy's ``MessagingService`` does not offer raise ``UnsupportedError``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlparse

from ..api import (
    BrokerStats,
    CheckCallback,
    DeletedGroup,
    GroupReset,
    ParkedTransaction,
    TopicInfo,
    ack_each,
    validate_receive,
)
from ..checkers import ProducerCallbackChecker
from ..errors import (
    BrokerClosedError,
    BrokerError,
    BrokerUnavailableError,
    InvalidMessageError,
    MessageTooLargeError,
    TransactionConflictError,
    UnknownReceiptError,
    UnknownTransactionError,
    UnsupportedError,
)
from ..filters import EVERY, SQL92, TAG, parse_filter
from ..message import (
    DELAY_LEVELS_S,
    CheckRequest,
    EndTransactionResult,
    Message,
    MessageLimits,
    ReceivedMessage,
    Resolution,
    SendResult,
    StoredMessage,
    TransactionState,
    validate_message,
    validate_relayed,
    validate_transaction_id,
)
from ..topics import validate_group

#: The property carrying the outbox transaction id on each of its broker transactions.
TRANSACTION_PROPERTY = "HALFMOON_TRANSACTION_ID"
#: The property carrying the outbox producer group (the proxy routes checks by topic).
GROUP_PROPERTY = "HALFMOON_PRODUCER_GROUP"

#: The largest body the official client sends (its own check, before the proxy's).
CLIENT_MAX_BODY_SIZE = 4 * 1024 * 1024
#: How many ended transactions this process remembers (a repeated END is then a no-op).
ENDED_KEPT = 10_000

#: A queue id or offset the client does not report.
UNKNOWN_POSITION = -1

_ENDED = {Resolution.COMMIT: TransactionState.COMMITTED, Resolution.ROLLBACK: TransactionState.ROLLED_BACK}


def _client_module() -> Any:
    try:
        import rocketmq
    except ImportError as exc:
        raise ImportError("rocketmq5:// broker URLs need the official RocketMQ 5 Python client: "
                          "pip install 'halfmoon[rocketmq5]'") from exc
    return rocketmq


@dataclass
class _Answer:
    """The answer slot of one check-back running in this thread."""

    transaction_id: str
    resolution: Resolution | None = None


@dataclass(frozen=True)
class _Received:
    """A received message of the client, kept for its ack until its invisibility ends."""

    consumer: Any
    message: Any
    expires_at: float


class RocketMQ5Broker:
    """A ``BrokerAPI`` on a RocketMQ 5 proxy (``rocketmq5://host:port``).

    ``topics`` (or the URL's ``?topics=a,b``) are the topics this process publishes,
    announced at start so that check-backs of a crashed producer's transactions reach this
    process before it sends anything itself. ``access_key``/``secret_key`` sign requests;
    ``timeout_s`` (whole seconds) bounds each request.
    """

    def __init__(self, url: str, *, topics: tuple[str, ...] = (), access_key: str = "", secret_key: str = "",
                 namespace: str = "", timeout_s: int = 3) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "rocketmq5" or not parsed.netloc:
            raise ValueError(f"not a rocketmq5://host:port URL: {url!r}")
        self._rocketmq = _client_module()
        listed = [t for value in parse_qs(parsed.query).get("topics", []) for t in value.split(",") if t]
        self._topics = tuple(dict.fromkeys((*listed, *topics)))
        self._config = self._rocketmq.ClientConfiguration(
            parsed.netloc, self._rocketmq.Credentials(access_key, secret_key), namespace, timeout_s)
        self._lock = threading.Lock()
        self._closed = False
        self._producer: Any = None
        self._consumers: dict[tuple[str, str], Any] = {}
        self._subscribed: dict[tuple[str, str], tuple[str, str]] = {}  # each consumer's filter and its type
        self._open: dict[str, list[tuple[Any, str]]] = {}  # outbox id -> (client transaction, message id)
        self._ended: OrderedDict[str, EndTransactionResult] = OrderedDict()
        self._received: dict[str, _Received] = {}
        self._checkers = ProducerCallbackChecker()
        self._answer = threading.local()

    # -- clients --------------------------------------------------------------------------
    def _started(self, client: Any) -> Any:
        try:
            client.startup()
        except Exception as exc:
            raise BrokerUnavailableError(f"cannot start the RocketMQ 5 client: {exc}") from exc
        return client

    def _client_producer(self) -> Any:
        with self._lock:
            if self._closed:
                raise BrokerClosedError("the rocketmq5 broker connection is closed")
            if self._producer is None:
                checker = _checker(self)
                self._producer = self._started(self._rocketmq.Producer(self._config, self._topics or None, checker))
            return self._producer

    def _consumer(self, group: str, topic: str, filter_expression: str, filter_type: str) -> Any:
        """The ``SimpleConsumer`` of ``group`` on ``topic``, subscribed with ``filter_expression``
        of ``filter_type`` (``InvalidMessageError`` when malformed)."""
        parse_filter(filter_expression, filter_type)
        from rocketmq.grpc_protocol import FilterType

        with self._lock:
            if self._closed:
                raise BrokerClosedError("the rocketmq5 broker connection is closed")
            key = (group, topic)
            subscription = (filter_expression, filter_type)
            expression = self._rocketmq.FilterExpression(
                filter_expression, FilterType.SQL if filter_type == SQL92 else FilterType.TAG)
            if key not in self._consumers:
                validate_group(group)
                self._consumers[key] = self._started(
                    self._rocketmq.SimpleConsumer(self._config, group, {topic: expression}))
            elif self._subscribed[key] != subscription:
                self._consumers[key].subscribe(topic, expression)
            self._subscribed[key] = subscription
            return self._consumers[key]

    @contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        """Turn the client's exceptions into the broker's typed errors."""
        from rocketmq.v5.exception import client_exception as errors

        try:
            yield
        except BrokerError:
            raise
        except errors.PayloadTooLargeException as exc:
            raise MessageTooLargeError(f"{what}: {exc}") from exc
        except (errors.IllegalArgumentException, errors.BadRequestException) as exc:
            raise InvalidMessageError(f"{what}: {exc}") from exc
        except Exception as exc:
            raise BrokerUnavailableError(f"{what}: {exc}") from exc

    # -- producing ------------------------------------------------------------------------
    def _client_message(self, message: Message, properties: dict[str, str]) -> Any:
        validate_message(message, MessageLimits(max_body_size=CLIENT_MAX_BODY_SIZE))
        sent = self._rocketmq.Message()
        sent.topic = message.topic
        sent.body = bytes(message.body)
        if message.tag:
            sent.tag = message.tag
        for key in message.keys:
            sent.keys = key
        for name, value in {**message.properties, **properties}.items():
            sent.add_property(name, value)
        if message.message_group:
            sent.message_group = message.message_group
        deliver_at_ms = message.deliver_at_ms
        if message.delay_level:
            deliver_at_ms = int(time.time() * 1000) + DELAY_LEVELS_S[message.delay_level - 1] * 1000
        if deliver_at_ms is not None:
            sent.delivery_timestamp = deliver_at_ms  # milliseconds, as the 5.1.x client sends them
        return sent

    @staticmethod
    def _result(receipt: Any, topic: str, transaction_id: str | None = None) -> SendResult:
        """The client's receipt; it does not say the queue or the commit log offset (-1)."""
        return SendResult(message_id=receipt.message_id, topic=topic, queue_id=UNKNOWN_POSITION,
                          queue_offset=receipt.offset if receipt.offset is not None else UNKNOWN_POSITION,
                          commit_log_offset=UNKNOWN_POSITION, transaction_id=transaction_id,
                          recall_handle=receipt.recall_handle or None)

    def send(self, message: Message) -> SendResult:
        """Send a normal, FIFO (``message_group``) or delayed message."""
        sent = self._client_message(message, {})
        with self._calling(f"send to {message.topic}"):
            return self._result(self._client_producer().send(sent), message.topic)

    def recall(self, topic: str, recall_handle: str) -> str:
        """Take a delayed message back before it is due (the proxy's RecallMessage)."""
        with self._calling(f"recall from {topic}"):
            return str(self._client_producer().recall_message(topic, recall_handle))

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        """One broker transaction carrying ``transaction_id`` and ``producer_group`` in its
        properties; ``end_transaction(transaction_id)`` ends it with its siblings."""
        validate_transaction_id(transaction_id)
        sent = self._client_message(message, {TRANSACTION_PROPERTY: transaction_id, GROUP_PROPERTY: producer_group})
        with self._calling(f"half message to {message.topic}"):
            producer = self._client_producer()
            transaction = producer.begin_transaction()
            receipt = producer.send(sent, transaction)
        with self._lock:
            self._open.setdefault(transaction_id, []).append((transaction, receipt.message_id))
        return self._result(receipt, message.topic, transaction_id)

    def end_transaction(self, transaction_id: str, resolution: Resolution, *, producer_group: str,
                        from_check: bool = False, oneway: bool = False) -> EndTransactionResult:
        """COMMIT or ROLLBACK each broker transaction of ``transaction_id``; inside a check-back
        of ``transaction_id`` (``from_check=True``), the checker's answer. ``oneway`` changes
        nothing here: the RocketMQ client's END is its own.

        A repeat of the resolution this process recorded is a no-op, the opposite one raises
        ``TransactionConflictError``; ``UnknownTransactionError`` when this process did not
        send the transaction (or has forgotten ending it)."""
        answer: _Answer | None = getattr(self._answer, "slot", None)
        if from_check and answer is not None and answer.transaction_id == transaction_id:
            answer.resolution = resolution
            return EndTransactionResult(transaction_id, _ENDED.get(resolution, TransactionState.PENDING),
                                        resolution is not Resolution.UNKNOWN, ())
        if resolution is Resolution.UNKNOWN:
            return EndTransactionResult(transaction_id, TransactionState.PENDING, False, ())
        with self._lock:
            transactions = self._open.pop(transaction_id, None)
            ended = self._ended.get(transaction_id)
        if transactions is None and ended is not None:
            if ended.state is not _ENDED[resolution]:
                raise TransactionConflictError(f"transaction {transaction_id} already ended ({ended.state.value})")
            return EndTransactionResult(transaction_id, ended.state, False, ended.message_ids)
        if transactions is None:
            raise UnknownTransactionError(
                f"transaction {transaction_id} was not sent by this process (or is already ended): on RocketMQ 5 "
                "only its sender or a check-back can end it")
        for done, (transaction, _) in enumerate(transactions):
            try:
                with self._calling(f"END_TRANSACTION {resolution.value} of {transaction_id}"):
                    if resolution is Resolution.COMMIT:
                        transaction.commit()
                    else:
                        transaction.rollback()
            except BrokerError:
                with self._lock:  # the rest stay for a retry; the check-backs settle them otherwise
                    self._open[transaction_id] = transactions[done:] + self._open.get(transaction_id, [])
                raise
        result = EndTransactionResult(transaction_id, _ENDED[resolution], True, tuple(m for _, m in transactions))
        with self._lock:
            self._ended[transaction_id] = result
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        return result

    def relay_committed(self, messages: list[Message], *, producer_group: str,
                        transaction_id: str) -> list[SendResult]:
        """A half message per message, then COMMIT: **at least once**. A RocketMQ cluster
        does not recognise a transaction or message id it already holds, so a relay repeated
        after a lost answer (or of a transaction whose own half messages reached the
        cluster) delivers those messages again; consumers must be idempotent (the outbox's
        idempotent consumer is). Bad input raises before anything is sent."""
        validate_relayed(messages, transaction_id, MessageLimits(max_body_size=CLIENT_MAX_BODY_SIZE))
        validate_group(producer_group)
        results = [self.send_half(message, producer_group=producer_group, transaction_id=transaction_id)
                   for message in messages]
        self.end_transaction(transaction_id, Resolution.COMMIT, producer_group=producer_group)
        return results

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        """Answer check-backs of ``producer_group``'s transactions with ``on_check`` (the
        client starts, announcing its topics, so the proxy can route checks here)."""
        self._checkers.register(producer_group, on_check)
        self._client_producer()

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        """Withdraw a callback given to ``register_producer``."""
        self._checkers.unregister(producer_group, on_check)

    def check(self, message: Any) -> Resolution:
        """Run one check-back of the client (a half message) through the registered callback
        of its producer group; the callback's answer (UNKNOWN when it gave none)."""
        properties = dict(message.properties)
        transaction_id = properties.get(TRANSACTION_PROPERTY)
        group = properties.get(GROUP_PROPERTY, "")
        if transaction_id is None:
            return Resolution.UNKNOWN
        request = CheckRequest(group, transaction_id, self._message(message), check_times=0)
        self._answer.slot = _Answer(transaction_id)
        try:  # a callback answers through end_transaction(from_check=True), in this thread
            answered = self._checkers.request_check(request)
            resolution = (self._answer.slot.resolution if answered else None) or Resolution.UNKNOWN
        finally:
            self._answer.slot = None
        if resolution is not Resolution.UNKNOWN:
            self._settled(transaction_id, message.message_id)
        return resolution

    def _settled(self, transaction_id: str, message_id: str) -> None:
        """Forget a broker transaction a check-back ends (its sender's END never came)."""
        with self._lock:
            left = [held for held in self._open.get(transaction_id, []) if held[1] != message_id]
            if left:
                self._open[transaction_id] = left
            else:
                self._open.pop(transaction_id, None)

    # -- consuming ------------------------------------------------------------------------
    @staticmethod
    def _message(received: Any) -> Message:
        return Message(topic=received.topic, body=received.body, keys=tuple(sorted(received.keys)),
                       tag=received.tag or "", properties=dict(received.properties),
                       message_id=received.message_id, message_group=received.message_group)

    def receive(self, group: str, topic: str, *, max_messages: int = 32, invisible_duration_s: float = 30.0,
                wait_s: float = 0.0, max_bytes: int | None = None,
                filter_expression: str = EVERY, filter_type: str = TAG) -> list[ReceivedMessage]:
        """Receive through a ``SimpleConsumer`` of ``group`` subscribed to ``topic`` with
        ``filter_expression`` of ``filter_type`` (``max_bytes`` is not known to the proxy: ignored)."""
        validate_receive(max_messages, invisible_duration_s, wait_s)
        consumer = self._consumer(group, topic, filter_expression, filter_type)
        with self._calling(f"receive {topic} for {group}"):
            consumer.await_duration = max(1, round(wait_s))
            messages = consumer.receive(max_messages, max(1, round(invisible_duration_s)))
        now = time.monotonic()
        with self._lock:  # receipts past their invisibility are void at the proxy too
            for handle in [h for h, kept in self._received.items() if kept.expires_at < now]:
                del self._received[handle]
        received = []
        for message in messages:
            born = message.born_timestamp or 0
            received.append(ReceivedMessage(
                message=self._message(message), receipt_handle=message.receipt_handle,
                delivery_attempt=message.delivery_attempt or 1, queue_id=UNKNOWN_POSITION,
                queue_offset=UNKNOWN_POSITION,
                born_timestamp_ms=born, store_timestamp_ms=born,
                transaction_id=message.properties.get(TRANSACTION_PROPERTY)))
            with self._lock:
                self._received[message.receipt_handle] = _Received(consumer, message, now + invisible_duration_s)
        return received

    def _receipt(self, receipt_handle: str) -> _Received:
        with self._lock:
            found = self._received.pop(receipt_handle, None)
        if found is None:
            raise UnknownReceiptError(f"receipt {receipt_handle!r} was not received here, or is already used")
        return found

    def ack(self, group: str, receipt_handle: str) -> None:
        """Acknowledge a message this connection received."""
        found = self._receipt(receipt_handle)
        with self._calling(f"ack for {group}"):
            found.consumer.ack(found.message)

    def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        """Acknowledge many messages this connection received, one ack each (the official
        client acks one message per call)."""
        return ack_each(self, group, receipt_handles)

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float, *,
                                  keep_receipt: bool = False) -> str:
        """Change a received message's invisibility; the new receipt handle (with
        ``keep_receipt``, ``receipt_handle``: this connection maps it to the proxy's new one,
        as the proxy does for a push consumer)."""
        found = self._receipt(receipt_handle)
        with self._calling(f"change invisible duration for {group}"):
            found.consumer.change_invisible_duration(found.message, max(1, round(invisible_duration_s)))
        handle = receipt_handle if keep_receipt else str(found.message.receipt_handle)
        with self._lock:
            self._received[handle] = _Received(found.consumer, found.message, time.monotonic() + invisible_duration_s)
        return handle

    # -- what the proxy does not offer ----------------------------------------------------
    @staticmethod
    def _unsupported(what: str) -> NoReturn:
        raise UnsupportedError(f"{what} is not available on a RocketMQ 5 proxy (rocketmq5://): use the "
                               "cluster's own admin tools (mqadmin, the dashboard)")

    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        self._unsupported("creating topics")

    def list_topics(self) -> list[TopicInfo]:
        self._unsupported("listing topics")

    def dead_letter(self, group: str, receipt_handle: str) -> None:
        self._unsupported("forwarding a message to the DLQ")

    def transaction_state(self, transaction_id: str) -> TransactionState:
        self._unsupported("reading a transaction's state")

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             max_bytes: int | None = None) -> list[StoredMessage]:
        self._unsupported("reading a queue by offset")

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self._unsupported("offset lookup by time")

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        self._unsupported("querying messages by id")

    def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                     max_bytes: int | None = None) -> list[StoredMessage]:
        self._unsupported("querying messages by key")

    def list_parked(self) -> list[ParkedTransaction]:
        self._unsupported("listing parked transactions")

    def open_transactions(self, producer_group: str | None = None) -> list[str]:
        self._unsupported("listing open transactions")

    def resolve_parked(self, transaction_id: str, *, force: Resolution | None = None,
                       wait_s: float = 10.0) -> EndTransactionResult:
        self._unsupported("resolving parked transactions")

    def recheck_parked(self, transaction_id: str) -> None:
        self._unsupported("re-checking parked transactions")

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        self._unsupported("reading a dead-letter queue")

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        self._unsupported("resending dead letters")

    def delete_group(self, group: str) -> DeletedGroup:
        self._unsupported("deleting consumer groups")

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> GroupReset:
        self._unsupported("resetting consumer groups")

    def stats(self) -> BrokerStats:
        self._unsupported("broker statistics")

    def close(self) -> None:
        """Shut the client's producer and consumers down."""
        with self._lock:
            self._closed = True
            clients = [self._producer, *self._consumers.values()] if self._producer else [*self._consumers.values()]
            self._producer, self._consumers, self._subscribed = None, {}, {}
        for client in clients:
            client.shutdown()


def _checker(broker: RocketMQ5Broker) -> Any:
    """The client's ``TransactionChecker`` asking ``broker.check``; UNKNOWN raises, so the
    client sends nothing and the proxy checks again."""
    rocketmq = _client_module()

    class Checker(rocketmq.TransactionChecker):  # type: ignore[misc, name-defined]
        def check(self, message: Any) -> Any:
            resolution = broker.check(message)
            if resolution is Resolution.COMMIT:
                return rocketmq.TransactionResolution.COMMIT
            if resolution is Resolution.ROLLBACK:
                return rocketmq.TransactionResolution.ROLLBACK
            raise UnknownTransactionError(f"no answer for the check-back of message {message.message_id}")

    return Checker()
