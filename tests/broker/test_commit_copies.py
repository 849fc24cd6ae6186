"""A commit copies its half messages as the book kept them when they became durable, and
reads from the log only those the book no longer keeps; both give the same messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution
from broker_embedded.broker.transactions import book


def _count_log_reads(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The commit log offsets ``broker`` reads records at from now on."""
    offsets: list[int] = []
    read = broker.store.get

    def counting(offset: int) -> Any:
        offsets.append(offset)
        return read(offset)

    monkeypatch.setattr(broker.store, "get", counting)
    return offsets


def _delivered(broker: EmbeddedBroker, transaction_id: str) -> list[tuple[bytes, tuple[str, ...], str, Mapping[str, str]]]:
    received = broker.receive("g", f"orders-{transaction_id}", wait_s=2, max_messages=8)
    return sorted((r.message.body, r.message.keys, r.message.tag, r.message.properties) for r in received)


def _send_halves(broker: EmbeddedBroker, transaction_id: str) -> None:
    for n in range(2):
        broker.send_half(Message(f"orders-{transaction_id}", f"{transaction_id}-{n}".encode(), keys=(f"k{n}",), tag="t",
                                 properties={"n": str(n)}),
                         producer_group="pg", transaction_id=transaction_id)


def test_a_commit_reads_no_half_message_back_from_the_log(broker_factory, monkeypatch) -> None:
    broker = broker_factory(default_queues=1)
    _send_halves(broker, "fresh")
    reads = _count_log_reads(broker, monkeypatch)
    broker.end_transaction("fresh", Resolution.COMMIT, producer_group="pg")
    assert reads == []


def test_halves_the_book_no_longer_keeps_are_read_from_the_log_and_commit_the_same(broker_factory,
                                                                                  monkeypatch) -> None:
    broker = broker_factory(default_queues=1)
    _send_halves(broker, "kept")
    broker.end_transaction("kept", Resolution.COMMIT, producer_group="pg")
    kept = _delivered(broker, "kept")
    monkeypatch.setattr(book, "FRESH_HALVES", 2)
    _send_halves(broker, "evicted")
    _send_halves(broker, "newer")  # pushes "evicted" out of the book's two fresh halves
    reads = _count_log_reads(broker, monkeypatch)
    broker.end_transaction("evicted", Resolution.COMMIT, producer_group="pg")
    assert len(reads) == 2
    evicted = _delivered(broker, "evicted")
    assert [(body.replace(b"evicted", b"kept"), *rest) for body, *rest in evicted] == kept
    assert len(kept) == 2 and kept[0][1:] == (("k0",), "t", {"n": "0"})
