"""The clock the broker's timers read: the wall clock, or a simulation's.

``StoreConfig.clock`` (one per broker, so the store's timestamps and the broker's timers
agree) is ``WALL`` unless a test passes its own: the deterministic simulation
(``tests/sim``) advances a clock of its own, so a seed replays exactly and hours of
check-backs and snapshots run in milliseconds, and no test sleeps.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where the broker reads the time."""

    def time_ms(self) -> int:
        """The wall time in milliseconds since the epoch (stored timestamps, due times)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals between timer rounds)."""


class WallClock:
    """The system's clocks (``time.time_ns`` and ``time.monotonic``)."""

    __slots__ = ()

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


#: The one wall clock, the default of ``StoreConfig.clock``.
WALL = WallClock()
