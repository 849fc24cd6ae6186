"""The loss ledger: every acknowledged record the store found destroyed, kept on disk until
an operator acknowledges it.

Recovery (a log cut above the checkpoint), ``repair`` (damage below it) and the background
scrub (a bad page in a closed segment) each write what they drop here, by message id where a
surviving byte (a consume queue entry, the index, a readable record header, the transaction
book) names it and as an exact count where none does. ``fsck``, the console, ``/metrics`` and
``/healthz`` read the ledger, so a loss stays visible across restarts until ``halfmoon-broker
losses --acknowledge`` says someone has looked. The file is small: it grows with damage found,
never with messages stored.

A ledger that cannot be read (damage on the disk that lost the records, most likely) does not
keep the store from opening: the store moves it aside to ``losses.json.unreadable``, starts a
new one that says so (``LossLedger.unreadable``) and is degraded until an operator
acknowledges it, as for a loss. ``fsck`` reports it and changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import InitVar, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from ..errors import CorruptStateError
from .files import set_aside, write_atomically
from .filesystem import REAL, FileSystem
from .record import StoredRecord

log = logging.getLogger(__name__)

LEDGER_FILE = "losses.json"

FoundBy = Literal["recovery", "repair", "scrub"]


#: A lost record's place: topic, queue id, queue offset.
Place = tuple[str, int, int]
#: A message id a surviving byte outside its record names, with its commit log offset where
#: that is known too (None: the index tells, by the id's hash).
Name = tuple[int | None, str]


class Namer(Protocol):
    """Names that the layers above the store keep for records (the broker's transaction
    records), for ``fsck`` and ``repair`` to name lost records by: the store knows no
    transactions, so the broker passes one in."""

    def from_record(self, record: StoredRecord) -> Iterable[Name]:
        """The records ``record`` names (called with every intact record)."""
        ...

    def from_files(self, data_dir: Path) -> Iterable[Name]:
        """The records the layer's own files in ``data_dir`` name."""
        ...


