"""One trace from a Django request to the Django consumer: the request's span (as the
application's OpenTelemetry middleware makes it), the half send, the local transaction,
END, the delivery and the idempotent handler."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from outbox import tracing
from outbox.integrations.django.conf import producer
from outbox.integrations.django.transactional import transactional_message
from tests.django.shop.handlers import award_points
from tests.django.shop.models import Points
from tests.outbox.observability import consume

TOPIC = f"traced.{uuid.uuid4().hex}"
provider = TracerProvider()


def traced_requests(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """A SERVER span per request, as OpenTelemetry's Django instrumentation makes it."""
    tracer = provider.get_tracer("shop")

    def middleware(request: HttpRequest) -> HttpResponse:
        with tracer.start_as_current_span(f"{request.method} {request.path}", kind=SpanKind.SERVER):
            return get_response(request)

    return middleware


@transactional_message(topic=TOPIC, body=lambda name, amount: {"name": name, "amount": amount})
def pay(name: str, amount: int) -> None:
    """The business writes would be here."""


def pay_view(request: HttpRequest) -> HttpResponse:
    pay(request.POST["name"], int(request.POST["amount"]))
    return HttpResponse("paid")


urlpatterns = [path("pay/", pay_view)]


@pytest.fixture
def exporter(django_project: bool) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracing.install(tracer_provider=provider)
    yield exporter
    tracing.uninstall()
    exporter.clear()
    processor.shutdown()


@override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=[f"{__name__}.traced_requests"])
def test_one_trace_from_the_request_to_the_django_consumer(exporter: InMemorySpanExporter) -> None:
    Points.objects.filter(account="traced").delete()
    response = Client().post("/pay/", {"name": "traced", "amount": "7"})
    assert response.status_code == 200
    consume(producer().broker, "member", TOPIC, award_points,  # type: ignore[arg-type]
            until=lambda: Points.objects.filter(account="traced").exists())

    spans = exporter.get_finished_spans()
    ours = next(span for span in spans if span.name == f"send_half {TOPIC}").attributes["halfmoon.transaction_id"]
    # check-backs of other tests' transactions (the worker's producer is shared) may come meanwhile
    found = {span.name: span for span in spans if (span.attributes or {}).get("halfmoon.transaction_id", ours) == ours}
    view = found["POST /pay/"]
    strays = {name: span.context.trace_id for name, span in found.items() if span.context.trace_id != view.context.trace_id}
    assert not strays, f"spans outside the request's trace: {strays}"
    half, local, end = found[f"send_half {TOPIC}"], found["local_transaction"], found["end_transaction"]
    assert all(span.parent and span.parent.span_id == view.context.span_id for span in (half, local, end))
    delivery, handler = found[f"process {TOPIC}"], found[f"handle {TOPIC}"]
    assert delivery.parent and delivery.parent.span_id == half.context.span_id
    assert handler.parent and handler.parent.span_id == delivery.context.span_id
    assert local.attributes and local.attributes["halfmoon.outcome"] == "commit"
    assert delivery.attributes and delivery.attributes["messaging.consumer.group.name"] == "member"
