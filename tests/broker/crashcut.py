"""Crash emulation for the atomicity tests: byte cuts of a multi-record write, SIGKILL timing,
and the observations the invariant is stated in.

A byte cut rebuilds a data directory as a crash at commit log byte ``p`` of one operation
would leave it: every file as it was before the operation (``before``), plus the commit log
bytes the operation appended up to ``p``. Only public behaviour is observed afterwards.

Relies on: ``broker.store.commitlog.write_offset`` (the commit log end) and the layout
``<data_dir>/commitlog/<base offset, decimal digits>`` of segment files.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from broker_embedded import BrokerAPI, BrokerError, CheckRequest, EmbeddedBroker, Resolution

COMMITLOG = "commitlog"
#: Cut positions deeper than this inside a body (or a zero filler) are sampled, not exhaustive.
EDGE = 8


def _segments(data_dir: Path) -> dict[int, Path]:
    directory = data_dir / COMMITLOG
    return {int(p.name): p for p in directory.iterdir() if p.name.isdigit()} if directory.exists() else {}


@dataclass(frozen=True)
class CutImages:
    """The data dir before an operation (a copy) and after it (closed), and the commit log
    range ``[start, end)`` the operation appended."""

    before: Path
    after: Path
    start: int
    end: int
    _appended: bytes = field(default=b"", repr=False)

    @classmethod
    def capture(cls, before: Path, after: Path, start: int, end: int) -> CutImages:
        assert end > start, "the operation wrote nothing to the commit log"
        return cls(before, after, start, end, cls._read_range(after, start, end))

    @staticmethod
    def _read_range(data_dir: Path, start: int, end: int) -> bytes:
        out = bytearray()
        for base, path in sorted(_segments(data_dir).items()):
            data = path.read_bytes()
            lo, hi = max(start, base), min(end, base + len(data))
            if lo < hi:
                out += b"\0" * (lo - start - len(out))  # a gap would be a bug of the capture
                out += data[lo - base : hi - base]
        assert len(out) == end - start, "the commit log does not hold the operation's bytes"
        return bytes(out)

    def positions(self, runs: Iterable[bytes], stride: int) -> list[int]:
        """Cut positions in ``[start, end]``: every byte except deep inside a known run of
        bytes (a body, an id) or of zeros (segment filler), where every ``stride``-th byte."""
        deep = bytearray(len(self._appended))
        for body in [*runs, b"\0" * 64]:
            found = self._appended.find(body)
            while found >= 0:
                deep[found + EDGE : found + len(body) - EDGE] = b"\1" * max(0, len(body) - 2 * EDGE)
                found = self._appended.find(body, found + 1)
        return [
            self.start + i for i in range(len(self._appended) + 1)
            if i == len(deep) or not deep[i] or i % stride == 0
        ]

    def build(self, position: int, dest: Path) -> Path:
        """``dest``: the before image plus the appended bytes ``[start, position)``."""
        shutil.copytree(self.before, dest)
        for base, path in sorted(_segments(self.after).items()):
            lo, hi = max(self.start, base), min(position, base + path.stat().st_size)
            if base >= position or lo > hi:
                continue
            target = dest / COMMITLOG / path.name
            with open(target, "r+b" if target.exists() else "wb") as f:
                f.seek(lo - base)
                f.write(self._appended[lo - self.start : hi - self.start])
        return dest


def keep_before(broker: EmbeddedBroker, dest: Path) -> int:
    """Close ``broker`` (checkpointing every file), copy its data dir to ``dest``; returns
    the commit log end, where the next operation starts writing."""
    start = broker.store.commitlog.write_offset
    broker.close()
    shutil.copytree(broker.data_dir, dest)
    return start


def finish_after(broker: EmbeddedBroker) -> int:
    """Close ``broker`` after the operation; returns the commit log end."""
    end = broker.store.commitlog.write_offset
    broker.close()
    return end


class GatedChecker:
    """A checker that records each check and answers ``answer`` from its own thread, but
    only once ``release()`` was called: what recovery did alone can be observed first.
    Set ``broker`` once the broker that uses it is open."""

    broker: EmbeddedBroker

    def __init__(self, answer: Resolution) -> None:
        self.answer = answer
        self.requests: list[CheckRequest] = []
        self._open = threading.Event()

    def release(self) -> None:
        self._open.set()

    def request_check(self, request: CheckRequest) -> bool:
        self.requests.append(request)

        def reply() -> None:
            if not self._open.wait(30):
                return
            try:
                self.broker.end_transaction(request.transaction_id, self.answer,
                                            producer_group=request.producer_group, from_check=True)
            except BrokerError:
                pass  # the broker closed meanwhile: the next start checks again

        threading.Thread(target=reply, daemon=True).start()
        return True


def visible(reader: BrokerAPI, topic: str) -> Counter[str]:
    """How often each message id is readable in ``topic``, over all its queues."""
    queues = {info.name: info.queues for info in reader.list_topics()}.get(topic, 0)
    seen: Counter[str] = Counter()
    for queue_id in range(queues):
        offset = 0
        while batch := reader.read(topic, queue_id, offset, 16):
            seen.update(m.message.message_id for m in batch)
            offset = batch[-1].queue_offset + 1
    return seen


def exactly_once(seen: Counter[str], ids: Iterable[str]) -> bool:
    """Every id in ``ids`` seen once, and nothing else seen."""
    return seen == Counter(ids)


def describe(seen: Counter[str], ids: list[str]) -> str:
    """``seen`` in terms of the transaction's message numbers, e.g. ``{m1: 1, m2: 2}``."""
    names = {message_id: f"m{n}" for n, message_id in enumerate(ids, 1)}
    return "{" + ", ".join(f"{names.get(k, k)}: {v}" for k, v in sorted(seen.items())) + "}"


