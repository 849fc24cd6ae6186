"""A seeded workload against the ``MessageStore`` on a simulated disk, and its checker.

One seed gives one schedule: batches of messages sent (bodies up to a few hundred KiB,
across segment, consume queue file and index file boundaries: the store's files are made
small), checkpoints, clean restarts, process crashes and power losses, each followed by a
recovery, with the disk faults of the seed's profile. The workload keeps a model of what
it was told: a message whose ``put_batch`` returned is *acknowledged*; one whose call
failed, or was cut by a crash, *may* be there. After every recovery the checker reads
every queue and holds the store to the model:

* the store opens (after any crash a real disk can produce);
* every acknowledged message is there exactly once, with its body, or is named by the
  loss ledger (only media faults, bit flips and latent sector errors, may lose one);
* a message that may be there is there at most once; nothing else is;
* each queue holds its messages in the order they were sent.

A message found after a recovery from a power loss is on the disk: from then on it counts
as acknowledged. Everything is drawn from the seed, so ``run(seed, profile)`` replays a
schedule exactly (the store's wall-clock timestamps differ, and no check reads them).
The steps and the checker are ``Simulation``'s; ``test_store_machine.py`` drives the same
steps from Hypothesis.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from broker_embedded.errors import BrokerError, CorruptLogError
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.losses import Loss
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import PROPERTY_MESSAGE_ID, StoredRecord
from broker_embedded.store.repair import repair
from tests.sim.crash import abandon
from tests.sim.disk import Faults, PowerCut, SimulatedDisk

#: The fault profiles a seed runs with.
PROFILES: dict[str, Faults] = {
    "power": Faults(),
    "io": Faults(write_error=0.03, fsync_error=0.03),
    "media": Faults(bit_flip=0.3, read_error=0.1),
    # a misdirected write leaves intact copies of records at a wrong place (each record's own
    # offset tells them apart) and zeros at its own
    "misdirected": Faults(bit_flip=0.3, misdirected_write=0.005),
}
DATA_DIR = Path("/sim/data")
#: Tries to open the store after a crash, the last on a healthy disk.
OPEN_ATTEMPTS = 4
TOPICS = (("orders", 2), ("payments", 1))
MAX_BODY = 300 * 1024
CONFIG = StoreConfig(
    segment_size=1024 * 1024,
    consume_queue_file_entries=16,
    index_slots=64,
    index_entries=48,
    scrub_bytes_per_s=0,  # no background reads: the schedule is the only actor
    checkpoint_interval_s=1e9,  # checkpoints are steps of the schedule
    async_flush_interval_s=1e9,
)


class SimulationFailure(AssertionError):
    """The store broke a promise under a seed's schedule."""


@dataclass
class Result:
    """What one seed did: its steps and, if the store (or the broker, ``workload="tx"``)
    broke a promise, how."""

    seed: int
    profile: str
    steps: list[str] = field(default_factory=list)
    failure: str | None = None
    #: What the disk did (injected faults, power losses), for the report.
    disk_events: list[str] = field(default_factory=list)
    #: The ``--workload`` of ``benchmarks/simulate.py`` that replays it.
    workload: str = "store"

    def replay_command(self) -> str:
        option = "" if self.workload == "store" else f" --workload {self.workload}"
        return f"python benchmarks/simulate.py{option} --seed {self.seed} --profile {self.profile}"

    def report(self) -> str:
        """The failure, the last steps and disk events, and the command that replays it."""
        label = "" if self.workload == "store" else f"{self.workload} "
        tail = "\n".join(f"  {step}" for step in self.steps[-20:])
        events = "\n".join(f"  {event}" for event in self.disk_events[-15:])
        return (f"{label}seed {self.seed} ({self.profile}) failed at step {len(self.steps)}: {self.failure}\n"
                f"last steps:\n{tail}\nlast disk events:\n{events}\nreplay: {self.replay_command()}")


