"""A write the server runs on its event loop is answered once its fsync returns, before
its records are dispatched (consume queues, index, transaction book), and every call of
the broker from another thread waits for that dispatch: the answer's follow-up finds what
it wrote, wherever it comes from.

Each test holds the dispatch in a dispatch listener until the test lets it go, so the
window between the answer and the dispatch is as long as the test needs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_embedded import BrokerClient, Message, Resolution, TransactionState
from broker_embedded.store.record import StoredRecord

from .conftest import ThreadServer


class HeldDispatch:
    """A dispatch listener that holds the server's loop thread's first dispatch after ``arm``
    until ``release``."""

    def __init__(self, server: ThreadServer) -> None:
        self.loop_thread = server.thread
        self.holding = threading.Event()
        self.released = threading.Event()
        self.armed = False
        server.broker.store.add_dispatch_listener(self)

    def __call__(self, records: list[StoredRecord]) -> None:
        if self.armed and threading.current_thread() is self.loop_thread:
            self.armed = False
            self.holding.set()
            assert self.released.wait(20), "the test never let the dispatch go"

    def arm(self) -> None:
        self.armed = True

    def release(self) -> None:
        self.released.set()


Held = tuple[ThreadServer, HeldDispatch, BrokerClient]


@pytest.fixture
def held(thread_server: Callable[..., ThreadServer]) -> Iterator[Held]:
    """A served broker with topic ``orders``, its first dispatch from now on held, and a client."""
    server = thread_server()
    holder = HeldDispatch(server)
    try:
        with BrokerClient(server.url, timeout_s=10) as client:
            client.create_topic("orders", queues=1)
            holder.arm()
            yield server, holder, client
    finally:
        holder.release()  # a failed test never leaves the loop thread waiting


def waiting_for_the_dispatch(holder: HeldDispatch, *calls: Callable[[], Any]) -> list[Any]:
    """Each of ``calls`` in a thread of its own while the loop thread holds the dispatch: none
    may return before ``release``; their results (or exceptions) after it, in order."""
    assert holder.holding.wait(10)  # the answer came first; the dispatch goes on now
    results: list[list[Any]] = [[] for _ in calls]

    def run(call: Callable[[], Any], out: list[Any]) -> None:
        try:
            out.append(call())
        except Exception as exc:  # reported by the test's assertion on the result
            out.append(exc)

    threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in zip(calls, results, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(0.3)
    assert all(thread.is_alive() for thread in threads), "a call went ahead of the dispatch"
    holder.release()
    for thread in threads:
        thread.join(10)
    return [out[0] for out in results]


def test_a_send_is_answered_before_its_dispatch_and_reads_from_other_threads_wait_for_it(
        held: Held) -> None:
    server, holder, client = held
    result = client.send(Message(topic="orders", body=b"paid", keys=("order-7",)))
    found, read = waiting_for_the_dispatch(
        holder, lambda: server.broker.query_by_id(result.message_id), lambda: server.broker.read("orders", 0, 0))
    assert found is not None and found.message.body == b"paid"
    assert [stored.message.body for stored in read] == [b"paid"]


def test_a_half_message_answered_is_in_the_transaction_book_for_every_thread_that_may_look(
        held: Held) -> None:
    server, holder, client = held
    client.send_half(Message(topic="orders", body=b"paid"), producer_group="shop", transaction_id="tx-1")
    state, ended = waiting_for_the_dispatch(
        holder, lambda: server.broker.transaction_state("tx-1"),
        lambda: server.broker.end_transaction("tx-1", Resolution.COMMIT, producer_group="shop"))
    assert state in (TransactionState.PENDING, TransactionState.COMMITTED)
    assert not isinstance(ended, Exception), ended
    assert ended.state is TransactionState.COMMITTED
    assert [stored.message.body for stored in server.broker.read("orders", 0, 0)] == [b"paid"]


def test_the_same_connections_next_request_finds_the_dispatched_records(
        held: Held) -> None:
    _, holder, client = held
    client.send_half(Message(topic="orders", body=b"paid"), producer_group="shop", transaction_id="tx-2")
    assert holder.holding.wait(10)
    holder.release()  # the loop dispatches, then reads the END
    ended = client.end_transaction("tx-2", Resolution.COMMIT, producer_group="shop")
    assert ended.state is TransactionState.COMMITTED
    assert [m.message.body for m in client.receive("billing", "orders", wait_s=5)] == [b"paid"]


def test_whether_a_write_is_synced_and_the_queues_ends_wait_for_the_dispatch_too(held: Held) -> None:
    """``unsynced`` and ``list_topics`` read what the end of the sync and the dispatch set:
    from another thread they wait for them (before, a lone oneway END answered as durable
    could still read as unsynced)."""
    server, holder, client = held
    client.send(Message(topic="orders", body=b"paid"))
    unsynced, topics = waiting_for_the_dispatch(holder, lambda: server.broker.unsynced, server.broker.list_topics)
    assert unsynced is False
    assert [(topic.name, topic.depth) for topic in topics if topic.name == "orders"] == [("orders", (1,))]
