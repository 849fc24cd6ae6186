"""One broker round trip at most per ``@transactional_message`` call over TCP: the half
message leaves before BEGIN and is awaited just before COMMIT, and the END after the
commit does not hold the caller (``oneway_end``), yet is delivered even by a process that
exits right after the call."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, event, select
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import BrokerClient, Message, TransactionState
from outbox import (
    BrokerUnavailableError,
    Producer,
    install,
    instrumentation,
    send,
    transactional_message,
)
from outbox.integrations.sqlalchemy.session import current_transaction_id
from outbox.integrations.sqlalchemy.tables import transaction_log
from tests.outbox.async_support import tcp_broker
from tests.server.conftest import ServerProcess, ThreadServer

ROOT = Path(__file__).resolve().parents[2]
shop = MetaData()
orders = Table("orders", shop, Column("id", String(32), primary_key=True), Column("amount", Integer))


@contextlib.contextmanager
def listening(name: str, listener: object) -> Iterator[None]:
    instrumentation.listen(name, listener)  # type: ignore[arg-type]
    try:
        yield
    finally:
        instrumentation.remove(name, listener)  # type: ignore[arg-type]


def recorder(timeline: list[str], started: str, ended: str) -> object:
    """An operation listener noting when the operation starts and ends."""

    @contextlib.contextmanager
    def record(operation: instrumentation.Operation) -> Iterator[None]:
        timeline.append(started)
        yield
        timeline.append(ended)

    return record


def hold(server: ThreadServer) -> threading.Event:
    """Stop the server's event loop (it reads and answers nothing) until the returned event
    is set, or 5 s pass."""
    held, release = threading.Event(), threading.Event()

    def wait() -> None:
        held.set()
        release.wait(5)

    server.loop.call_soon_threadsafe(wait)
    assert held.wait(5)
    return release


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    server = tcp_broker(tmp_path / "broker")
    yield server
    server.stop()


def test_the_half_leaves_before_begin_and_is_awaited_just_before_commit(engine: Engine, server) -> None:
    shop.create_all(engine)
    timeline: list[str] = []
    event.listen(engine, "begin", lambda conn: timeline.append("BEGIN"))
    event.listen(engine, "commit", lambda conn: timeline.append("COMMIT"))
    producer = Producer(server.url, "shop")

    @transactional_message(producer, sessionmaker(engine), topic="order.paid")
    def pay(session: Session, order_id: str) -> str:
        session.execute(orders.insert().values(id=order_id, amount=1))
        timeline.append("function")
        release.set()  # the broker answers the half from now on
        return current_transaction_id(session) or ""

    with listening(instrumentation.SEND_HALF, recorder(timeline, "half sent", "half acknowledged")):
        release = hold(server)
        transaction_id = pay("o1")
    assert timeline == ["half sent", "BEGIN", "function", "half acknowledged", "COMMIT"]
    assert producer.flush()
    assert server.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    producer.close()


@pytest.mark.parametrize("oneway_end", [None, False], ids=["default", "waited"])
def test_the_end_holds_the_caller_only_without_oneway_end(engine: Engine, server, oneway_end: bool | None) -> None:
    shop.create_all(engine)
    ends: list[str] = []
    producer = Producer(server.url, "shop") if oneway_end is None else Producer(server.url, "shop", oneway_end=False)
    release = threading.Event()

    @transactional_message(producer, sessionmaker(engine), topic="order.paid")
    def pay(session: Session, order_id: str) -> str:
        session.execute(orders.insert().values(id=order_id, amount=1))
        return current_transaction_id(session) or ""

    def hold_the_broker(conn: object) -> None:
        nonlocal release
        release = hold(server)

    event.listen(engine, "commit", hold_the_broker)  # after the half's acknowledgment, before END
    with listening(instrumentation.END_TRANSACTION, recorder(ends, "END sent", "END answered")):
        transaction_id = pay("o1")
        if oneway_end is None:
            assert ends == ["END sent"]  # the call returned while the broker had not read it
            assert server.broker.transaction_state(transaction_id) is TransactionState.PENDING
            release.set()
            assert producer.flush(10)
        assert ends == ["END sent", "END answered"]
    release.set()
    assert server.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    producer.close()


@pytest.mark.parametrize("sender", ["decorator", "session hook"])
def test_broker_killed_between_begin_and_commit_commits_nothing_and_raises(engine: Engine, tmp_path: Path,
                                                                          sender: str) -> None:
    shop.create_all(engine)
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()
    producer = Producer(BrokerClient(server.url, timeout_s=5), "shop")
    factory = sessionmaker(engine)
    install(factory, producer)  # connects
    ran = []

    def business(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))
        ran.append(order_id)
        server.kill()  # the half message was never read: it has no acknowledgment

    def hook(order_id: str) -> None:
        with factory.begin() as session:
            send(session, Message("order.paid", b"{}"))
            business(session, order_id)

    pay = transactional_message(producer, factory, topic="order.paid")(business) if sender == "decorator" else hook
    try:
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        with pytest.raises(BrokerUnavailableError):
            pay("o1")
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        producer.close()
    assert ran == ["o1"]  # the function ran while the half message was on its way
    with engine.connect() as conn:
        assert conn.execute(select(orders)).all() == []
        assert conn.execute(select(transaction_log)).all() == []


def test_a_process_exiting_right_after_a_call_delivers_its_end(db_url: str, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()  # no check-back
    try:
        done = subprocess.run([sys.executable, "-m", "tests.outbox.exit_after_call", "sqlalchemy", server.url, db_url],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with BrokerClient(server.url) as client:
            assert client.transaction_state(done.stdout.strip()) is TransactionState.COMMITTED
    finally:
        server.kill()


def test_a_half_not_acknowledged_in_time_rolls_back_and_is_rolled_back_at_the_broker(
        engine: Engine, tmp_path: Path) -> None:
    shop.create_all(engine)
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "3600").start()  # no check-back
    producer = Producer(BrokerClient(server.url, timeout_s=1), "shop")
    transaction_ids = []
    try:
        @transactional_message(producer, sessionmaker(engine), topic="order.paid")  # connects
        def pay(session: Session, order_id: str) -> None:
            session.execute(orders.insert().values(id=order_id, amount=1))
            transaction_ids.append(current_transaction_id(session) or "")

        assert server.proc is not None
        pid = server.proc.pid
        os.kill(pid, signal.SIGSTOP)  # reads nothing, answers nothing
        resume = lambda session: os.kill(pid, signal.SIGCONT)  # noqa: E731
        event.listen(Session, "after_rollback", resume, insert=True)  # before the outbox's ROLLBACK
        try:
            with pytest.raises(BrokerUnavailableError, match="not acknowledged"):
                pay("o1")
        finally:
            event.remove(Session, "after_rollback", resume)
        assert producer.flush(10)  # the ROLLBACK, sent once the half was answered
        with BrokerClient(server.url) as client:
            assert client.transaction_state(transaction_ids[0]) is TransactionState.ROLLED_BACK
    finally:
        server.kill()
        producer.close()
    with engine.connect() as conn:
        assert conn.execute(select(orders)).all() == []


def test_the_overlapping_half_and_the_oneway_end_are_spans_of_the_callers_trace(engine: Engine, server) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from outbox import tracing

    shop.create_all(engine)
    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("shop")
    tracing.install(tracer_provider=provider)
    producer = Producer(server.url, "shop")
    try:
        @transactional_message(producer, sessionmaker(engine), topic="order.paid")
        def pay(session: Session, order_id: str) -> None:
            with tracer.start_as_current_span("business"):
                session.execute(orders.insert().values(id=order_id, amount=1))

        with tracer.start_as_current_span("POST /pay") as view:
            pay("o1")
        assert producer.flush(10)
    finally:
        tracing.uninstall()
        producer.close()
    found = {span.name: span for span in exporter.get_finished_spans()}
    parents = {name: span.parent.span_id if span.parent else None for name, span in found.items()}
    assert parents == {"send_half order.paid": view.get_span_context().span_id,
                       "business": view.get_span_context().span_id,  # not under the half's span
                       "local_transaction": view.get_span_context().span_id,
                       "end_transaction": view.get_span_context().span_id, "POST /pay": None}
    assert found["end_transaction"].attributes is not None
    assert found["end_transaction"].attributes["halfmoon.outcome"] == "sent"
    provider.shutdown()


def test_without_overlap_the_half_is_acknowledged_before_the_function_runs(engine: Engine, server) -> None:
    shop.create_all(engine)
    timeline: list[str] = []
    producer = Producer(server.url, "shop")

    @transactional_message(producer, sessionmaker(engine), topic="order.paid", overlap=False)
    def pay(session: Session, order_id: str) -> str:
        timeline.append("function")
        return current_transaction_id(session) or ""

    with listening(instrumentation.SEND_HALF, recorder(timeline, "half sent", "half acknowledged")):
        with sessionmaker(engine)() as session, session.begin():  # joined, then a call of its own
            pay(session, "o1")
        transaction_id = pay("o2")
    assert timeline == ["half sent", "half acknowledged", "function"] * 2
    assert producer.flush(10)
    assert server.broker.transaction_state(transaction_id) is TransactionState.COMMITTED
    producer.close()


def test_an_unobserved_answer_is_done_when_its_done_callbacks_run_and_its_value_waits_for_nobody() -> None:
    """The producer's own ``Future`` of a half message or oneway END (``_Settled``) answers
    ``done()`` without its lock: a caller sleeping while another thread reads is woken by a
    done-callback and must find it done (else it naps ``_NAP_S`` more); its result, or the
    typed error its step makes of a failure, is there by then."""
    from outbox.producer import _Settled

    def typed(error: BaseException) -> None:
        raise BrokerUnavailableError(f"typed: {error}")

    seen: list[tuple[bool, object]] = []
    answered: _Settled[str] = _Settled(typed)
    answered.set_running_or_notify_cancel()
    answered.add_done_callback(lambda done: seen.append((done.done(), done.result(0))))
    assert not answered.done()
    answered.set_result("stored")
    failed: _Settled[str] = _Settled(typed)
    failed.set_running_or_notify_cancel()
    failed.add_done_callback(lambda done: seen.append((done.done(), type(done.exception(0)))))
    failed.set_exception(OSError("connection lost"))
    assert seen == [(True, "stored"), (True, BrokerUnavailableError)]
    assert answered.done() and failed.done()
