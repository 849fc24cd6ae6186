"""An in-process broker with small segments and short timeouts, and a checker that records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded import BrokerConfig, CheckRequest, EmbeddedBroker, Resolution
from broker_embedded.errors import BrokerClosedError
from broker_embedded.store.config import StoreConfig

FAST = BrokerConfig(
    # small index files: the crash tests copy whole data directories, and a copy is not sparse
    store=StoreConfig(segment_size=256 * 1024, checkpoint_interval_s=0.5, index_slots=4096, index_entries=16384),
    transaction_timeout_s=0.3,
    check_interval_s=0.3,
    check_max=3,
    retry_backoff_s=(0.0,),
    max_delivery_attempts=3,
    service_tick_s=0.02,
)


class AnsweringChecker:
    """A checker answering with ``answer`` from its own thread, like a remote producer."""

    def __init__(self, answer: Resolution) -> None:
        self.answer = answer
        self.requests: list[CheckRequest] = []
        self.broker: EmbeddedBroker | None = None

    def request_check(self, request: CheckRequest) -> bool:
        self.requests.append(request)
        assert self.broker is not None
        broker = self.broker
        def answer() -> None:
            try:
                broker.end_transaction(request.transaction_id, self.answer,
                                       producer_group=request.producer_group, from_check=True)
            except BrokerClosedError:  # the test closed the broker before this late answer
                pass

        threading.Thread(target=answer).start()
        return True


def eventually(condition: Callable[[], object], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition did not hold in time")


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    opened: list[EmbeddedBroker] = []

    def open_broker(checker: AnsweringChecker | None = None, **overrides: object) -> EmbeddedBroker:
        broker = EmbeddedBroker(tmp_path / "broker", replace(FAST, **overrides), checker)
        if checker is not None:
            checker.broker = broker
        opened.append(broker)
        return broker

    yield open_broker
    for broker in opened:
        broker.close()


def reopened(broker: EmbeddedBroker, open_broker: Callable[..., EmbeddedBroker], *, replay_every_event: bool,
             **overrides: object) -> EmbeddedBroker:
    """``broker`` closed (which writes its snapshots) and opened again by ``open_broker``;
    with ``replay_every_event``, its consumer snapshot removed first, as after a crash before
    any snapshot: every consumer progress event is replayed."""
    broker.close()
    if replay_every_event:
        broker._consumer_snapshot_path.unlink(missing_ok=True)
    return open_broker(**overrides)
