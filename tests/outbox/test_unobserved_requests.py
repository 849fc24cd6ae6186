"""A producer's requests over TCP end the same whether an instrumentation listener observes
them (the step runs in the caller's context, ended by a callback) or not (one ``Future``,
the step's error translation applied in the client's reader thread)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, Message, Resolution
from broker_embedded.errors import InvalidMessageError
from outbox import BrokerUnavailableError, Producer, instrumentation
from outbox.producer import END_NOT_SENT
from tests.outbox.async_support import tcp_broker
from tests.server.conftest import ServerProcess, ThreadServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


@contextlib.contextmanager
def observing(observed: bool, name: str) -> Iterator[list[str | None]]:
    """The outcomes of the operations ``name`` while a listener observes them (if ``observed``)."""
    outcomes: list[str | None] = []

    @contextlib.contextmanager
    def listener(operation: instrumentation.Operation) -> Iterator[None]:
        yield
        outcomes.append(operation.outcome)

    if observed:
        instrumentation.listen(name, listener)
    try:
        yield outcomes
    finally:
        instrumentation.remove(name, listener)


@pytest.mark.parametrize("observed", [False, True], ids=["unobserved", "observed"])
def test_a_refused_oneway_end_is_a_warning_and_counts_as_done(server: ThreadServer, observed: bool,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    producer = Producer(server.url, "shop")
    try:
        with observing(observed, instrumentation.END_TRANSACTION) as outcomes, caplog.at_level(logging.WARNING):
            producer.finish("never-started", Resolution.COMMIT)  # the broker knows no such transaction
            assert producer.flush(5)
    finally:
        producer.close()
    assert "END_TRANSACTION commit for never-started not delivered (UnknownTransactionError" in caplog.text
    assert "END_TRANSACTION failed" not in caplog.text
    assert outcomes == ([END_NOT_SENT] if observed else [])


@pytest.mark.parametrize("observed", [False, True], ids=["unobserved", "observed"])
def test_a_refused_half_fails_its_await_with_the_brokers_typed_error(server: ThreadServer, observed: bool) -> None:
    producer = Producer(server.url, "shop")
    halves = []
    try:
        with observing(observed, instrumentation.SEND_HALF):
            # raised by the await, or by start_half itself when the refusal is back already
            with pytest.raises(InvalidMessageError):
                halves.append(producer.start_half(Message("order.paid", b"{}", delay_level=99), "tx-refused"))
                producer.await_halves("tx-refused")
    finally:
        producer.close()
    assert all(isinstance(half.exception(), InvalidMessageError) for half in halves)


@pytest.mark.parametrize("observed", [False, True], ids=["unobserved", "observed"])
def test_a_half_on_a_lost_connection_fails_with_the_outboxs_error(tmp_path: Path, observed: bool) -> None:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()
    producer = Producer(BrokerClient(server.url, timeout_s=5), "shop")
    try:
        producer.broker.list_topics()  # connected
        server.kill()
        with observing(observed, instrumentation.SEND_HALF):
            with pytest.raises(BrokerUnavailableError, match="half message .* of transaction tx-lost not sent"):
                producer.start_half(Message("order.paid", b"{}"), "tx-lost")
                producer.await_halves("tx-lost")
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        producer.close()
