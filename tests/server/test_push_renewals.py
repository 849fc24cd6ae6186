"""The gRPC front's ``Renewals`` against an in-process broker, where the order of its broker
calls decides: a renewal still in flight when its client ends must not land after the release
and keep the message invisible for another whole renewal."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.server.grpc.renewal import RELEASED_INVISIBLE_S, Renewals

from ..broker.conftest import FAST

#: Renewed by this much each time: the first renewal is due two thirds of it after the receive.
INVISIBLE_S = 6.0


def test_a_renewal_in_flight_when_its_client_ends_lands_before_the_release(tmp_path: Path) -> None:
    """The broker is slow to take the first renewal; the client ends while it is in flight,
    and the broker takes it only then. The message is visible again ``RELEASED_INVISIBLE_S``
    after the release, not ``INVISIBLE_S`` after the late renewal."""
    broker = EmbeddedBroker(tmp_path / "broker", FAST)
    try:
        broker.send(Message(topic="orders", body=b"order 1"))
        [held] = broker.receive("group", "orders", invisible_duration_s=INVISIBLE_S)

        async def scenario() -> float:
            loop = asyncio.get_running_loop()
            renewal_asked = asyncio.Event()
            broker_takes_renewals = asyncio.Event()

            async def renew(group: str, handle: str, invisible_s: float) -> object:
                if invisible_s == INVISIBLE_S:  # a renewal: the broker takes it only when let
                    renewal_asked.set()
                    await broker_takes_renewals.wait()
                return await loop.run_in_executor(None, partial(
                    broker.change_invisible_duration, group, handle, invisible_s, keep_receipt=True))

            renewals = Renewals(renew, INVISIBLE_S)
            renewing = loop.create_task(renewals.run(0.05))
            renewals.hold("client-1", "group", held.receipt_handle)
            await asyncio.wait_for(renewal_asked.wait(), INVISIBLE_S)
            renewals.end_client("client-1")
            ended_at = time.monotonic()
            await asyncio.sleep(0.2)  # the release is asked meanwhile
            broker_takes_renewals.set()
            try:
                while not broker.receive("group", "orders", invisible_duration_s=60.0):
                    await asyncio.sleep(0.05)
                    assert time.monotonic() - ended_at < INVISIBLE_S + 3, "the message never came back"
                return time.monotonic() - ended_at
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)

        back_after_s = asyncio.run(scenario())
        assert back_after_s < RELEASED_INVISIBLE_S + 2.0, f"visible again only {back_after_s:.1f} s after its client ended"
    finally:
        broker.close()
