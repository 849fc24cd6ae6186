"""The instrumentation points: listeners see operations and occurrences, a failing
listener changes nothing, and an unknown event name is a typed error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution
from outbox import Producer, instrumentation
from outbox.instrumentation import Operation, UnknownEventError


def test_an_operation_listener_sees_the_start_the_end_and_the_outcome(broker: EmbeddedBroker) -> None:
    seen: list[tuple[str, object]] = []

    @contextlib.contextmanager
    def watch(operation: Operation) -> Iterator[None]:
        seen.append(("start", operation.attributes["resolution"]))
        yield
        seen.append(("end", operation.outcome))

    instrumentation.listen(instrumentation.END_TRANSACTION, watch)
    instrumentation.listen(instrumentation.END_TRANSACTION, watch)  # once, however often added
    try:
        producer = Producer(broker, "shop")
        producer.send_half(Message("order.paid", b"{}"), "tx-1")
        assert producer.end_transaction("tx-1", Resolution.COMMIT) is True
    finally:
        instrumentation.remove(instrumentation.END_TRANSACTION, watch)
    assert seen == [("start", Resolution.COMMIT), ("end", "sent")]
    assert not instrumentation.contains(instrumentation.END_TRANSACTION, watch)


def test_a_failing_listener_changes_nothing(broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    def broken_start(operation: Operation) -> None:
        raise RuntimeError("listener bug")

    @contextlib.contextmanager
    def broken_end(operation: Operation) -> Iterator[None]:
        yield
        raise RuntimeError("listener bug at the end")

    def broken_occurrence(**attributes: object) -> None:
        raise RuntimeError("listener bug")

    listeners = [(instrumentation.SEND, broken_start), (instrumentation.SEND, broken_end),
                 (instrumentation.ROWS_PURGED, broken_occurrence)]
    for name, listener in listeners:
        instrumentation.listen(name, listener)
    try:
        Producer(broker, "shop").send(Message("order.paid", b"{}", message_id="m1"))
        instrumentation.announce(instrumentation.ROWS_PURGED, table="t", rows=1)
    finally:
        for name, listener in listeners:
            instrumentation.remove(name, listener)
    [received] = broker.receive("points", "order.paid", wait_s=2)
    assert received.message.message_id == "m1" and received.message.properties == {}
    assert caplog.text.count("listener bug") >= 3


def test_an_unknown_event_is_a_typed_error() -> None:
    with pytest.raises(UnknownEventError, match="send_halfs"):
        instrumentation.listen("send_halfs", print)
    with pytest.raises(ValueError):  # also a ValueError
        instrumentation.listens_for("nothing")(print)
