"""Recalling a delayed message (RocketMQ 5.3's RecallMessage): a send's ``recall_handle``
takes it back before it is due; it is then never delivered, across restarts too."""

from __future__ import annotations

import base64

import pytest

from broker_embedded import Message
from broker_embedded.errors import InvalidMessageError
from broker_embedded.message import now_ms

from .conftest import eventually


def _delayed(body: bytes, topic: str = "orders", in_ms: int = 600) -> Message:
    return Message(topic, body, deliver_at_ms=now_ms() + in_ms)


def test_a_recalled_message_is_never_delivered(broker_factory) -> None:
    broker = broker_factory()
    recalled = broker.send(_delayed(b"recalled"))
    kept = broker.send(_delayed(b"kept"))
    plain = broker.send(Message("orders", b"now"))
    assert recalled.recall_handle and kept.recall_handle and recalled.recall_handle != kept.recall_handle
    assert plain.recall_handle is None  # only a delayed message has one
    assert broker.recall("orders", recalled.recall_handle) == recalled.message_id
    assert broker.recall("orders", recalled.recall_handle) == recalled.message_id  # again: harmless
    got: list[bytes] = []
    eventually(lambda: got.extend(m.message.body for m in broker.receive("g", "orders", wait_s=0.2)) or len(got) >= 2)
    assert sorted(got) == [b"kept", b"now"]
    assert broker.receive("g", "orders", wait_s=1.0) == []
    assert len(broker.delays) == 0


def test_too_late_unknown_forged_and_other_topics_are_refused(broker_factory) -> None:
    broker = broker_factory()
    mine = broker.send(_delayed(b"mine", in_ms=300))
    theirs = broker.send(_delayed(b"theirs", topic="payments", in_ms=5000))
    with pytest.raises(InvalidMessageError, match="recall handle is invalid"):
        broker.recall("orders", "garbage")
    with pytest.raises(InvalidMessageError, match="recall handle is invalid"):
        broker.recall("orders", theirs.recall_handle)  # another topic's handle
    raw = base64.urlsafe_b64decode(theirs.recall_handle).decode().split(" ")
    raw[1] = "orders"  # rebound to this topic, the signature no longer matches
    with pytest.raises(InvalidMessageError, match="recall handle is invalid"):
        broker.recall("orders", base64.urlsafe_b64encode(" ".join(raw).encode()).decode())
    raw[3] = "é" * 32  # a signature that is not even hex
    with pytest.raises(InvalidMessageError, match="recall handle is invalid"):
        broker.recall("orders", base64.urlsafe_b64encode(" ".join(raw).encode()).decode())
    assert [m.message.body for m in broker.receive("g", "orders", wait_s=3)] == [b"mine"]
    with pytest.raises(InvalidMessageError, match="delivered"):
        broker.recall("orders", mine.recall_handle)
    assert broker.recall("payments", theirs.recall_handle) == theirs.message_id


def test_a_recall_survives_a_restart(broker_factory) -> None:
    broker = broker_factory()
    recalled = broker.send(_delayed(b"recalled", in_ms=1500))
    kept = broker.send(_delayed(b"kept", in_ms=1500))
    broker.recall("orders", recalled.recall_handle)
    broker.close()
    (broker.data_dir / "delay.snapshot").unlink()  # as after a crash: the waiting ones are re-read
    again = broker_factory()
    assert len(again.delays) == 1
    got = again.receive("g", "orders", wait_s=4)
    assert [m.message.message_id for m in got] == [kept.message_id]
    assert again.receive("g", "orders", wait_s=0.5) == []
    assert again.recall("orders", recalled.recall_handle) == recalled.message_id


def test_recalled_messages_leave_no_trace_in_memory(broker_factory) -> None:
    """Recalled far-future messages are dropped from the due-time heap well before they are due."""
    broker = broker_factory()
    results = broker.send_batch([_delayed(f"m{n}".encode(), in_ms=3_600_000) for n in range(300)])
    for result in results:
        broker.recall("orders", result.recall_handle)
    assert len(broker.delays) == 0
    assert len(broker.delays._heap) < 100  # not 300: compacted as recalls go
