"""Tag filters on receive: which messages a group takes, the others consumed for it,
a changed subscription, malformed expressions, and what a filter reads."""

from __future__ import annotations

import zlib

import pytest

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.broker import consumption
from broker_embedded.errors import InvalidMessageError
from broker_embedded.filters import parse_tag_filter


def _send(broker: EmbeddedBroker, *tags: str) -> None:
    for n, tag in enumerate(tags):
        broker.send(Message("orders", f"{tag or 'untagged'}-{n}".encode(), tag=tag))


def _take(broker: EmbeddedBroker, group: str, expression: str) -> list[str]:
    """Receive and ack everything ``expression`` gives ``group`` now; the bodies, sorted."""
    got = []
    while batch := broker.receive(group, "orders", max_messages=3, filter_expression=expression):
        for received in batch:
            got.append(received.message.body.decode())
            broker.ack(group, received.receipt_handle)
    return sorted(got)


def test_one_tag_two_tags_and_every_message(broker_factory) -> None:
    broker = broker_factory()
    _send(broker, "created", "paid", "", "shipped", "paid")
    assert _take(broker, "billing", "paid") == ["paid-1", "paid-4"]
    assert _take(broker, "mail", "created || shipped") == ["created-0", "shipped-3"]
    assert _take(broker, "audit", " created||paid ") == ["created-0", "paid-1", "paid-4"]
    assert _take(broker, "archive", "*") == ["created-0", "paid-1", "paid-4", "shipped-3", "untagged-2"]
    assert _take(broker, "default", "") == ["created-0", "paid-1", "paid-4", "shipped-3", "untagged-2"]
    assert broker.stats().consumer_lag["billing"] == {"orders": 0}  # the skipped ones count as consumed


def test_a_skipped_message_is_never_delivered_to_that_group_even_after_a_restart(broker_factory) -> None:
    broker = broker_factory()
    _send(broker, "paid", "created", "paid")
    assert _take(broker, "billing", "paid") == ["paid-0", "paid-2"]
    assert _take(broker, "billing", "*") == []  # the group's progress is past "created"
    assert _take(broker, "audit", "*") == ["created-1", "paid-0", "paid-2"]  # another group gets it
    broker.close()
    broker = broker_factory()
    assert _take(broker, "billing", "*") == []  # the skip is recorded, not recomputed
    assert broker.stats().consumer_lag["billing"] == {"orders": 0}


def test_a_changed_subscription_applies_from_the_groups_progress(broker_factory) -> None:
    broker = broker_factory()
    broker.create_topic("orders", queues=1)  # one queue: the group's progress is one offset
    _send(broker, "a", "b", "a", "b")
    first = broker.receive("g", "orders", max_messages=1, filter_expression="a")
    assert [r.message.body for r in first] == [b"a-0"]
    broker.ack("g", first[0].receipt_handle)
    # "b-1" and "b-3" were passed over (consumed) by the old subscription; "a-2" was read for
    # it but never delivered: the new one judges it
    assert _take(broker, "g", "b") == []
    broker.send(Message("orders", b"b-later", tag="b"))
    broker.send(Message("orders", b"a-later", tag="a"))
    assert _take(broker, "g", "b") == ["b-later"]


def test_a_message_delivered_before_the_change_comes_back_until_acked(broker_factory) -> None:
    broker = broker_factory()
    _send(broker, "a")
    held = broker.receive("g", "orders", invisible_duration_s=0.05, filter_expression="a")
    assert [r.message.body for r in held] == [b"a-0"]
    again = broker.receive("g", "orders", wait_s=5, filter_expression="b")
    assert [(r.message.body, r.delivery_attempt) for r in again] == [(b"a-0", 2)]


def test_a_tag_hash_match_is_confirmed_against_the_stored_tag(broker_factory) -> None:
    twin, tag = "t928096", "t11200040"  # the same CRC32: one consume queue tag hash
    assert zlib.crc32(twin.encode()) == zlib.crc32(tag.encode())
    broker = broker_factory()
    _send(broker, twin, tag)
    assert _take(broker, "g", tag) == [f"{tag}-1"]


@pytest.mark.parametrize("expression", [
    "a ||", "|| a", "a |||| b", "a | b", "a|b", "* || a", "a b", "TAGS = 'a'", "a > 5", "x" * 128, "a\tb",
])
def test_a_malformed_expression_is_refused_and_stores_nothing(broker_factory, expression: str) -> None:
    broker = broker_factory()
    _send(broker, "a")
    with pytest.raises(InvalidMessageError, match="not a TAG expression|up to .* characters"):
        broker.receive("g", "fresh-topic", filter_expression=expression)
    with pytest.raises(InvalidMessageError):
        broker.receive("g", "orders", filter_expression=expression)
    assert "fresh-topic" not in [topic.name for topic in broker.list_topics()]
    assert broker.stats().consumer_lag == {}
    assert _take(broker, "g", "a") == ["a-0"]


def test_an_sql92_expression_as_a_tag_filter_is_refused_naming_the_type() -> None:
    with pytest.raises(InvalidMessageError, match="an SQL92 filter has the type SQL92"):
        parse_tag_filter("amount > 100 AND region = 'eu'")


def test_a_filter_reads_only_the_records_whose_tag_hash_matches(broker_factory, monkeypatch) -> None:
    broker = broker_factory()
    _send(broker, *(["noise"] * 200 + ["wanted"] + ["noise"] * 200))
    commitlog = broker.store.commitlog
    reads: list[int] = []
    real_read = commitlog.read

    def counted(offset: int, size: int):  # type: ignore[no-untyped-def]
        reads.append(offset)
        return real_read(offset, size)

    monkeypatch.setattr(commitlog, "read", counted)
    assert _take(broker, "g", "wanted") == ["wanted-200"]
    assert len(reads) <= 2  # read when taken, and once more when delivered with its body


def test_one_receive_scans_past_many_passes_over_the_lock(broker_factory, monkeypatch) -> None:
    """A long run of messages the filter passes over is scanned in passes of
    ``FILTER_SCAN_LIMIT`` entries, the lock released between them; one receive without a
    wait still reaches the match behind them."""
    monkeypatch.setattr(consumption, "FILTER_SCAN_LIMIT", 300)
    broker = broker_factory()
    broker.create_topic("orders", queues=1)
    _send(broker, *(["noise"] * 1000 + ["wanted"]))
    got = broker.receive("g", "orders", filter_expression="wanted")
    assert [r.message.body for r in got] == [b"wanted-1000"]
    assert broker.stats().consumer_lag == {"g": {"orders": 1}}
