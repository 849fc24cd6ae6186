"""A one-shot gate between threads, for the END that waits on another END's write."""

from __future__ import annotations

import threading


class Latch:
    """Closed until ``open``; ``wait`` returns once it is open. What ``threading.Event``
    does for a single ``set``, at the cost of one lock (an END makes one per transaction:
    no condition variable to build for the rare END that waits)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def open(self) -> None:
        """Let every waiter through, now and later; opening an open latch does nothing."""
        try:
            self._lock.release()
        except RuntimeError:  # already open
            pass

    def wait(self, timeout_s: float) -> bool:
        """Whether the latch opened within ``timeout_s`` seconds."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        self.open()  # open again for the next waiter (unless an ``open`` meanwhile did)
        return True
