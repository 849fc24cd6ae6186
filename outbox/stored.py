"""Store mode: a call's messages wait in its own database while the broker is down.

A producer made with ``on_broker_down="store"`` does not fail a call whose half message
the broker cannot take in time: the call's transaction writes its messages into
``outbox_stored_message`` (``schema.STORED_MESSAGE``) beside its business rows and its
transaction_log row, and commits; no END_TRANSACTION follows. The relay
(``outbox.relay``) later hands each committed transaction's stored messages to the broker
with ``relay_committed``, which recognises a message it already holds (a half that did
arrive, an earlier relay's copy), so a relay killed at any point never leaves a second
copy in the broker. With ``"raise"`` (the default) the call raises
``BrokerUnavailableError`` and nothing of it commits, as RocketMQ's producer does.

Order within a message group: while a producer group's stored messages of a message group
wait for the relay, a new message of that group is stored too (``group_waiting``), so the
broker receives the group's messages in the order they were stored.

``BrokerDown`` is the producer's side (ORM-free, used by ``Producer`` and
``AsyncProducer``): whether the mode stores, and, after a failure, an outage in which
calls store at once instead of waiting for the broker again. It ends when the producer's
background probe (every ``PROBE_EVERY_S``) finds the broker answering, or at the latest
when the back-off after the last failure runs out and a call's half is taken. The statements are in
``outbox.sql``; an ORM runs them through its recorder's ``statements(db)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import msgspec

from broker_embedded import Message, Resolution

from . import instrumentation
from .errors import BrokerUnavailableError, ConfigurationError
from .outage import BrokerOutage
from .sql import Execute, OutboxSQL

log = logging.getLogger(__name__)

#: While a store-mode producer's broker is down, how often (seconds) it asks in the
#: background whether the broker answers again.
PROBE_EVERY_S = 1.0

#: What a call does when the broker cannot take its half message in time.
OnBrokerDown = Literal["raise", "store"]
ON_BROKER_DOWN_CHOICES: tuple[str, ...] = get_args(OnBrokerDown)


def checked_mode(value: str) -> OnBrokerDown:
    """``value`` as an ``on_broker_down`` mode; ``ConfigurationError`` otherwise."""
    if value not in ON_BROKER_DOWN_CHOICES:
        raise ConfigurationError(f"on_broker_down must be one of {ON_BROKER_DOWN_CHOICES}, not {value!r}")
    return value  # type: ignore[return-value]


class MessageHeld(BrokerUnavailableError):
    """Store mode kept a message out of the broker (``hold``): its transaction stores its
    messages. Not a failure of the broker: it starts no back-off."""

    def __init__(self, message: Message, transaction_id: str) -> None:
        super().__init__(f"message {message.message_id} of transaction {transaction_id} held for the database "
                         "(store mode)")


class BrokerDown:
    """A producer's ``on_broker_down`` mode and, in store mode, the outage it is in.
    ``on_outage`` is called when an outage starts: the producer starts its probe there,
    which calls ``answered`` once the broker answers."""

    def __init__(self, mode: str, producer_group: str, on_outage: Callable[[], None] = lambda: None) -> None:
        self.mode = checked_mode(mode)
        self._outage = BrokerOutage(log, f"producer group {producer_group} (store mode)")
        self._on_outage = on_outage
        self._lock = threading.Lock()
        #: While an outage lasts: when the back-off after its last failure ends (else 0).
        self._retry_at = 0.0
        #: Transactions whose messages are stored: no END_TRANSACTION after their commit.
        self._stored: set[str] = set()

    @property
    def stores(self) -> bool:
        """Whether a call stores its messages instead of raising (``"store"``)."""
        return self.mode == "store"

    def skipping(self) -> bool:
        """In store mode, within the back-off after a failure: calls store at once, without
        asking the broker (which a lost host would make them wait for)."""
        return self.stores and time.monotonic() < self._retry_at

    def not_taken(self, error: BrokerUnavailableError, transaction_id: str) -> None:
        """A half message of ``transaction_id`` was not taken: ``error`` is raised in raise
        mode; in store mode the back-off starts and the transaction stores its messages
        (``ends`` then says no END follows its commit)."""
        if not self.stores:
            raise error
        if not isinstance(error, MessageHeld):  # the broker failed: its next attempt after the back-off
            with self._lock:
                starts = not self._retry_at
                self._retry_at = time.monotonic() + self._outage.failed(error)
            if starts:
                self._on_outage()
        self._stored.add(transaction_id)

    def ends(self, transaction_id: str, resolution: Resolution) -> bool:
        """Whether END_TRANSACTION follows ``transaction_id``'s end with ``resolution``: not
        after the commit of a transaction that stored its messages (the relay hands them over)."""
        stored = transaction_id in self._stored
        self._stored.discard(transaction_id)
        return not (stored and resolution is Resolution.COMMIT)

    @property
    def down(self) -> bool:
        """Whether an outage is under way (from a half the broker did not take until it
        answers again)."""
        return bool(self._retry_at)

    def answered(self) -> None:
        """The broker answered (took a half message, or the probe): the outage, if any, is over."""
        with self._lock:
            ended, self._retry_at = bool(self._retry_at), 0.0
        if ended:
            self._outage.recovered()


class _Encoded(msgspec.Struct, array_like=True):
    """A stored message's bytes: what the broker needs to deliver it as it was sent."""

    version: int
    topic: str
    body: bytes
    keys: list[str]
    tag: str
    properties: dict[str, str]
    message_id: str
    delay_level: int
    deliver_at_ms: int | None
    message_group: str | None


