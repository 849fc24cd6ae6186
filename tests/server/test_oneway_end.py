"""A oneway END_TRANSACTION over TCP. While writes follow oneway ENDs within a millisecond
(a decorated call's END, then the next call's half message), each is written without an
fsync of its own and answered once an fsync covers it (the next write's, or the server's
own a millisecond later); a oneway END that nothing followed so closely is written at once,
as a waited one. Either way an answer means what a waited END's means (one that could not
be written is answered with an error); a hostile ``oneway`` value is refused and stores
nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message, Resolution, TransactionState
from broker_embedded.broker.writes import EndCall, HalfCall
from broker_embedded.errors import BrokerError, MalformedFrameError
from broker_embedded.server.tcp import DEFERRED_SYNC_S, UNFOLLOWED_ENDS, EndHolding
from broker_embedded.store.config import StoreConfig
from broker_embedded.topics import OP_HALF_TOPIC
from broker_embedded.wire.protocol import RequestCode
from tests.broker.test_oneway_end import POISON, PoisonedWrites

from .conftest import ThreadServer


class ManualClock:
    """The server's clock, moved by the test alone: whether a write follows a oneway END
    within a millisecond is then the test's choice, not the machine's."""

    def __init__(self) -> None:
        self.at = 0.0

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return self.at


def _end_holds(server: ThreadServer) -> list[bool]:
    """Records, for each write of END records the broker makes from now on, whether it held
    them for another write's fsync."""
    store = server.broker.store
    put_batch = store.put_batch
    holds: list[bool] = []

    def recording(records: Any, hold: bool = False, **options: Any) -> Any:
        if any(record.topic == OP_HALF_TOPIC for record in records):
            holds.append(hold)
        return put_batch(records, hold=hold, **options)

    store.put_batch = recording  # type: ignore[method-assign,assignment]
    return holds


def _half_then_oneway_commit(client: BrokerClient) -> None:
    """tx-1: a half message on ``orders``, then a oneway COMMIT, answered and applied."""
    client.create_topic("orders", queues=1)
    client.send_half(Message("orders", b"paid"), producer_group="shop", transaction_id="tx-1")
    answer = client.start_end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
    assert answer.result(10).applied


def test_a_lone_oneway_end_is_written_at_once_and_answered_durable(
        thread_server: Callable[..., ThreadServer]) -> None:
    server = thread_server()
    holds = _end_holds(server)
    with BrokerClient(server.url) as client:
        _half_then_oneway_commit(client)
        # answered: durable and visible, with no other write to carry it
        assert not server.broker.unsynced
        assert server.broker.transaction_state("tx-1") is TransactionState.COMMITTED
        assert [r.message.body for r in client.receive("points", "orders", wait_s=0)] == [b"paid"]
    assert holds == [False]  # nothing followed an END yet: not held for a write that may never come


def _held(holding: EndHolding, item: EndCall | HalfCall) -> bool:
    """Whether ``holding`` holds ``item``, which it passes on as it is."""
    admitted, held = holding.admit(item)
    assert admitted is item
    return held


def test_oneway_ends_are_held_while_writes_follow_them_then_written_at_once_again() -> None:
    clock = ManualClock()
    holding = EndHolding(clock.monotonic)

    def end(n: int) -> EndCall:
        return EndCall(f"tx-{n}", Resolution.COMMIT, "shop", oneway=True)

    def half(n: int) -> HalfCall:
        return HalfCall(Message("orders", b"%d" % n), "shop", f"tx-{n}")

    assert not _held(holding, half(1))
    item, held = holding.admit(end(1))  # nothing followed an END yet: written at once, as a waited one
    assert not held and item == msgspec.structs.replace(end(1), oneway=False)
    clock.at += DEFERRED_SYNC_S / 2
    assert not _held(holding, half(2))  # it could have carried tx-1's END: the next ones are held
    assert _held(holding, end(2))
    assert not _held(holding, half(3))  # written after it: its fsync covers the END
    for n in range(3, 3 + UNFOLLOWED_ENDS):  # misses, but one in between was followed by a write
        assert _held(holding, end(n))
        if n == 4:
            assert not _held(holding, half(n + 1))
        else:
            holding.unfollowed()
    assert holding.holding
    assert _held(holding, end(9))
    assert not _held(holding, half(10))
    for n in range(10, 10 + UNFOLLOWED_ENDS):  # lone calls: each held END synced alone before the next half
        clock.at += 0.01
        assert _held(holding, end(n))
        holding.unfollowed()
        assert not _held(holding, half(n + 1))  # too late to cover it: the misses stay in a row
    assert not holding.holding
    clock.at += 1.0
    assert not _held(holding, half(20))  # long after the last END written at once
    assert holding.admit(end(20))[1] is False
    clock.at += DEFERRED_SYNC_S * 2
    assert not _held(holding, half(21))  # too late to have carried it
    assert holding.admit(end(21))[1] is False and not holding.holding


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


@pytest.mark.parametrize("held", [True, False], ids=["held", "written at once"])
def test_a_oneway_end_that_cannot_be_written_is_answered_with_an_error(
        thread_server: Callable[..., ThreadServer], held: bool) -> None:
    fs = PoisonedWrites()
    server = thread_server(BrokerConfig(store=StoreConfig(filesystem=fs)), clock=ManualClock())
    holds = _end_holds(server)
    with BrokerClient(server.url) as client:
        client.create_topic("orders", queues=1)
        if held:  # a oneway END, then a write that follows it: the next oneway END is held
            client.send_half(Message("orders", b"0"), producer_group="shop", transaction_id="tx-0")
            client.start_end_transaction("tx-0", Resolution.ROLLBACK, producer_group="shop",
                                         oneway=True).result(10)
        client.send_half(Message("orders", POISON), producer_group="shop", transaction_id="tx-1")
        fs.armed = True  # the committed copy can never be written: the server's own flush drops the END
        answer = client.start_end_transaction("tx-1", Resolution.COMMIT, producer_group="shop", oneway=True)
        with pytest.raises(BrokerError, match="dropped" if held else "injected write error"):
            answer.result(10)
        assert holds[-1] is held
        assert server.broker.transaction_state("tx-1") is TransactionState.PENDING
        assert client.send(Message("orders", b"next")).queue_offset == 0
        fs.armed = False
        assert client.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop").applied
        assert [r.message.body for r in client.receive("points", "orders", wait_s=0)] == [b"next", POISON]
