"""A consumer loop logs, per interval at INFO, how many messages it handled, skipped as
duplicates and failed (issue 22, item 11: ``outbox consume`` logged nothing per message)."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from broker_embedded import EmbeddedBroker, Message, ReceivedMessage
from outbox import run_consumer

COUNTS = re.compile(r"consumer points on order\.paid: (\d+) handled, (\d+) skipped as duplicates, "
                    r"(\d+) failed in the last \d+ s")


def _totals(caplog: pytest.LogCaptureFixture) -> list[int]:
    found = [COUNTS.fullmatch(record.getMessage()) for record in caplog.records
             if record.name == "outbox.consumer" and record.levelno == logging.INFO]
    return [sum(int(match[i]) for match in found if match) for i in (1, 2, 3)]


def test_each_interval_with_messages_logs_its_counts(broker: EmbeddedBroker,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    broker.consumers.retry_backoff_ms = (0,)
    failures = {"bad": 1}

    def handler(received: ReceivedMessage) -> bool:
        message_id = received.message.message_id
        if failures.get(message_id, 0):
            failures[message_id] -= 1
            raise RuntimeError("fails once")
        return message_id != "dup"

    for message_id in ("m1", "m2", "dup", "bad"):
        broker.send(Message("order.paid", b"{}", message_id=message_id))
    stop = threading.Event()
    thread = threading.Thread(target=run_consumer, args=(broker, "points", "order.paid", handler, stop),
                              kwargs={"invisible_duration_s": 0.05, "wait_s": 0.1, "log_interval_s": 0.2})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while _totals(caplog) != [3, 1, 1] and time.monotonic() < deadline:
            time.sleep(0.1)
        # m1, m2 and bad's redelivery handled, dup skipped, bad's first attempt failed;
        # logged by the loop while it runs, not only when it stops
        assert _totals(caplog) == [3, 1, 1], [r.getMessage() for r in caplog.records]
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(30)
