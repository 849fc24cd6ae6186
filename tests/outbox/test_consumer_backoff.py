"""``run_consumer`` against a TCP broker that goes away and comes back: it backs off
instead of polling every 0.5 s, says so once, and resumes when the server is back."""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from broker_embedded import BrokerClient, Message, ReceivedMessage
from outbox.consumer import run_consumer
from outbox.outage import FIRST_WAIT_S

from ..server.conftest import ServerProcess


class CountingClient(BrokerClient):
    """A real client that counts its receive calls."""

    receives = 0

    def receive(self, *args: Any, **kwargs: Any) -> list[ReceivedMessage]:
        self.receives += 1
        return super().receive(*args, **kwargs)


@pytest.mark.slow
def test_a_consumer_backs_off_while_the_broker_is_down_and_resumes(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    server = ServerProcess(tmp_path / "broker").start()
    client = CountingClient(server.url, timeout_s=5, connect_timeout_s=1)
    bodies: list[bytes] = []
    stop = threading.Event()

    def handle(received: ReceivedMessage) -> bool:
        bodies.append(received.message.body)
        return True

    consumer = threading.Thread(target=run_consumer, args=(client, "g", "orders", handle, stop),
                                kwargs={"wait_s": 0.2}, daemon=True)
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    try:
        with BrokerClient(server.url) as producer:
            producer.send(Message("orders", b"before"))
        consumer.start()
        deadline = time.monotonic() + 60
        while bodies != [b"before"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bodies == [b"before"]
        server.kill()
        down_at, attempts_before = time.monotonic(), client.receives
        time.sleep(6)
        down_s, attempts = time.monotonic() - down_at, client.receives - attempts_before
        # Polling every 0.5 s would try about down_s / 0.5 times (12 in 6 s); doubling waits
        # of at least FIRST_WAIT_S / 2 allow at most log2 of the elapsed time, plus the first two.
        assert attempts <= 2 + math.log2(down_s / (FIRST_WAIT_S / 2)), (attempts, down_s)
        went_down = [r for r in caplog.records if "broker unavailable" in r.getMessage()]
        assert len(went_down) == 1 and went_down[0].levelno == logging.WARNING
        server.start()  # the same port
        with BrokerClient(server.url) as producer:
            producer.send(Message("orders", b"after"))
        deadline = time.monotonic() + 90
        while bodies != [b"before", b"after"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bodies == [b"before", b"after"]
        back = [r for r in caplog.records if "reachable again" in r.getMessage()]
        assert len(back) == 1 and back[0].levelno == logging.INFO
        assert len([r for r in caplog.records if "broker unavailable" in r.getMessage()]) == 1
    finally:
        stop.set()
        consumer.join(30)
        client.close()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
