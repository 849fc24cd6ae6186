"""The gRPC front's ``Renewals`` against an in-process broker, where the order and outcome
of its broker calls decide: a renewal still in flight when its client ends must not land
after the release and keep the message invisible for another whole renewal; a renewal the
broker refuses for a passing reason is tried again, not given up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.errors import StoreFullError
from broker_embedded.server.grpc.renewal import RELEASED_INVISIBLE_S, Renewals

from ..broker.conftest import FAST

#: Renewed by this much each time: the first renewal is due two thirds of it after the receive.
INVISIBLE_S = 6.0

#: ``renew(group, handle, invisible_s)`` as the front's: what the broker is asked.
Renew = Callable[[str, str, float], Awaitable[object]]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(tmp_path / "broker", FAST)
    yield broker
    broker.close()


def _held_handle(broker: EmbeddedBroker) -> str:
    """A message sent and received for ``group``, invisible for ``INVISIBLE_S``: its handle."""
    broker.send(Message(topic="orders", body=b"order 1"))
    [held] = broker.receive("group", "orders", invisible_duration_s=INVISIBLE_S)
    return held.receipt_handle


def _renewing(broker: EmbeddedBroker) -> Renew:
    """The broker's own renewal, on a thread as the front calls it."""
    async def renew(group: str, handle: str, invisible_s: float) -> object:
        return await asyncio.get_running_loop().run_in_executor(None, partial(
            broker.change_invisible_duration, group, handle, invisible_s, keep_receipt=True))
    return renew


async def _visible_again_after(broker: EmbeddedBroker, since: float, give_up_s: float) -> float:
    """Seconds from ``since`` until the message can be received again (fails after ``give_up_s``)."""
    while not broker.receive("group", "orders", invisible_duration_s=60.0):
        await asyncio.sleep(0.05)
        assert time.monotonic() - since < give_up_s, "the message never came back"
    return time.monotonic() - since


def test_a_renewal_in_flight_when_its_client_ends_lands_before_the_release(broker: EmbeddedBroker) -> None:
    """The broker is slow to take the first renewal; the client ends while it is in flight,
    and the broker takes it only then. The message is visible again ``RELEASED_INVISIBLE_S``
    after the release, not ``INVISIBLE_S`` after the late renewal."""
    handle = _held_handle(broker)

    async def scenario() -> float:
        renewal_asked = asyncio.Event()
        broker_takes_renewals = asyncio.Event()
        by_the_broker = _renewing(broker)

        async def renew(group: str, handle: str, invisible_s: float) -> object:
            if invisible_s == INVISIBLE_S:  # a renewal: the broker takes it only when let
                renewal_asked.set()
                await broker_takes_renewals.wait()
            return await by_the_broker(group, handle, invisible_s)

        renewals = Renewals(renew, INVISIBLE_S)
        renewing = asyncio.get_running_loop().create_task(renewals.run(0.05))
        try:
            renewals.hold("client-1", "group", handle)
            await asyncio.wait_for(renewal_asked.wait(), INVISIBLE_S)
            renewals.end_client("client-1")
            ended_at = time.monotonic()
            await asyncio.sleep(0.2)  # the release is asked meanwhile
            broker_takes_renewals.set()
            return await _visible_again_after(broker, ended_at, INVISIBLE_S + 3)
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    back_after_s = asyncio.run(scenario())
    assert back_after_s < RELEASED_INVISIBLE_S + 2.0, f"visible again only {back_after_s:.1f} s after its client ended"


def test_a_renewal_refused_for_a_full_disk_is_tried_again(broker: EmbeddedBroker) -> None:
    """The broker refuses the first renewal with ``StoreFullError`` (its disk filled up for
    a moment): the message is renewed a moment later, so it stays invisible past its first
    invisible duration while its client still holds it."""
    handle = _held_handle(broker)
    received_at = time.monotonic()

    async def scenario() -> list[float]:
        by_the_broker = _renewing(broker)
        renewals_asked: list[float] = []

        async def renew(group: str, handle: str, invisible_s: float) -> object:
            renewals_asked.append(time.monotonic() - received_at)
            if len(renewals_asked) == 1:
                raise StoreFullError("disk full while appending (a moment)")
            return await by_the_broker(group, handle, invisible_s)

        renewals = Renewals(renew, INVISIBLE_S)
        renewing = asyncio.get_running_loop().create_task(renewals.run(0.05))
        try:
            renewals.hold("client-1", "group", handle)
            await asyncio.sleep(INVISIBLE_S + 1.0 - (time.monotonic() - received_at))
            assert not broker.receive("group", "orders", invisible_duration_s=60.0), \
                "visible again while its client holds it"
            return renewals_asked
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    asked = asyncio.run(scenario())
    assert len(asked) == 2, asked  # refused, then taken


def test_a_client_whose_stream_closed_is_released_once_it_gives_no_sign_of_life(broker: EmbeddedBroker) -> None:
    """A client whose Telemetry stream closed (``detach``) keeps its messages while it shows
    signs of life (``seen``: a heartbeat); once it gives none for ``gone_after_s`` it counts
    as gone and its messages are released, long before their renewed invisibility ends."""
    handle = _held_handle(broker)

    async def scenario() -> float:
        renewals = Renewals(_renewing(broker), INVISIBLE_S, gone_after_s=1.0)
        renewing = asyncio.get_running_loop().create_task(renewals.run(0.05))
        try:
            renewals.hold("client-1", "group", handle)
            renewals.detach("client-1")
            await asyncio.sleep(0.6)
            renewals.seen("client-1")  # a heartbeat within the second: not gone
            await asyncio.sleep(1.9)  # released, it would be visible by now
            assert not broker.receive("group", "orders", invisible_duration_s=60.0), "released while alive"
            renewals.detach("client-1")
            detached_at = time.monotonic()
            return await _visible_again_after(broker, detached_at, INVISIBLE_S + 3)
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    back_after_s = asyncio.run(scenario())
    # gone after 1 s, then visible RELEASED_INVISIBLE_S later; kept, it would be invisible until ~10 s after the receive
    assert 1.0 <= back_after_s < 1.0 + RELEASED_INVISIBLE_S + 1.5, back_after_s