@dataclass(frozen=True, slots=True)
class Loss:
    """One damaged or missing commit log range ``[start, end)`` and the records it took."""

    loss_id: int
    found_by: FoundBy
    start: int
    end: int
    #: Ids of the lost records that a surviving byte names.
    message_ids: tuple[str, ...]
    #: Lost records no surviving byte names (counted exactly where the store can).
    unnamed: int
    detail: str
    found_at_ms: int
    acknowledged: bool = False
    #: The queue places of the lost records, where known: once a rebuilt or deleted consume
    #: queue forgets the hole a lost record left, these keep it from being counted again.
    places: tuple[Place, ...] = ()
    #: Part of the range could not be read (EIO, a latent sector error), or it lies past the
    #: checkpoint where the headers that would count its records are gone (zeros where a
    #: write never reached its place, a misdirected write's copy over them): every record
    #: that lay in it is lost, and ``records`` counts those some surviving
    #: byte tells of, at least one; a record of which no other byte (queue entry, index entry,
    #: checkpoint count) tells is lost uncounted, known only by lying in the range.
    unreadable: bool = False

    @property
    def records(self) -> int:
        """How many records this loss took."""
        return len(self.message_ids) + self.unnamed

    def describe(self) -> str:
        """One line for a log or a terminal."""
        named = f"{len(self.message_ids)} named" if self.message_ids else "none named"
        at_least = "at least " if self.unreadable else ""
        return (f"loss {self.loss_id} ({self.found_by}): commit log {self.start}-{self.end}, "
                f"{at_least}{self.records} records lost ({named}, {self.unnamed} unnamed): {self.detail}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["message_ids"] = list(self.message_ids)
        data["places"] = [list(place) for place in self.places]
        return data


@dataclass
class LossLedger:
    """The ledger of ``data_dir`` (``losses.json``): read at open, rewritten atomically (fsync'd)
    on every change. Thread-safe. A ledger that cannot be read raises ``CorruptStateError``,
    unless ``set_aside`` (an opening store, ``repair``): then it is moved to
    ``losses.json.unreadable`` (``files.set_aside``) and this one starts empty, saying so in
    ``unreadable`` until acknowledged. ``read=False``: an empty ledger that leaves the file
    alone (``fsck`` of a directory whose ledger cannot be read)."""

    data_dir: Path
    fs: FileSystem = field(default=REAL, compare=False, repr=False)
    set_aside: bool = False
    read: InitVar[bool] = True
    _losses: list[Loss] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: Why an earlier ledger was set aside (and where), until acknowledged; None: it was not.
    unreadable: str | None = field(default=None, init=False)

    def __post_init__(self, read: bool) -> None:
        self.data_dir = Path(self.data_dir)
        path = self.data_dir / LEDGER_FILE
        if not read or not self.fs.exists(path):
            return
        try:
            body = json.loads(self.fs.read_bytes(path))
            self._losses = [_loss_from_json(item) for item in body["losses"]]
            unreadable = body.get("unreadable")
            if unreadable is not None and not isinstance(unreadable, str):
                raise TypeError(f"unreadable is {unreadable!r}, not a text")
            self.unreadable = unreadable
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = f"the loss ledger {path} cannot be read ({type(exc).__name__}: {exc})"
            if not self.set_aside:
                raise CorruptStateError(f"{problem}; the broker sets it aside when it opens") from exc
            self._losses = []
            aside = set_aside(path, self.fs)
            self.unreadable = (f"{problem}: kept as {aside.name}; the losses it held are not shown until "
                               "someone has looked at it")
            self._write()
            log.error("%s", self.unreadable)

    def record(
        self, found_by: FoundBy, start: int, end: int, message_ids: Iterable[str], unnamed: int,
        detail: str, places: Iterable[Place] = (), unreadable: bool = False,
    ) -> Loss:
        """Add a loss, make it durable, log it as an ERROR; returns it. ``places``: the
        queue places of the lost records, where known; ``unreadable``: see ``Loss``."""
        with self._lock:
            loss = Loss(
                loss_id=max((item.loss_id for item in self._losses), default=0) + 1,
                found_by=found_by, start=start, end=end, message_ids=tuple(message_ids),
                unnamed=unnamed, detail=detail, found_at_ms=int(time.time() * 1000),
                places=tuple(sorted(set(places))), unreadable=unreadable,
            )
            self._losses.append(loss)
            self._write()
        log.error("acknowledged messages lost: %s; ids: %s", loss.describe(),
                  ", ".join(loss.message_ids) or "none known")
        return loss

    def cut_at(self, end: int) -> list[Loss]:
        """The commit log ends at ``end`` now (recovery cut a torn tail there, or a repair
        did): a loss's range past it ends there, one wholly past it covering no bytes at
        ``end``, as recovery's own cut-off losses do (its records stay named and counted).
        Records appended from ``end`` on then never lie in a loss's range, which would pass
        their later damage for that known loss. Returns the losses changed, as they were."""
        with self._lock:
            changed = [loss for loss in self._losses if loss.end > end]
            if changed:
                self._losses = [replace(loss, start=min(loss.start, end), end=end) if loss.end > end else loss
                                for loss in self._losses]
                self._write()
        for loss in changed:
            log.warning("loss %d's commit log range %d-%d lies past the log's end, %d: it ends there now",
                        loss.loss_id, loss.start, loss.end, end)
        return changed

    def covers(self, offset: int) -> bool:
        """Whether a loss's commit log range holds ``offset``: a record there is counted."""
        with self._lock:
            return any(loss.start <= offset < loss.end for loss in self._losses)

    def places(self) -> set[Place]:
        """The queue places of every lost record the ledger knows the place of."""
        with self._lock:
            return {place for loss in self._losses for place in loss.places}

    def open_losses(self) -> list[Loss]:
        """The losses nobody has acknowledged yet."""
        with self._lock:
            return [loss for loss in self._losses if not loss.acknowledged]

    def all(self) -> list[Loss]:
        """Every loss in the ledger, acknowledged or not, oldest first."""
        with self._lock:
            return list(self._losses)

    def acknowledge(self, loss_ids: Iterable[int] | None = None) -> list[Loss]:
        """Mark the given losses (all open ones, and an unreadable ledger set aside, for
        None) as seen; returns the losses marked."""
        wanted = None if loss_ids is None else set(loss_ids)
        with self._lock:
            marked = [loss for loss in self._losses
                      if not loss.acknowledged and (wanted is None or loss.loss_id in wanted)]
            seen_aside = wanted is None and self.unreadable is not None
            if marked or seen_aside:
                ids = {loss.loss_id for loss in marked}
                self._losses = [_acknowledged(loss) if loss.loss_id in ids else loss
                                for loss in self._losses]
                if seen_aside:
                    self.unreadable = None
                self._write()
        return marked

    def _write(self) -> None:
        body: dict[str, Any] = {"losses": [loss.to_json() for loss in self._losses]}
        if self.unreadable is not None:
            body["unreadable"] = self.unreadable
        write_atomically(self.data_dir / LEDGER_FILE, json.dumps(body, indent=1).encode(), self.fs)


def _acknowledged(loss: Loss) -> Loss:
    return Loss(**{**asdict(loss), "message_ids": loss.message_ids, "places": loss.places, "acknowledged": True})


def _loss_from_json(item: dict[str, Any]) -> Loss:
    places = tuple((topic, int(queue_id), int(queue_offset)) for topic, queue_id, queue_offset in item.get("places", ()))
    return Loss(**{**item, "message_ids": tuple(item["message_ids"]), "places": places})
