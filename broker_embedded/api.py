"""The broker's API: one interface, served in-process and over TCP.

``EmbeddedBroker(data_dir)`` implements it in-process; ``BrokerClient("tcp://host:port")``
implements it remotely; ``broker_embedded.connect(url)`` returns either. Code written
against :class:`BrokerAPI` runs unchanged on both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .errors import BrokerError, InvalidMessageError
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

#: Called by the broker for each check-back routed to a connected producer of the group.
CheckCallback = Callable[[CheckRequest], None]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic, its queue count, and the number of messages per queue."""

    name: str
    queues: int
    depth: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ParkedTransaction:
    """A transaction parked in ``TRANS_CHECK_MAX_TIME_TOPIC`` after ``check_max`` checks."""

    transaction_id: str
    producer_group: str
    message_ids: tuple[str, ...]
    check_times: int
    born_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A pending or parked transaction as the console shows it; ``problem`` says why it
    cannot be committed (empty for a sound one)."""

    transaction_id: str
    producer_group: str
    state: TransactionState
    message_ids: tuple[str, ...]
    check_times: int
    born_timestamp_ms: int
    problem: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerQueue:
    """One consumer group's progress through one stored queue of a subscribed topic (the
    topic's own queues, and the group's retry queue): messages not yet done, and how many
    of them are received and invisible right now."""

    group: str
    topic: str
    stored_topic: str
    queue_id: int
    lag: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class DeletedGroup:
    """What deleting a consumer group forgot: the stored queues it had progress in, and the
    dead letters of its DLQ no longer listed or counted."""

    group: str
    queues: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class GroupReset:
    """A consumer group moved on a topic: in how many of the topic's queues, and how many
    messages it is to receive there from its new positions (what it skipped is done)."""

    group: str
    topic: str
    queues: int
    lag: int


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """A snapshot for the admin CLI: depths, backlogs, and the transaction counters.

    ``unanswered_check_groups``: each producer group whose checks have gone unanswered for
    over two check intervals (no checker of the group answered), and for how many seconds."""

    topics: tuple[TopicInfo, ...]
    pending_half: int
    parked: int
    outstanding_checks: int
    consumer_lag: dict[str, dict[str, int]] = field(default_factory=dict)
    dlq_depth: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    unanswered_check_groups: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class TransactionChecker(Protocol):
    """Where the broker's check service sends check-backs.

    ``request_check`` must not block: it hands the request on (to a connected producer,
    or as a Celery task) and returns True, or returns False when nobody can take it now,
    in which case the broker tries again at the next check interval; either way the check
    counts toward ``check_max``, so a transaction nobody answers parks.
    The answer comes back through ``BrokerAPI.end_transaction(..., from_check=True)``.
    """

    def request_check(self, request: CheckRequest) -> bool: ...


#: What forcing a parked transaction's resolution risks (``resolve_parked(..., force=...)``),
#: shown before an operator's forced resolution acts.
FORCE_WARNINGS = {
    Resolution.COMMIT: "forcing COMMIT of transaction {id} without a check-back: its transaction_log is not "
                       "read. If its database transaction rolled back, consumers receive a phantom message.",
    Resolution.ROLLBACK: "forcing ROLLBACK of transaction {id} without a check-back: its transaction_log is "
                         "not read. If its database transaction committed, its messages are never delivered.",
}


#: The longest a receive may wait, or a received message stay invisible: one day.
MAX_DURATION_S = 86_400.0


def duration_ms(name: str, seconds: float, zero_allowed: bool = False) -> int:
    """``seconds`` in whole milliseconds, at least 1 unless it is 0 (a positive duration
    under a millisecond is not "at once"); ``InvalidMessageError`` unless it is a finite
    number in (0, ``MAX_DURATION_S``] (``[0, ...]`` when ``zero_allowed``)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
            or not (0 <= seconds if zero_allowed else 0 < seconds) or seconds > MAX_DURATION_S:
        low = "[0" if zero_allowed else "(0"
        raise InvalidMessageError(f"{name} must be a number of seconds in {low}, {MAX_DURATION_S:g}], not {seconds!r}")
    return max(int(seconds * 1000), 1) if seconds else 0


