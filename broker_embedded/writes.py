"""Write calls that share one append and one fsync (group commit).

SEND_MESSAGE, SEND_HALF_MESSAGE and END_TRANSACTION are the broker's write path. The
server collects the calls that arrive together and hands them to
``EmbeddedBroker.produce`` as one batch: each call is *staged* (validated, turned into the
records it writes), every staged record goes into one ``MessageStore.put_batch`` (one
append, one fsync), and each call then gets its own result or the typed error that
refused it. A call that fails staging fails alone; the others are still written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .message import Message, Resolution
from .store.record import StoredRecord


@dataclass(frozen=True, slots=True)
class SendCall:
    """``send(message)``."""

    message: Message


@dataclass(frozen=True, slots=True)
class HalfCall:
    """``send_half(message, producer_group=, transaction_id=)``."""

    message: Message
    producer_group: str
    transaction_id: str


@dataclass(frozen=True, slots=True)
class EndCall:
    """``end_transaction(transaction_id, resolution, producer_group=, from_check=)``."""

    transaction_id: str
    resolution: Resolution
    producer_group: str
    from_check: bool = False


WriteCall = SendCall | HalfCall | EndCall


def _nothing() -> None:
    return None


@dataclass(slots=True)
class Staged:
    """A validated call: the records it writes, what it answers once they are durable
    (``finish`` gets them back completed, in the same order), and what to undo when the
    write fails (``abort``)."""

    records: list[StoredRecord]
    finish: Callable[[list[StoredRecord]], Any]
    abort: Callable[[], None] = field(default=_nothing)