def wait_until(condition: Callable[[], object], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


#: Cuts checked at once: each is its own broker, and most of a check is waiting for fsync.
WORKERS = 8


def run_cuts(
    cut: CutImages, positions: list[int], workdir: Path, check: Callable[[Path], str | None],
    *, keep: bool = False, rebuild: bool = True, stop_after: int | None = None,
) -> list[str]:
    """``check`` the cut image of every position (``WORKERS`` at a time, in order); the
    violations it reports, as ``"+offset: problem"`` (offset from the operation's first
    byte). ``keep`` leaves the images in ``workdir/cut-<position>`` for a second pass with
    ``rebuild=False``; ``stop_after`` stops once that many violations were found."""

    def one(position: int) -> str | None:
        data = workdir / f"cut-{position}"
        if rebuild:
            cut.build(position, data)
        try:
            problem = check(data)
        finally:
            if not keep:
                shutil.rmtree(data, ignore_errors=True)
        return None if problem is None else f"+{position - cut.start}: {problem}"

    violations: list[str] = []
    with ThreadPoolExecutor(WORKERS) as pool:
        for chunk in range(0, len(positions), WORKERS * 4):
            violations += [v for v in pool.map(one, positions[chunk : chunk + WORKERS * 4]) if v]
            if stop_after is not None and len(violations) >= stop_after:
                violations.append("... (stopped early: at least this many)")
                break
    return violations


def report(violations: list[str], checked: int, what: str) -> str:
    """The failure message: how many cut positions broke the invariant, and the first ones."""
    found = [v for v in violations if v.startswith("+")]
    shown = "\n  ".join([*found[:8], *violations[len(found):]])
    return f"{len(found)} of {checked} cut positions of {what} broke atomicity:\n  {shown}"


class Killable(Protocol):
    """A broker server process that can be SIGKILLed (``tests.server.conftest.ServerProcess``)."""

    def kill(self) -> None: ...


def kill_later(server: Killable, delay_s: float) -> threading.Thread:
    """SIGKILL ``server`` ``delay_s`` from now, from a started thread (join it)."""

    def kill() -> None:
        time.sleep(delay_s)  # the fault's timing, not a wait for a condition
        server.kill()

    thread = threading.Thread(target=kill, name="killer")
    thread.start()
    return thread


def kill_delays(tries: int, max_ms: int = 20) -> list[float]:
    """``tries`` delays (seconds) cycling over every whole ms of 0..``max_ms``, in a
    scattered order so a short run still covers the whole range."""
    step = next(s for s in (8, 5, 3, 2, 1) if (max_ms + 1) % s)
    return [((n * step) % (max_ms + 1)) / 1000 for n in range(tries)]