def validate_receive(max_messages: int, invisible_duration_s: float, wait_s: float) -> int:
    """Check ``BrokerAPI.receive``'s numbers (``InvalidMessageError``, on every transport);
    the invisible duration in milliseconds."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise InvalidMessageError(f"max_messages must be a whole number >= 1, not {max_messages!r}")
    duration_ms("wait_s", wait_s, zero_allowed=True)
    return duration_ms("invisible_duration_s", invisible_duration_s)


#: The largest frame of the TCP protocol (``broker_embedded.wire``): one call's request or
#: reply; ``ServerLimits`` must leave room for one.
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: The broker's TCP port when none is given (RocketMQ's name server port).
DEFAULT_PORT = 9876


class BrokerAPI(Protocol):
    """What a producer, a consumer, a checker and an admin can ask of a broker."""

    # -- topics ---------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int = 4) -> TopicInfo:
        """Create a topic (idempotent: an existing topic is returned as it is)."""
        ...

    def list_topics(self) -> list[TopicInfo]:
        """All user topics."""
        ...

    # -- producing ------------------------------------------------------------------------
    def send(self, message: Message) -> SendResult:
        """Store a normal (or delayed) message; returns once it is durable per flush mode."""
        ...

    def send_half(self, message: Message, *, producer_group: str, transaction_id: str) -> SendResult:
        """Store a half message, invisible until its transaction commits.

        Several half messages may share one ``transaction_id``; they end together.
        """
        ...

    def end_transaction(
        self,
        transaction_id: str,
        resolution: Resolution,
        *,
        producer_group: str,
        from_check: bool = False,
        oneway: bool = False,
    ) -> EndTransactionResult:
        """COMMIT or ROLLBACK every half message of the transaction.

        A repeat of the recorded resolution is a no-op (``applied=False``); the opposite
        resolution raises ``TransactionConflictError``; an unknown id raises
        ``UnknownTransactionError``. ``Resolution.UNKNOWN`` records nothing and leaves
        the transaction to the check service.

        ``oneway``: the caller does not wait for the END (RocketMQ's
        ``endTransactionOneway``), so it needs no write or fsync of its own: it is held and
        written with the broker's next write, made durable (its messages visible) by that
        write's fsync, within about a millisecond behind a server; the answer comes then. A crash before that loses the
        END, and check-back settles the transaction.
        """
        ...

    def relay_committed(self, messages: list[Message], *, producer_group: str,
                        transaction_id: str) -> list[SendResult]:
        """Store the messages of a local transaction that committed in the producer's
        database, handed over without half message or END (the outbox's relay, after the
        broker was down): one append, one fsync, a ``SendResult`` per message, in order.

        Exactly once by transaction and message id, across restarts for as long as retention
        keeps the transaction's op records: a transaction unknown here is recorded COMMITTED
        with the messages; a pending one (its half messages arrived) is committed, its half
        messages with the relayed messages it lacks; one committed already (by END, a
        check-back or an earlier relay) gets only the messages it does not hold. A message it
        holds is answered with the ``SendResult`` of its stored copy, never stored again.
        Raises ``TransactionConflictError`` for a rolled-back transaction, another producer
        group's, or one being ended or relayed right now (a retry then succeeds);
        ``InvalidMessageError`` (and the other errors of ``send``) for bad input, storing
        nothing. Delays count from the relay; a message group keeps the order given.
        """
        ...

    def recall(self, topic: str, recall_handle: str) -> str:
        """Take back a delayed message before it is due, by the ``recall_handle`` of its
        ``SendResult`` (RocketMQ 5.3's RecallMessage): it is never delivered, across restarts.
        Returns its message id (again for one recalled already). ``InvalidMessageError``
        for a handle this broker did not issue for ``topic``, or a message delivered already."""
        ...

    def transaction_state(self, transaction_id: str) -> TransactionState:
        """The broker's record of a transaction (raises ``UnknownTransactionError``)."""
        ...

    def register_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        """Offer this connection to answer check-backs of ``producer_group``."""
        ...

    def unregister_producer(self, producer_group: str, on_check: CheckCallback) -> None:
        """Withdraw a callback given to ``register_producer``."""
        ...

    # -- consuming ------------------------------------------------------------------------
    def receive(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        invisible_duration_s: float = 30.0,
        wait_s: float = 0.0,
        max_bytes: int | None = None,
        filter_expression: str = "*",
        filter_type: str = "TAG",
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages`` for a consumer group, long-polling up to ``wait_s``.

        ``filter_expression`` is the group's subscription to ``topic``, of RocketMQ's
        ``filter_type``: ``"TAG"``: ``"*"`` (every message), ``"TagA"`` or ``"TagA || TagB"``;
        ``"SQL92"``: a condition over the message's properties, e.g. ``"amount > 5 AND
        region IN ('eu', 'us')"`` (the subset in docs/broker.md). The messages it passes
        over are consumed for the group (never delivered to it), and a changed expression
        applies from the group's progress on. A malformed one raises
        ``InvalidMessageError`` and changes nothing.

        Received messages are invisible to the group for ``invisible_duration_s``; a message
        not acked by then comes back with ``delivery_attempt + 1`` after a growing back-off,
        and after ``max_delivery_attempts`` it moves to ``%DLQ%<group>``. ``max_bytes``
        bounds the stored size of the messages returned (the first always comes); a
        message left out stays as it was: visible, its delivery not counted.
        """
        ...

    def ack(self, group: str, receipt_handle: str) -> None:
        """Acknowledge a received message (``UnknownReceiptError`` if unknown or expired)."""
        ...

    def ack_many(self, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
        """Acknowledge many received messages in one call (as RocketMQ 5's batch AckMessage
        and Redis's XACK): per receipt, in order, None when it was acked or the typed error
        that refused it (``UnknownReceiptError``); one bad receipt does not stop the others.
        This default acks each in turn (``ack_each``); the broker and its clients do it in
        one request, one lock and one write."""
        return ack_each(self, group, receipt_handles)

    def change_invisible_duration(self, group: str, receipt_handle: str, invisible_duration_s: float, *,
                                  keep_receipt: bool = False) -> str:
        """Extend or shorten a receipt's invisibility; returns the new receipt handle (the
        old one is refused from then on, as RocketMQ's). With ``keep_receipt`` the handle
        stays the same and is returned: a front renewing a message for its consumer (RocketMQ
        5's ``auto_renew``) so that the consumer's handle stays good whatever the front
        forgets (the broker restarted)."""
        ...

    def dead_letter(self, group: str, receipt_handle: str) -> None:
        """Move a received message to ``%DLQ%<group>`` now, as ``max_delivery_attempts``
        would (RocketMQ 5's ForwardMessageToDeadLetterQueue): never delivered to the group
        again. Repeating it for a message in the group's DLQ does nothing more; any other
        receipt not in flight raises ``UnknownReceiptError``."""
        ...

    # -- reading, admin -------------------------------------------------------------------
    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             max_bytes: int | None = None) -> list[StoredMessage]:
        """Read a queue from ``offset`` (replay); does not affect consumer groups.
        ``max_bytes`` bounds the stored size of the messages returned (the first always comes)."""
        ...

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= ``timestamp_ms``."""
        ...

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        """Find a message by its id (the newest copy in a user topic)."""
        ...

    def query_by_key(self, topic: str, key: str, max_messages: int = 64,
                     max_bytes: int | None = None) -> list[StoredMessage]:
        """The newest messages of a topic with one of their keys, oldest first; as many as
        ``max_bytes`` of stored size allows (the newest always comes)."""
        ...

    def list_parked(self) -> list[ParkedTransaction]:
        """Transactions parked after ``check_max`` unanswered checks."""
        ...

    def open_transactions(self, producer_group: str | None = None) -> list[str]:
        """The ids of the open (pending and parked) transactions, of ``producer_group`` only
        if given: those a checker may still be asked about (admin; retention keeps their
        transaction_log rows)."""
        ...

    def resolve_parked(
        self, transaction_id: str, *, force: Resolution | None = None, wait_s: float = 10.0,
    ) -> EndTransactionResult:
        """Resolve a parked transaction (admin).

        By default the broker sends one check-back to the checker of the transaction's
        producer group (the Celery checker, or a connected producer), waits up to
        ``wait_s`` for its answer and applies it: the fenced transaction_log decides.
        ``CheckUnansweredError`` when no checker takes the check, none answers in time, or
        the answer is UNKNOWN; nothing changes then (``applied`` is False in the result when
        the checker's own END already recorded the answer).

        ``force=Resolution.COMMIT`` or ``ROLLBACK`` records that resolution without a check:
        the transaction_log is not read, so forcing COMMIT on a transaction whose database
        transaction rolled back delivers a phantom message.
        """
        ...

    def recheck_parked(self, transaction_id: str) -> None:
        """Put a parked transaction back under check with a fresh check count (admin)."""
        ...

    def list_dlq(self, group: str, max_messages: int = 64, max_bytes: int | None = None) -> list[StoredMessage]:
        """The newest messages dead-lettered for a consumer group, oldest first; as many as
        ``max_bytes`` of stored size allows (the newest always comes)."""
        ...

    def resend_dlq(self, group: str, message_id: str) -> SendResult:
        """Send a dead-lettered message to its original topic again, for that group only."""
        ...

    def delete_group(self, group: str) -> DeletedGroup:
        """Delete a consumer group that is no longer used (RocketMQ's deleteSubGroup): its lag,
        its messages in flight and its DLQ depth are no longer reported (stats, metrics,
        console), its progress is no longer held, and the dead letters it had are no longer
        listed. Should its consumers come back, they resume where the group stopped: what it
        had done is not delivered again, except messages it acked out of order past one it
        had not. ``GroupInUseError`` while a receive of the group runs or messages it received
        are in flight; ``UnknownGroupError`` for a group the broker has nothing of."""
        ...

    def reset_group(self, group: str, topic: str, timestamp_ms: int | None = None) -> GroupReset:
        """Move a consumer group on ``topic`` (RocketMQ's resetOffsetByTime): in each of the
        topic's queues to the first message stored at or after ``timestamp_ms`` (epoch ms;
        0: the oldest kept), every message from there delivered again, acked or not; with
        None past the last message stored, so the group skips its backlog. Its retry queue
        and DLQ are left as they are. ``GroupInUseError`` while a receive of the group runs or
        messages it received are in flight; ``UnknownTopicError`` for a topic that does not
        exist."""
        ...

    def stats(self) -> BrokerStats:
        """Depths, backlogs, pending half messages, parked and DLQ counts."""
        ...

    def close(self) -> None:
        """Release the broker or the connection."""
        ...


def ack_each(broker: BrokerAPI, group: str, receipt_handles: list[str]) -> list[BrokerError | None]:
    """``BrokerAPI.ack_many`` by one ``ack`` per receipt: for a broker without a batch ack."""
    outcomes: list[BrokerError | None] = []
    for handle in receipt_handles:
        try:
            broker.ack(group, handle)
        except BrokerError as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes
