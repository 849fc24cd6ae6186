"""Write calls that share one append and one fsync (group commit).

SEND_MESSAGE, SEND_HALF_MESSAGE, END_TRANSACTION and RELAY_COMMITTED are the broker's
write path. The
server collects the calls that arrive together and hands them to
``EmbeddedBroker.produce`` as one batch: each call is *staged* (validated, turned into the
records it writes), every staged record goes into one ``MessageStore.put_batch`` (one
append, one fsync), and each call then gets its own result or the typed error that
refused it. A call that fails staging fails alone; the others are still written.

Each call type has one ``validate`` that checks every field it writes, before anything is
staged: a refused call stores nothing, and nothing stored can fail its own replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgspec

from ..errors import InvalidMessageError
from ..message import (
    Message,
    MessageLimits,
    Resolution,
    validate_group_once,
    validate_message,
    validate_relayed,
    validate_transaction_id,
)
from ..store.record import StoredRecord


class SendCall(msgspec.Struct, frozen=True):
    """``send(message)``."""

    message: Message

    def validate(self, limits: MessageLimits) -> None:
        validate_message(self.message, limits)


class HalfCall(msgspec.Struct, frozen=True):
    """``send_half(message, producer_group=, transaction_id=)``."""

    message: Message
    producer_group: str
    transaction_id: str

    def validate(self, limits: MessageLimits) -> None:
        validate_message(self.message, limits)
        validate_group_once(self.producer_group)
        validate_transaction_id(self.transaction_id)


class EndCall(msgspec.Struct, frozen=True):
    """``end_transaction(transaction_id, resolution, producer_group=, from_check=, oneway=)``.

    ``oneway``: the caller does not wait for the END (RocketMQ's ``endTransactionOneway``),
    so a batch of nothing but such ENDs is held, not written: the next write writes it ahead
    of its own records and its fsync (or ``EmbeddedBroker.flush``) makes it durable and its
    messages visible."""

    transaction_id: str
    resolution: Resolution
    producer_group: str
    from_check: bool = False
    oneway: bool = False

    def validate(self, limits: MessageLimits) -> None:
        validate_transaction_id(self.transaction_id)
        validate_group_once(self.producer_group)
        if not isinstance(self.resolution, Resolution):
            raise InvalidMessageError(f"resolution {self.resolution!r} is not a Resolution")
        if not isinstance(self.from_check, bool):
            raise InvalidMessageError(f"from_check {self.from_check!r} is not a bool")
        if not isinstance(self.oneway, bool):
            raise InvalidMessageError(f"oneway {self.oneway!r} is not a bool")


class RelayCall(msgspec.Struct, frozen=True):
    """``relay_committed(messages, producer_group=, transaction_id=)``: the messages of a
    transaction that committed in the producer's database, without half message or END."""

    messages: list[Message]
    producer_group: str
    transaction_id: str

    def validate(self, limits: MessageLimits) -> None:
        validate_relayed(self.messages, self.transaction_id, limits)
        validate_group_once(self.producer_group)


class ForcedResolveCall(msgspec.Struct, frozen=True):
    """``resolve_parked(transaction_id, force=resolution)``: an operator's COMMIT or
    ROLLBACK of a parked transaction, recorded without a check-back."""

    transaction_id: str
    resolution: Resolution

    def validate(self, limits: MessageLimits) -> None:
        validate_transaction_id(self.transaction_id)
        if self.resolution not in (Resolution.COMMIT, Resolution.ROLLBACK):
            raise InvalidMessageError(f"a forced resolution is COMMIT or ROLLBACK, not {self.resolution!r}")


#: The write requests of the wire protocol.
WriteCall = SendCall | HalfCall | EndCall | RelayCall
#: Every call ``EmbeddedBroker.produce`` stages.
AnyWriteCall = WriteCall | ForcedResolveCall


def _nothing() -> None:
    return None


class Staged(msgspec.Struct):
    """A validated call: the records it writes, what it answers once they are durable
    (``finish`` gets them back completed, in the same order), and what to undo when the
    write fails, or when held records (oneway ENDs) are dropped unwritten (``abort``)."""

    records: list[StoredRecord]
    finish: Callable[[list[StoredRecord]], Any]
    abort: Callable[[], None] = _nothing


@runtime_checkable
class DeferredWrites(Protocol):
    """A broker that holds a batch of oneway ENDs for its next write (no fsync of their own)
    (``EmbeddedBroker``): a front answers them through ``when_durable`` (with ``lost``'s
    error if they were dropped, not written) and fsyncs with ``flush`` when no other write
    comes to do it."""

    def when_durable(self, callback: Callable[[], None],
                     lost: Callable[[Exception], None] | None = None) -> None: ...

    @property
    def unsynced(self) -> bool: ...

    def flush(self) -> None: ...
