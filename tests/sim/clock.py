"""The simulations' clock: a ``broker_embedded.clock.Clock`` that moves only when told."""

from __future__ import annotations


class SimClock:
    """A simulation's clock (``broker_embedded.clock.Clock``): it moves only when told, so
    the broker's timers and the server's deadlines run at the time a test chooses."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.ms = start_ms

    def time_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)
