"""Replies fit a frame: large messages come back fewer per reply, never in a frame the client
cannot read, and a message left out of a reply is neither made invisible nor counted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, BrokerConfig, EmbeddedBroker, Message, ReceivedMessage
from broker_embedded.errors import BrokerError, MessageTooLargeError
from broker_embedded.server.tcp import BrokerServer
from broker_embedded.wire.protocol import (
    LENGTH,
    MAX_FRAME_BYTES,
    Kind,
    RequestCode,
    encode_frame,
    message_budget,
    to_wire,
)

from .wire import RawConnection

MiB = 1024 * 1024


def big(n: int) -> bytes:
    """A 3 MiB body that says which message it is."""
    return bytes([n]) * (3 * MiB)


def test_three_3_mib_messages_are_consumed_with_the_default_batch(server_factory) -> None:
    """``receive(max_messages=16)`` (``run_consumer``'s default) used to get a reply over the
    client's frame limit, lose the connection and count a delivery attempt, every time."""
    server = server_factory()
    with BrokerClient(server.url, timeout_s=20) as client:
        client.create_topic("big", 1)
        for n in range(3):
            client.send(Message("big", big(n)))
        received: list[ReceivedMessage] = []
        errors: list[BrokerError] = []
        deadline = time.monotonic() + 20
        while len(received) < 3 and time.monotonic() < deadline:
            try:
                received += client.receive("g", "big", max_messages=16, wait_s=1)
            except BrokerError as exc:
                errors.append(exc)
        assert not errors, f"{len(errors)} receives failed, the first with {errors[0]!r}"
        assert sorted(r.message.body for r in received) == [big(n) for n in range(3)]
        assert [r.delivery_attempt for r in received] == [1, 1, 1], "a message left out was not counted"
        for r in received:
            client.ack("g", r.receipt_handle)


def test_a_message_left_out_of_a_reply_is_received_next(server_factory) -> None:
    server = server_factory()
    with BrokerClient(server.url, timeout_s=20) as client:
        client.create_topic("big", 1)
        for n in range(3):
            client.send(Message("big", big(n)))
        first = client.receive("g", "big", max_messages=16, wait_s=5)
        second = client.receive("g", "big", max_messages=16, invisible_duration_s=60)
        assert [r.message.body for r in first + second] == [big(n) for n in range(3)]
        assert len(first) == 2 and [r.delivery_attempt for r in second] == [1]


def test_read_query_and_dlq_replies_are_cut_to_fit(thread_server) -> None:
    server = thread_server(BrokerConfig(max_delivery_attempts=1, retry_backoff_s=(0.0,)))
    with BrokerClient(server.url, timeout_s=20) as client:
        client.create_topic("big", 1)
        for n in range(3):
            client.send(Message("big", big(n), keys=("k",)))
        offset, read = 0, []
        while offset < 3:
            batch = client.read("big", 0, offset, 32)
            assert 1 <= len(batch) <= 2
            read += batch
            offset = batch[-1].queue_offset + 1
        assert [m.message.body for m in read] == [big(n) for n in range(3)]
        by_key = client.query_by_key("big", "k")
        assert [m.message.body for m in by_key] == [big(1), big(2)], "the newest that fit"
        deadline = time.monotonic() + 20
        while client.stats().dlq_depth.get("g", 0) < 3:
            assert time.monotonic() < deadline, "the messages were not dead-lettered"
            client.receive("g", "big", max_messages=16, invisible_duration_s=0.1, wait_s=0.3)
        assert [m.message.body for m in client.list_dlq("g")] == [big(1), big(2)], "the newest that fit"


def test_no_reply_is_larger_than_a_frame_whatever_the_client_asks(server_factory) -> None:
    server = server_factory()
    with BrokerClient(server.url, timeout_s=20) as client:
        client.create_topic("big", 1)
        for n in range(3):
            client.send(Message("big", big(n)))
    connection = RawConnection(server.port, timeout_s=20)
    connection.request(RequestCode.PULL_MESSAGE, 1,
                       {"topic": "big", "queue_id": 0, "offset": 0, "max_messages": 32, "max_bytes": 10**12})
    _, request_id, _, body = connection.reply()
    assert request_id == 1 and len(body["ok"]) == 2
    connection.request(RequestCode.PULL_MESSAGE, 2,
                       {"topic": "big", "queue_id": 0, "offset": 0, "max_messages": 32, "max_bytes": 1})
    assert len(connection.reply()[3]["ok"]) == 1, "at least one message, however small the budget"
    connection.close()


def test_the_budget_holds_for_messages_with_the_most_wire_overhead(tmp_path: Path) -> None:
    """Keys of 32 characters (on the wire each gets a 2-byte header where the store has a
    1-byte space: the 1/32), the longest topic, group and ids: a full answer still fits,
    and the budget does not waste the frame."""
    broker = EmbeddedBroker(tmp_path, BrokerConfig())
    topic = "t" * 127
    keys = tuple(f"{n:032d}" for n in range(900))
    try:
        broker.create_topic(topic, 1)
        for n in range(300):
            broker.send(Message(topic, b"", keys=keys, tag="x" * 100, message_id=f"{n:064d}"))
        for max_messages, group in ((250, "g" * 127), (1024, "h" * 127)):
            received = broker.receive(group, topic, max_messages=max_messages, max_bytes=message_budget(max_messages))
            read = broker.read(topic, 0, 0, max_messages, max_bytes=message_budget(max_messages))
            for answer in (received, read):
                frame = encode_frame(RequestCode.POP_MESSAGE, 2**64 - 1, Kind.RESPONSE, {"ok": to_wire(answer)})
                assert 0.8 * MAX_FRAME_BYTES < len(frame) - LENGTH.size <= MAX_FRAME_BYTES
    finally:
        broker.close()


def test_a_message_too_large_for_any_reply_is_refused(thread_server) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        with pytest.raises(MessageTooLargeError):
            client.send(Message("t", b"x", properties={"p": "v" * (MAX_FRAME_BYTES // 2)}))
        with pytest.raises(MessageTooLargeError):
            client.send(Message("t", b"x", keys=("k" * 40,) * 100_000))


def test_a_server_refuses_a_broker_whose_messages_cannot_fit_a_frame(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, BrokerConfig(max_body_size=MAX_FRAME_BYTES))
    try:
        with pytest.raises(ValueError, match="frame"):
            BrokerServer(broker, port=0)
    finally:
        broker.close()
