"""Waiting out an unreachable broker: back off instead of polling, say it once.

``BrokerOutage.failed(exc)`` returns how long to wait before the next attempt: 0.5 s,
doubling to a cap of 30 s, each wait drawn between half and all of that (jitter, so many
consumers do not retry in step). It logs one warning when the broker goes down, a reminder
every 5 minutes while it stays down, and ``recovered()`` one info line when it is back
(and starts the back-off over).
"""

from __future__ import annotations

import logging
import random
import time

FIRST_WAIT_S = 0.5
MAX_WAIT_S = 30.0
REMINDER_EVERY_S = 300.0


class BrokerOutage:
    """The state of one loop's outage (see the module docstring)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.failures = 0
        self.since: float | None = None
        self.reminded = 0.0

    def failed(self, error: Exception) -> float:
        """Record a failed attempt; returns the seconds to wait before the next one."""
        now = time.monotonic()
        if self.since is None:
            self.since = self.reminded = now
            self.log.warning("%s: broker unavailable (%s); retrying with back-off up to %.0fs",
                             self.what, error, MAX_WAIT_S)
        elif now - self.reminded >= REMINDER_EVERY_S:
            self.reminded = now
            self.log.warning("%s: broker still unavailable after %.0fs (%s)", self.what, now - self.since, error)
        ceiling = min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** min(self.failures, 16))
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def recovered(self) -> None:
        """Record a successful attempt: says so once if the broker was down."""
        if self.since is not None:
            self.log.info("%s: broker reachable again after %.1fs (%d failed attempts)",
                          self.what, time.monotonic() - self.since, self.failures)
        self.failures, self.since = 0, None
