"""``groups delete`` over TCP: the deletion is durable once answered (the broker's process
SIGKILLed right after it keeps it), and a client that has not signed in cannot delete."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_embedded import BrokerClient, Message
from broker_embedded.errors import AuthenticationError

from .conftest import ServerProcess

GROUP, TOPIC = "retired", "orders"


def test_a_deleted_group_stays_deleted_when_the_broker_process_is_killed_after_the_answer(
        server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    with BrokerClient(server.url) as client:
        client.create_topic(TOPIC, 1)
        for n in range(2):
            client.send(Message(TOPIC, f"m{n}".encode()))
        for received in client.receive(GROUP, TOPIC, max_messages=2, wait_s=2):
            client.ack(GROUP, received.receipt_handle)
        client.send(Message(TOPIC, b"later"))
        assert client.stats().consumer_lag == {GROUP: {TOPIC: 1}}
        client.delete_group(GROUP)
    server.kill()
    server.start()
    with BrokerClient(server.url) as client:
        assert client.stats().consumer_lag == {}
        # a consumer of the group that comes back resumes where it stopped
        assert [r.message.body for r in client.receive(GROUP, TOPIC, max_messages=10, wait_s=2)] == [b"later"]


def test_a_client_that_has_not_signed_in_cannot_delete_a_group(
        server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory("--access-key", "ak", "--secret-key", "sk")
    with BrokerClient(server.url, access_key="ak", secret_key="sk") as client:
        client.send(Message(TOPIC, b"a"))
        for received in client.receive(GROUP, TOPIC, wait_s=2):
            client.ack(GROUP, received.receipt_handle)
    with BrokerClient(server.url) as stranger, pytest.raises(AuthenticationError):
        stranger.delete_group(GROUP)
    with BrokerClient(server.url, access_key="ak", secret_key="sk") as client:
        assert GROUP in client.stats().consumer_lag
        assert client.delete_group(GROUP).group == GROUP
