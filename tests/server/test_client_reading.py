"""Who reads the sync client's socket: a caller waiting for its own answer reads it while no
other thread does, the reader thread when no caller does. Every answer must reach its own
request, whoever reads it; check-backs and answers nobody waits for in a call must still
be read while the client is idle."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future

import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message, Resolution, SendResult
from broker_embedded.client.tcp import LINGER_S
from broker_embedded.errors import BrokerUnavailableError
from broker_embedded.message import CheckRequest

THREADS = 6
CALLS = 120


def test_threads_calling_at_once_each_get_their_own_answer(thread_server) -> None:
    """Calls that wait (sends) and calls that do not (half messages, their Futures awaited
    later) from several threads on one connection: each answer is its own request's, and
    nothing is answered twice or lost, whichever thread read it."""
    server = thread_server()
    client = BrokerClient(server.url, timeout_s=30)
    client.create_topic("mixed", 4)
    sent: dict[str, bytes] = {}
    halves_sent: set[str] = set()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def caller(number: int) -> None:
        try:
            halves: list[tuple[bytes, Future[SendResult]]] = []
            for call in range(CALLS):
                body = f"{number}-{call}".encode()
                if call % 3 == 2:
                    halves.append((body, client.start_send_half(Message("mixed", body), producer_group="pg",
                                                                transaction_id=f"t-{number}-{call}")))
                    continue
                result = client.send(Message("mixed", body))
                with lock:
                    sent[result.message_id] = body
            for _, half in halves:
                with lock:
                    halves_sent.add(half.result(30).message_id)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=caller, args=(number,)) for number in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)
    assert len(sent) + len(halves_sent) == THREADS * CALLS  # one distinct message id per request
    for message_id, body in sent.items():
        stored = client.query_by_id(message_id)
        assert stored is not None and stored.message.body == body
    assert len(client.open_transactions("pg")) == len(halves_sent)
    client.close()


def test_an_answer_nobody_waits_for_in_a_call_is_read_while_the_client_is_idle(thread_server) -> None:
    """A half message put on the wire without waiting, right after calls in a row (when
    the reader thread leaves the socket to the callers): its Future completes, and its
    done-callback runs, with no other call to read the answer."""
    server = thread_server()
    client = BrokerClient(server.url, timeout_s=30)
    for n in range(20):
        client.send(Message("busy", str(n).encode()))
    done = threading.Event()
    half = client.start_send_half(Message("orders", b"h"), producer_group="pg", transaction_id="t-idle")
    half.add_done_callback(lambda _: done.set())
    assert done.wait(10), "the answer of a call nobody waits for was never read"
    assert half.result(0).message_id
    client.end_transaction("t-idle", Resolution.COMMIT, producer_group="pg")
    client.close()


def test_a_check_back_pushed_while_the_client_is_idle_is_answered(thread_server) -> None:
    """After calls in a row, the client goes quiet: a check-back the broker pushes then is
    read (by the reader thread, from ``LINGER_S`` after the last call) and its callback
    settles the transaction."""
    server = thread_server(BrokerConfig(transaction_timeout_s=0.2, check_interval_s=0.2))
    client = BrokerClient(server.url, timeout_s=30)
    checked = threading.Event()

    def on_check(request: CheckRequest) -> None:
        client.end_transaction(request.transaction_id, Resolution.ROLLBACK, producer_group=request.producer_group,
                               from_check=True)
        checked.set()

    client.register_producer("pg", on_check)
    client.send_half(Message("orders", b"undecided"), producer_group="pg", transaction_id="t-check")
    for n in range(20):
        client.send(Message("busy", str(n).encode()))
    assert checked.wait(20), "a check-back pushed to an idle client was never read"
    assert client.open_transactions("pg") == []
    client.close()


def test_a_caller_reading_when_the_broker_goes_away_fails_and_the_next_call_reconnects(thread_server) -> None:
    """The broker closes the connection while a caller reads for its answer (a long poll):
    that call gets ``BrokerUnavailableError``, the others on the connection too, and the next
    call opens a new connection."""
    server = thread_server()
    client = BrokerClient(server.url, timeout_s=30)
    client.create_topic("quiet", 1)
    outcome: list[BaseException | object] = []
    poll = threading.Thread(target=lambda: _capture(outcome, lambda: client.receive("g", "quiet", wait_s=30)))
    poll.start()
    time.sleep(0.3 + LINGER_S)  # the long poll is the reader now
    server.loop.call_soon_threadsafe(lambda: [connection.drop() for connection in list(server.server._connections)])
    poll.join(20)
    assert not poll.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], BrokerUnavailableError), outcome
    assert client.send(Message("quiet", b"after")).message_id
    client.close()


def _capture(into: list[BaseException | object], call) -> None:  # type: ignore[no-untyped-def]
    try:
        into.append(call())
    except BaseException as exc:
        into.append(exc)


@pytest.mark.parametrize("calls", [1, 50])
def test_a_client_closed_after_calls_in_a_row_leaves_no_reader_behind(thread_server, calls: int) -> None:
    """Closing the client ends its reader thread whether it was reading or leaving the
    socket to the callers."""
    server = thread_server()
    before = {thread.ident for thread in threading.enumerate()}
    client = BrokerClient(server.url, timeout_s=30)
    for n in range(calls):
        client.send(Message("busy", str(n).encode()))
    client.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        readers = [thread for thread in threading.enumerate()
                   if thread.ident not in before and thread.name.startswith("broker-client-")]
        if not readers:
            return
        time.sleep(0.02)
    raise AssertionError(f"reader threads left: {readers}")


def _reader_of(future: Future[object]) -> list[str]:
    """The name of the thread that completes ``future``, once it does."""
    readers: list[str] = []
    future.add_done_callback(lambda _: readers.append(threading.current_thread().name))
    return readers


def test_an_answer_left_to_its_caller_is_read_by_it_and_an_end_on_the_way(thread_server) -> None:
    """A decorated call's shape: the half message put on the wire for its caller
    (``due=False``), waited for later with ``wait``, then a oneway END also left to a caller.
    The caller reads its half's answer in its own thread; the END's answer is read by the
    next call on its way; the reader thread reads neither."""
    server = thread_server()
    client = BrokerClient(server.url, timeout_s=30)
    client.create_topic("orders", 1)
    client.send(Message("orders", b"warm-up"))
    me = threading.current_thread().name
    ends: list[tuple[Future[object], list[str]]] = []
    for n in range(20):
        half = client.start_send_half(Message("orders", str(n).encode()), producer_group="pg",
                                      transaction_id=f"t-{n}", due=False)
        half_reader = _reader_of(half)  # type: ignore[arg-type]
        time.sleep(0.002)  # the local transaction: the answer arrives meanwhile, nobody reads it
        assert client.wait(half, 10)
        assert half.result(0).message_id and half_reader == [me]
        end = client.start_end_transaction(f"t-{n}", Resolution.COMMIT, producer_group="pg", oneway=True, due=False)
        ends.append((end, _reader_of(end)))  # type: ignore[arg-type]
    for end, reader in ends[:-1]:  # each read by the next call's wait
        assert end.done() and reader == [me], reader
    last, last_reader = ends[-1]
    assert client.wait(last, 10) and last_reader == [me]
    assert client.open_transactions("pg") == []
    client.close()


def test_an_answer_left_to_a_caller_that_never_waits_is_read_once_the_client_is_quiet(thread_server) -> None:
    """Nobody waits for a half left to its caller (the caller gave up): the reader thread
    reads it once the client has been quiet for ``LINGER_S``, so it never stays unread."""
    server = thread_server()
    client = BrokerClient(server.url, timeout_s=30)
    client.send(Message("orders", b"warm-up"))
    half = client.start_send_half(Message("orders", b"h"), producer_group="pg", transaction_id="t-left", due=False)
    reader = _reader_of(half)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not half.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert half.done(), "an answer left to a caller that never waited was never read"
    assert reader and reader[0].startswith("broker-client-"), reader
    client.end_transaction("t-left", Resolution.ROLLBACK, producer_group="pg")
    client.close()


def test_waiting_for_an_answer_whose_connection_dropped_fails_at_once() -> None:
    """The broker takes the half left to its caller and drops the connection without an
    answer: the caller's ``wait`` returns at once with the Future failed
    (``BrokerUnavailableError``), not at its timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def broker_that_drops() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)  # the half message's request
            time.sleep(0.2)  # the caller is waiting by then

    dropper = threading.Thread(target=broker_that_drops)
    dropper.start()
    client = BrokerClient(f"tcp://127.0.0.1:{port}", timeout_s=30)
    try:
        half = client.start_send_half(Message("orders", b"h"), producer_group="pg", transaction_id="t-drop",
                                      due=False)
        started = time.monotonic()
        assert client.wait(half, 20)
        assert time.monotonic() - started < 10
        assert isinstance(half.exception(0), BrokerUnavailableError)
    finally:
        client.close()
        dropper.join(10)
        listener.close()