_ENCODING_VERSION = 1
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Encoded)


def encode(message: Message) -> bytes:
    """The stored form of ``message`` (all but ``transaction_timeout_s``: it is committed)."""
    return _encoder.encode(_Encoded(_ENCODING_VERSION, message.topic, bytes(message.body), list(message.keys),
                                    message.tag, dict(message.properties), message.message_id,
                                    message.delay_level, message.deliver_at_ms, message.message_group))


def decode(data: bytes) -> Message:
    """The message ``encode`` stored."""
    encoded = _decoder.decode(data)
    return Message(encoded.topic, encoded.body, tuple(encoded.keys), encoded.tag, encoded.properties,
                   encoded.message_id, encoded.delay_level, encoded.deliver_at_ms, encoded.message_group)


@dataclass(frozen=True)
class StoredMessage:
    """A stored message as the relay reads it (``seq``: the order it was stored in)."""

    seq: int
    transaction_id: str
    producer_group: str
    message: Message


def store_messages(execute: Execute, sql: OutboxSQL, transaction_id: str, producer_group: str,
                   messages: Sequence[Message]) -> None:
    """Write ``messages`` of ``transaction_id`` in the caller's transaction (the one that
    wrote the transaction_log row), in their order."""
    for message in messages:
        execute(sql.store_message, (message.message_id, transaction_id, producer_group, message.topic,
                                    message.message_group, encode(message)))
    instrumentation.announce(instrumentation.MESSAGES_STORED, producer_group=producer_group,
                             transaction_id=transaction_id, count=len(messages))


def group_waiting(execute: Execute, sql: OutboxSQL, producer_group: str, message: Message) -> bool:
    """Whether stored messages of ``message``'s group still wait for the relay (it must wait
    behind them); never for a message without a group."""
    if message.message_group is None:
        return False
    return bool(execute(sql.group_waiting, (producer_group, message.message_group)))


def stored_message(row: Sequence[object]) -> StoredMessage:
    """A row of ``sql.claim_stored`` as a ``StoredMessage``."""
    seq, transaction_id, producer_group, data = row
    if not isinstance(seq, int) or not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"not a row of claim_stored: {row!r}")
    return StoredMessage(seq, str(transaction_id), str(producer_group), decode(bytes(data)))
