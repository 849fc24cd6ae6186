"""The latch an END waits on while the same resolution of its transaction is written."""

from __future__ import annotations

import threading

from broker_embedded.broker.transactions.latch import Latch


def test_every_waiter_passes_once_the_latch_opens_and_later_ones_at_once() -> None:
    latch = Latch()
    passed: list[bool] = []
    waiters = [threading.Thread(target=lambda: passed.append(latch.wait(10))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    assert not passed  # closed: all three wait
    latch.open()
    for waiter in waiters:
        waiter.join(10)
    assert passed == [True, True, True]
    assert latch.wait(0)
    latch.open()  # opening twice is harmless
    assert latch.wait(0)


def test_a_closed_latch_times_out() -> None:
    assert not Latch().wait(0.01)
