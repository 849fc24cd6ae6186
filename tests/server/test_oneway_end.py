"""A oneway END_TRANSACTION over TCP: written without an fsync of its own, answered once an
fsync covers it (the next write's, or the server's own a millisecond later), so an answer
means what a waited END's means (one that could not be written is answered with an error);
a hostile ``oneway`` value is refused and stores nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message, Resolution, TransactionState
from broker_embedded.errors import BrokerError, MalformedFrameError
from broker_embedded.store.config import StoreConfig
from broker_embedded.wire.protocol import RequestCode
from tests.broker.test_oneway_end import POISON, PoisonedWrites

from .conftest import ThreadServer


def _half_then_oneway_commit(client: BrokerClient) -> None:
    """tx-1: a half message on ``orders``, then a oneway COMMIT, answered and applied."""
    client.create_topic("orders", queues=1)
    client.send_half(Message("orders", b"paid"), producer_group="shop", transaction_id="tx-1")
    answer = client.start_end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
    assert answer.result(10).applied


def test_a_lone_oneway_end_is_answered_once_the_servers_own_fsync_covers_it(
        thread_server: Callable[..., ThreadServer]) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        _half_then_oneway_commit(client)
        # answered: durable and visible, with no other write to carry it
        assert not server.broker.unsynced
        assert server.broker.transaction_state("tx-1") is TransactionState.COMMITTED
        assert [r.message.body for r in client.receive("points", "orders", wait_s=0)] == [b"paid"]


def test_oneway_ends_and_the_next_halves_of_a_sequential_producer_all_land(
        thread_server: Callable[..., ThreadServer]) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        client.create_topic("orders", queues=2)
        ends = []
        for n in range(50):  # each END followed at once by the next call's half, as a decorator does
            client.send_half(Message("orders", b"%d" % n), producer_group="shop", transaction_id=f"tx-{n}")
            resolution = Resolution.ROLLBACK if n % 5 == 0 else Resolution.COMMIT
            ends.append(client.start_end_transaction(f"tx-{n}", resolution, producer_group="shop", oneway=True))
        assert all(end.result(10).applied for end in ends)
        states = {n: server.broker.transaction_state(f"tx-{n}") for n in range(50)}
    assert states == {n: TransactionState.ROLLED_BACK if n % 5 == 0 else TransactionState.COMMITTED
                      for n in range(50)}


def test_a_repeated_oneway_end_is_answered_as_a_repeat(thread_server: Callable[..., ThreadServer]) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        _half_then_oneway_commit(client)
        again = client.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
        assert not again.applied and again.state is TransactionState.COMMITTED
    assert server.broker.transaction_state("tx-1") is TransactionState.COMMITTED


@pytest.mark.parametrize("oneway", ["yes", 1, None])
def test_a_oneway_that_is_not_a_bool_is_refused_and_stores_nothing(
        thread_server: Callable[..., ThreadServer], oneway: object) -> None:
    server = thread_server()
    with BrokerClient(server.url) as client:
        client.create_topic("orders", queues=1)
        client.send_half(Message("orders", b"paid"), producer_group="shop", transaction_id="tx-1")
        with pytest.raises(MalformedFrameError):
            client._request(RequestCode.END_TRANSACTION, {
                "transaction_id": "tx-1", "resolution": "COMMIT", "producer_group": "shop", "oneway": oneway})
        assert server.broker.transaction_state("tx-1") is TransactionState.PENDING
        assert client.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop").applied


def test_a_oneway_end_that_cannot_be_written_is_answered_with_an_error(
        thread_server: Callable[..., ThreadServer]) -> None:
    fs = PoisonedWrites()
    server = thread_server(BrokerConfig(store=StoreConfig(filesystem=fs)))
    with BrokerClient(server.url) as client:
        client.create_topic("orders", queues=1)
        client.send_half(Message("orders", POISON), producer_group="shop", transaction_id="tx-1")
        fs.armed = True  # the committed copy can never be written: the server's own flush drops the END
        answer = client.start_end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
        with pytest.raises(BrokerError, match="dropped"):
            answer.result(10)
        assert server.broker.transaction_state("tx-1") is TransactionState.PENDING
        assert client.send(Message("orders", b"next")).queue_offset == 0
        fs.armed = False
        assert client.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop").applied
        assert [r.message.body for r in client.receive("points", "orders", wait_s=0)] == [b"next", POISON]
