"""OpenTelemetry tracing through the broker: one trace from the request that sent a
message to the consumer's handler, check-backs that continue it, and nothing added or
broken without tracing or with a garbage ``traceparent``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer
from sqlalchemy.orm import Session, sessionmaker

from broker_embedded import (
    CheckRequest,
    EmbeddedBroker,
    Message,
    ReceivedMessage,
    Resolution,
    TransactionState,
)
from outbox import Producer, check_transaction, idempotent_consumer, tracing, transactional_message
from outbox.instrumentation import CONTEXT_PROPERTIES
from outbox.integrations.celery import register
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.check_back import CONTEXT_HEADER, broker_client
from outbox.integrations.celery.checker import CeleryChecker
from outbox.producer import TRANSACTION_ID_PROPERTY
from outbox.settings import OutboxSettings
from tests.outbox.observability import consume, orders, wait_for


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    yield provider
    provider.shutdown()


@pytest.fixture
def exporter(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """The spans of the outbox, traced with ``provider``."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(tracer_provider=provider)
    yield exporter
    tracing.uninstall()


@pytest.fixture
def tracer(provider: TracerProvider) -> Tracer:
    """The application's own tracer (its web framework's spans)."""
    return provider.get_tracer("shop")


def spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The finished spans by name (each name once)."""
    finished = exporter.get_finished_spans()
    by_name = {span.name: span for span in finished}
    assert len(by_name) == len(finished), [span.name for span in finished]
    return by_name


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def test_one_trace_from_the_request_to_the_handler(exporter: InMemorySpanExporter, tracer: Tracer,
                                                   shop_sessions: sessionmaker[Session],
                                                   broker: EmbeddedBroker) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, shop_sessions, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        session.execute(orders.insert().values(id=order_id, amount=100))

    handled: list[ReceivedMessage] = []

    @idempotent_consumer("points", shop_sessions)
    def award(session: Session, received: ReceivedMessage) -> None:
        handled.append(received)

    with tracer.start_as_current_span("POST /pay", kind=SpanKind.SERVER):
        pay("o1")
    consume(broker, "points", "order.paid", award, until=lambda: handled)

    found = spans(exporter)
    view, half, local, end = (found["POST /pay"], found["send_half order.paid"], found["local_transaction"],
                              found["end_transaction"])
    delivery, handler = found["process order.paid"], found["handle order.paid"]
    assert {span.context.trace_id for span in found.values()} == {view.context.trace_id}
    assert parent_of(half) == parent_of(local) == parent_of(end) == view.context.span_id
    assert parent_of(delivery) == half.context.span_id  # the context the message carried
    assert parent_of(handler) == delivery.context.span_id
    assert [half.kind, local.kind, end.kind, delivery.kind, handler.kind] == [
        SpanKind.PRODUCER, SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.CONSUMER, SpanKind.INTERNAL]

    [received] = handled
    transaction_id = received.transaction_id
    assert half.attributes == {
        "messaging.system": "halfmoon", "messaging.destination.name": "order.paid",
        "messaging.message.id": received.message.message_id, "messaging.message.body.size": len(received.message.body),
        "messaging.operation.type": "send", "messaging.operation.name": "send_half",
        "halfmoon.producer_group": "shop", "halfmoon.transaction_id": transaction_id,
    }
    assert local.attributes is not None and local.attributes["halfmoon.outcome"] == "commit"
    assert end.attributes is not None and end.attributes["halfmoon.resolution"] == "commit"
    assert delivery.attributes is not None
    assert delivery.attributes["messaging.consumer.group.name"] == "points"
    assert delivery.attributes["halfmoon.outcome"] == "handled"
    assert set(received.message.properties) == {"traceparent"}  # no tracestate was set
    assert received.message.properties["traceparent"].split("-")[2] == format(half.context.span_id, "016x")


def test_a_failed_local_transaction_is_an_error_span(exporter: InMemorySpanExporter,
                                                     shop_sessions: sessionmaker[Session],
                                                     broker: EmbeddedBroker) -> None:
    @transactional_message(Producer(broker, "shop"), shop_sessions, topic="order.paid")
    def pay(session: Session) -> None:
        raise ValueError("declined")

    with pytest.raises(ValueError):
        pay()
    found = spans(exporter)
    assert found["local_transaction"].attributes == {
        "halfmoon.producer_group": "shop", "halfmoon.outcome": "rollback",
        "halfmoon.transaction_id": found["send_half order.paid"].attributes["halfmoon.transaction_id"],  # type: ignore[index]
    }
    assert found["end_transaction"].attributes["halfmoon.resolution"] == "rollback"  # type: ignore[index]


def test_a_check_back_continues_the_original_trace(exporter: InMemorySpanExporter, tracer: Tracer,
                                                   shop_sessions: sessionmaker[Session],
                                                   checking_broker: EmbeddedBroker) -> None:
    """The producer sent the half message and died before its local transaction: the
    check-back, answered in process, is a child of the half send in the same trace."""
    engine = shop_sessions.kw["bind"]

    class Checker:
        def execute_local_transaction(self, message: Message, arg: object) -> Resolution:
            raise AssertionError("not used")

        def check_local_transaction(self, message: Message) -> Resolution:
            return check_transaction(engine, message.properties[TRANSACTION_ID_PROPERTY], "shop")

    with tracer.start_as_current_span("POST /pay"):
        Producer(checking_broker, "shop").send_half(Message("order.paid", b"{}"), "tx-orphan")
    Producer(checking_broker, "shop").register_check_listener(Checker())
    wait_for(lambda: checking_broker.transaction_state("tx-orphan") is TransactionState.ROLLED_BACK,
             "the check-back's ROLLBACK")
    wait_for(lambda: "end_transaction" in {span.name for span in exporter.get_finished_spans()}, "its span")

    found = spans(exporter)
    half, check, end = found["send_half order.paid"], found["check_back"], found["end_transaction"]
    assert check.context.trace_id == half.context.trace_id == found["POST /pay"].context.trace_id
    assert parent_of(check) == half.context.span_id and check.kind is SpanKind.CONSUMER
    assert parent_of(end) == check.context.span_id
    assert check.attributes is not None and check.attributes["halfmoon.outcome"] == "rollback"
    assert end.attributes is not None and end.attributes["halfmoon.from_check"] is True


def test_the_celery_check_task_continues_the_trace_its_header_carries(
        exporter: InMemorySpanExporter, tracer: Tracer, tmp_path: Path) -> None:
    url = f"embedded://{tmp_path / 'broker'}"
    with tracer.start_as_current_span("POST /pay") as view:
        carrier: dict[str, str] = {}
        inject(carrier)
    message = Message("order.paid", b"{}", properties={**carrier, "source": "shop"})
    app = make_app(OutboxSettings(celery_data_dir=tmp_path / "celery"))
    assert CeleryChecker(app).request_check(CheckRequest("shop", "tx-1", message, 1))
    [queued] = (tmp_path / "celery" / "queue").iterdir()
    assert f'"{CONTEXT_HEADER}": {{"traceparent": "{carrier["traceparent"]}"}}' in queued.read_text()

    broker = broker_client(url)
    try:
        broker.send_half(message, producer_group="shop", transaction_id="tx-1")
        task = register(Celery("user"), answer=lambda transaction_id, group: Resolution.COMMIT,
                        settings=OutboxSettings(broker_url=url))
        task.apply(args=["shop", "tx-1", message.message_id], headers={CONTEXT_HEADER: carrier})
        assert broker.transaction_state("tx-1") is TransactionState.COMMITTED
    finally:
        broker.close()
        broker_client.cache_clear()
    found = spans(exporter)
    check, end = found["check_back"], found["end_transaction"]
    assert check.context.trace_id == view.get_span_context().trace_id
    assert parent_of(check) == view.get_span_context().span_id
    assert parent_of(end) == check.context.span_id
    assert check.attributes is not None and check.attributes["halfmoon.outcome"] == "commit"
    assert end.attributes is not None and end.attributes["halfmoon.outcome"] == "sent"


def test_without_tracing_no_property_is_added(shop_sessions: sessionmaker[Session], broker: EmbeddedBroker) -> None:
    @transactional_message(Producer(broker, "shop"), shop_sessions, topic="order.paid", properties={"source": "shop"})
    def pay(session: Session) -> None:
        session.execute(orders.insert().values(id="o1", amount=1))

    pay()
    [received] = broker.receive("points", "order.paid", wait_s=2)
    assert received.message.properties == {"source": "shop"}


def test_the_applications_own_traceparent_wins(exporter: InMemorySpanExporter, broker: EmbeddedBroker) -> None:
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    Producer(broker, "shop").send(Message("order.paid", b"{}", properties={"traceparent": own}))
    [received] = broker.receive("points", "order.paid", wait_s=2)
    assert received.message.properties == {"traceparent": own}
    assert spans(exporter)["send order.paid"].kind is SpanKind.PRODUCER


@pytest.mark.parametrize("garbage", ["garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-xyz-\u00e9-01"])
def test_a_garbage_traceparent_is_handled_in_a_trace_of_its_own(
        exporter: InMemorySpanExporter, shop_sessions: sessionmaker[Session], broker: EmbeddedBroker,
        garbage: str) -> None:
    handled: list[str] = []

    @idempotent_consumer("points", shop_sessions)
    def award(session: Session, received: ReceivedMessage) -> None:
        handled.append(received.message.message_id)

    broker.send(Message("order.paid", b"{}", message_id="m1",
                        properties={name: garbage for name in CONTEXT_PROPERTIES}))
    consume(broker, "points", "order.paid", award, until=lambda: handled)
    found = spans(exporter)
    assert found["process order.paid"].parent is None  # a new trace
    assert found["process order.paid"].attributes["halfmoon.outcome"] == "handled"  # type: ignore[index]
    assert parent_of(found["handle order.paid"]) == found["process order.paid"].context.span_id