def body_of(number: int, size: int) -> bytes:
    """Message ``number``'s body: recognisable at every byte, so that a torn or misplaced
    body cannot pass."""
    unit = f"<{number}>".encode()
    return (unit * (size // len(unit) + 1))[:size]


class Simulation:
    """The store on ``disk``, its model, and the steps of a schedule. ``rng`` decides what
    the schedule leaves open inside a step (how a failed call ends, a crash inside a
    close); the steps' own arguments are the driver's: the seeded ``run`` draws them from
    the seed, the Hypothesis state machine (``test_store_machine.py``) from its data."""

    def __init__(self, rng: random.Random, disk: SimulatedDisk) -> None:
        self.rng = rng
        self.disk = disk
        self.config = dataclasses.replace(CONFIG, filesystem=self.disk)
        self.steps: list[str] = []
        self.acked: dict[int, int] = {}  # message number -> body size
        self.maybe: dict[int, int] = {}
        self.queue_of: dict[int, tuple[str, int]] = {}
        self.placed: dict[int, tuple[int, int]] = {}  # acknowledged -> commit log offset, end
        self.damage_seen = 0  # the disk's damaged ranges taken into account so far
        self.next_number = 0
        self.store: MessageStore | None = None

    def step(self, text: str) -> None:
        self.steps.append(text)

    def fail(self, text: str) -> NoReturn:
        raise SimulationFailure(text)

    # -- the steps ------------------------------------------------------------------------
    def send(self, topic: str, queue_id: int, sizes: Sequence[int], crash_at: int | None) -> None:
        """Send one batch of messages with bodies of ``sizes`` to ``topic``/``queue_id``,
        the process stopped at its ``crash_at``-th change to the disk (None: not)."""
        store = self.store
        assert store is not None
        records: list[StoredRecord] = []
        numbered: dict[int, int] = {}
        for size in sizes:
            number = self.next_number
            self.next_number += 1
            numbered[number] = size
            self.queue_of[number] = (topic, queue_id)
            records.append(StoredRecord(topic, queue_id, body_of(number, size),
                                        {PROPERTY_MESSAGE_ID: f"m{number}"}))
        self.maybe.update(numbered)  # until put_batch returns
        what = f"send {sorted(numbered)} ({sum(sizes)} bytes) to {topic}/{queue_id}"
        if not self.attempt(what, lambda: store.put_batch(records), crash_at):
            return
        for number, record in zip(numbered, records, strict=True):
            self.acked[number] = self.maybe.pop(number)
            self.placed[number] = (record.commit_log_offset, record.commit_log_offset + record.size)
        self.step(f"{what}: acknowledged")

    def checkpoint(self, crash_at: int | None) -> None:
        """Checkpoint the store, maybe stopped at its ``crash_at``-th change to the disk."""
        assert self.store is not None
        if self.attempt("checkpoint", self.store.checkpoint, crash_at):
            self.step("checkpoint")

    def attempt(self, what: str, call: Callable[[], object], crash_at: int | None) -> bool:
        """Run a call of the store with a crash armed at its ``crash_at``-th change to the
        disk; False when it failed (the store may go on, as a broker does, or be restarted)
        or the crash fell."""
        if crash_at is not None:
            self.disk.crash_after(crash_at)
        try:
            call()
        except PowerCut as cut:
            self.step(f"{what}: cut short before {cut}")
            self.crash(power=self.rng.random() < 0.7, armed=True)
            return False
        except (OSError, BrokerError) as exc:
            self.step(f"{what}: failed ({type(exc).__name__}: {exc})")
            if self.rng.random() < 0.5:
                self.crash(power=self.rng.random() < 0.5)
            return False
        finally:
            self.disk.crash_after(None)
        return True

    def crash(self, power: bool, armed: bool = False) -> None:
        """Kill the store (``armed``: it already stopped at a ``PowerCut``), lose power or
        not, reopen."""
        assert self.store is not None
        if not armed and self.rng.random() < 0.3:
            self.disk.crash_after(self.rng.randint(1, 6))  # a crash inside the close
            try:
                self.store.close()
                self.step("close, then crash")
            except (PowerCut, OSError, BrokerError) as exc:
                self.step(f"close: cut short ({type(exc).__name__}: {exc})")
            self.disk.crash_after(None)
        abandon(self.store)
        self.store = None
        self.stop(power)
        self.open("power loss" if power else "process crash", power)

    def stop(self, power: bool) -> None:
        """The process dies (no store open): with the machine's power (``power``) or alone."""
        if power:
            self.disk.power_loss()
            self.unprovable(self.disk.damaged[self.damage_seen:])
            self.damage_seen = len(self.disk.damaged)
        else:
            self.disk.process_crash()

    def restart(self) -> None:
        """Close the store cleanly (a process crash if the close fails) and reopen it."""
        assert self.store is not None
        try:
            self.store.close()
        except (OSError, BrokerError) as exc:
            self.step(f"close: failed ({type(exc).__name__}: {exc})")
            abandon(self.store)
            self.disk.process_crash()
        self.store = None
        self.open("clean restart")

    def abandon(self) -> None:
        """Stop the open store, if any, as a killed process (the end of a schedule)."""
        if self.store is not None:
            abandon(self.store)
            self.store = None

    def unprovable(self, damage: list[tuple[Path, int, int]]) -> None:
        """Damage to the last acknowledged records of the log (a misdirected write may
        take a whole batch) reads to recovery as a torn append (a bad CRC, or zeros, with
        nothing intact after it), which it truncates: no byte the store keeps says they
        were acknowledged, so the model lets them go (they may be there). The records after
        them that earlier damage took (to be named or counted) are not intact either, so
        they do not end the log. Any other damaged acknowledged record must be named or
        counted."""
        def hits(events: list[tuple[Path, int, int]]) -> list[tuple[int, int]]:
            return [(int(path.name) + first, int(path.name) + after) for path, first, after in events
                    if path.parent.name == "commitlog"]

        new, every = hits(damage), hits(self.disk.damaged)
        for number in sorted(self.placed, key=lambda number: self.placed[number][0], reverse=True):
            start, end = self.placed[number]
            if any(first < end and after > start for first, after in new):
                self.step(f"damage in m{number}, at the end of the log: it may be lost unreported")
                self.maybe[number] = self.acked.pop(number)
                del self.placed[number]
            elif not any(first < end and after > start for first, after in every):
                return  # an intact record ends the log

    # -- recovery and the check -----------------------------------------------------------
    def open(self, cause: str, durable: bool = False) -> None:
        """Reopen the store and check it. The open runs with the profile's faults on, and
        may be cut by a crash armed inside it (in recovery, or in a repair): then the
        process dies, with the power or alone, and the store is opened again; after
        ``OPEN_ATTEMPTS - 1`` such tries the last runs on a healthy disk, and must succeed.
        When the store refuses to open and the disk may damage synced data, ``repair``
        runs first, as an operator would."""
        for attempt in range(OPEN_ATTEMPTS):
            final = attempt == OPEN_ATTEMPTS - 1
            self.disk.faults_on = not final
            if not final and self.rng.random() < 0.25:
                self.disk.crash_after(self.rng.randint(1, 40))
            try:
                self.store = self.open_or_repair(cause, final)
                break
            except PowerCut as cut:
                power = self.rng.random() < 0.5
                self.step(f"{cause}, reopen: cut short before {cut}, then {'power loss' if power else 'crash'}")
                self.stop(power)
                durable = durable or power
            except (OSError, BrokerError) as exc:  # a fault injected in this try
                self.step(f"{cause}, reopen: failed ({type(exc).__name__}: {exc})")
                self.disk.process_crash()
            finally:
                self.disk.crash_after(None)
                self.disk.faults_on = True
        found = self.check(cause)
        if durable:
            for number, place in found.items():
                if number in self.maybe:
                    self.acked[number] = self.maybe.pop(number)
                    self.placed[number] = place
        self.step(f"{cause}, reopen: {len(found)} messages, {len(self.acked)} acknowledged")

    def open_or_repair(self, cause: str, final: bool) -> MessageStore:
        """The store opened, repaired first if it refuses and media faults may explain it.
        ``SimulationFailure`` for a refusal without media faults, and for any failure of the
        ``final`` try; an ``OSError`` or ``BrokerError`` of an earlier try passes (an
        injected fault: the next try may succeed)."""
        try:
            try:
                return MessageStore(DATA_DIR, self.config)
            except CorruptLogError as exc:
                self.step(f"{cause}, reopen: the store refuses to open ({type(exc).__name__}: {exc})")
                if not self.disk.damaged:
                    self.fail(f"the store does not reopen after a {cause}: {type(exc).__name__}: {exc}")
            self.repair()
            return MessageStore(DATA_DIR, self.config)
        except (OSError, BrokerError) as exc:
            if final:
                self.step(f"{cause}, reopen: the store refuses to open")
                self.fail(f"the store does not reopen after a {cause}: {type(exc).__name__}: {exc}")
            raise
        except (SimulationFailure, PowerCut):
            raise
        except Exception as exc:
            self.fail(f"opening the store after a {cause}: unexpected {type(exc).__name__}: {exc}")

    def repair(self) -> None:
        """``halfmoon-broker repair`` on the stopped store's directory."""
        report = repair(DATA_DIR, fs=self.disk, config=self.config)
        self.step(f"repair: {report.check.lost_count} records lost, "
                  f"{[f'{gap.kind} {gap.start}-{gap.end}' for gap in report.check.gaps]}")

    def check(self, cause: str) -> dict[int, tuple[int, int]]:
        """Hold the reopened store to the model; the messages found, with their commit log
        offset and end. The ledger is
        read after the queues: a reader that skips a damaged record records it there."""
        store = self.store
        assert store is not None
        found: dict[int, tuple[int, int]] = {}  # message number -> commit log offset, end
        for topic, queues in TOPICS:
            for queue_id in range(queues):
                last = -1
                for record in _read_all(store, topic, queue_id):
                    number = int(record.properties[PROPERTY_MESSAGE_ID][1:])
                    size = self.acked.get(number, self.maybe.get(number))
                    if size is None:
                        self.fail(f"message m{number} in {topic}/{queue_id} was never sent")
                    if self.queue_of[number] != (topic, queue_id):
                        self.fail(f"message m{number} in {topic}/{queue_id}, sent to {self.queue_of[number]}")
                    if record.body != body_of(number, size):
                        self.fail(f"message m{number} has a damaged body")
                    if number <= last:
                        self.fail(f"{topic}/{queue_id}: m{number} after m{last} (out of order or twice)")
                    last = number
                    found[number] = record.commit_log_offset, record.commit_log_offset + record.size
        losses = store.losses.all()
        # a name read from a damaged header may be damaged too: no message's ("m00"), or another
        # message's, sent to a queue other than the places the loss names ("m11" with a bit
        # flipped reads "m19"): a record counted, not named
        sent = {f"m{number}" for number in self.queue_of}

        def trusted(loss: Loss, message_id: str) -> bool:
            queues = {(topic, queue_id) for topic, queue_id, _ in loss.places}
            return message_id in sent and (not queues or self.queue_of[int(message_id[1:])] in queues)

        named = [message_id for loss in losses for message_id in loss.message_ids if trusted(loss, message_id)]
        unnamed = sum(loss.unnamed + sum(1 for message_id in loss.message_ids if not trusted(loss, message_id))
                      for loss in losses)
        if (named or unnamed) and not self.disk.damaged:
            self.fail(f"after a {cause} the loss ledger names {sorted(named)} and {unnamed} unnamed, "
                      f"with no media fault injected yet: {losses}")
        readable = sorted(message_id for message_id in named if int(message_id[1:]) in found)
        if readable:
            self.fail(f"after a {cause} the loss ledger names {readable}, which are readable: {losses}")
        if len(set(named)) < len(named):
            self.fail(f"after a {cause} the loss ledger names a message twice: {sorted(named)}")
        missing = sorted(number for number in self.acked
                         if number not in found and f"m{number}" not in named)
        # bytes the disk cannot read, and records past the checkpoint whose headers are gone
        # (a misdirected write's zeros or copy), may hold records nothing else tells of:
        # those lost with them are named by the range (``Loss.unreadable``), not counted
        unreadable = [(loss.start, loss.end) for loss in losses if loss.unreadable]
        uncounted = [number for number in missing if number in self.placed and any(
            start <= self.placed[number][0] < end for start, end in unreadable)]
        if len(missing) - len(uncounted) > unnamed:
            self.fail(f"after a {cause} acknowledged messages are silently missing: "
                      f"{[f'm{n}' for n in missing[:20]]} ({len(missing)}; the ledger: {losses})")
        absent = sum(1 for number in self.maybe if number not in found and f"m{number}" not in named)
        if unnamed > len(missing) + absent:
            self.fail(f"after a {cause} the loss ledger counts {unnamed} unnamed lost messages, but only "
                      f"{len(missing)} acknowledged and {absent} unacknowledged ones are absent: {losses}")
        return found


def _read_all(store: MessageStore, topic: str, queue_id: int) -> list[StoredRecord]:
    records: list[StoredRecord] = []
    offset = store.queue_min_offset(topic, queue_id)
    while batch := store.read_queue(topic, queue_id, offset, 64):
        records.extend(batch)
        offset = batch[-1].queue_offset + 1
    return records


class _SeededSchedule:
    """The seeded driver: every step and its arguments drawn from one ``random.Random``."""

    def __init__(self, seed: int, profile: str) -> None:
        self.rng = random.Random(seed)
        disk = SimulatedDisk(random.Random(self.rng.getrandbits(64)), PROFILES[profile])
        self.simulation = Simulation(self.rng, disk)

    def run(self, steps: int) -> None:
        simulation, rng = self.simulation, self.rng
        simulation.open("open")
        for _ in range(steps):
            choice = rng.random()
            if choice < 0.62:
                topic, queues = rng.choice(TOPICS)
                queue_id = rng.randrange(queues)
                sizes = [rng.randrange(MAX_BODY) if rng.random() < 0.15 else rng.randrange(4000)
                         for _ in range(rng.choice((1, 1, 2, 3, 5)))]
                simulation.send(topic, queue_id, sizes, self.crash_at())
            elif choice < 0.74:
                simulation.checkpoint(self.crash_at())
            elif choice < 0.90:
                simulation.crash(power=True)
            elif choice < 0.96:
                simulation.crash(power=False)
            else:
                simulation.restart()

    def crash_at(self) -> int | None:
        return self.rng.randint(1, 12) if self.rng.random() < 0.3 else None


def run(seed: int, profile: str = "power", steps: int = 60) -> Result:
    """Run seed ``seed``'s schedule of ``steps`` steps; ``Result.failure`` says what broke."""
    schedule = _SeededSchedule(seed, profile)
    simulation = schedule.simulation
    result = Result(seed, profile, simulation.steps)
    try:
        schedule.run(steps)
    except SimulationFailure as exc:
        result.failure = str(exc)
    except Exception as exc:  # the store itself raised where it must not
        result.failure = f"unexpected {type(exc).__name__}: {exc}"
    finally:
        simulation.abandon()
    result.disk_events = simulation.disk.events
    return result
