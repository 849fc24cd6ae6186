"""A ``topics.json`` that cannot be read keeps no broker from starting.

Before, damage to it (the file is small and rewritten atomically, so only the disk can damage
it) made every start fail with a bare ``JSONDecodeError`` or ``UnicodeDecodeError``. Now the
previous version, kept as ``topics.json.bak`` at every change, stands in for it, and the
topics the store holds records of that the backup lacks come back with the queues their
records are in (at least ``default_queues``).
"""

from __future__ import annotations

import json
import logging

import pytest

from broker_embedded import EmbeddedBroker, Message

GARBAGE = [b"{", b"", b"\xff\xfe", b"[]", b'{"orders": "8"}', b'{"orders": 0}', b'{"orders": true}']


def _three_topics(broker_factory) -> EmbeddedBroker:
    """A broker with ``orders`` (8 queues, 1 with records), ``empty`` (3 queues, none) and,
    created last, ``payments`` (6 queues, a message group's record in one); closed."""
    broker = broker_factory(default_queues=2)
    broker.create_topic("orders", queues=8)
    broker.create_topic("empty", queues=3)
    broker.send(Message("orders", b"o"))
    broker.create_topic("payments", queues=6)
    broker.send(Message("payments", b"p", message_group="g"))
    broker.close()
    return broker


@pytest.mark.parametrize("garbage", GARBAGE)
def test_an_unreadable_topics_file_is_set_aside_and_its_backup_and_the_store_stand_in(
        broker_factory, garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    data = _three_topics(broker_factory).data_dir
    assert json.loads((data / "topics.json.bak").read_text()) == {"orders": 8, "empty": 3}  # before payments
    (data / "topics.json").write_bytes(garbage)
    with caplog.at_level(logging.ERROR, logger="broker_embedded.broker.topic_registry"):
        broker = broker_factory(default_queues=2)
    queues = broker.topics.queues
    assert queues["orders"] == 8 and queues["empty"] == 3  # from the backup
    assert 2 <= queues["payments"] <= 6  # from its records, at least default_queues
    assert "cannot be read" in caplog.text and "payments" in caplog.text
    assert (data / "topics.json.unreadable").read_bytes() == garbage
    assert [m.message.body for m in broker.receive("g1", "orders", wait_s=2)] == [b"o"]
    broker.close()
    reopened = broker_factory(default_queues=2)  # the recovered registry was written back
    assert reopened.topics.queues == queues


def test_with_no_readable_backup_the_topics_come_from_the_store(broker_factory) -> None:
    data = _three_topics(broker_factory).data_dir
    (data / "topics.json").write_bytes(b"{")
    (data / "topics.json.bak").write_bytes(b"{")
    broker = broker_factory(default_queues=2)
    assert set(broker.topics.queues) == {"orders", "payments"}  # "empty" had no record
    assert all(count >= 2 for count in broker.topics.queues.values())
    assert [m.message.body for m in broker.receive("g1", "payments", wait_s=2)] == [b"p"]
