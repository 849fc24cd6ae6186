"""OpenTelemetry tracing of the outbox (the ``tracing`` extra: ``pip install
"halfmoon[tracing]"``; the application brings the SDK and its exporter).

    from outbox import tracing
    tracing.install()                            # the global tracer provider
    tracing.install(tracer_provider=provider)    # or a given one

Spans follow OpenTelemetry's messaging conventions (``messaging.system = "halfmoon"``):
the half send (PRODUCER), the local transaction (INTERNAL), END_TRANSACTION (CLIENT, a
"settle"), the check-back (CONSUMER), the delivery (CONSUMER, "process") and the
idempotent consumer's handler (INTERNAL). The caller's W3C trace context travels in the
message properties ``traceparent`` and ``tracestate``
(``outbox.instrumentation.CONTEXT_PROPERTIES``), so the delivery and a check-back continue
the trace of the request that sent the message. A message without them, or with values
that do not parse, starts a trace of its own. Details: docs/observability.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from broker_embedded import Message, ReceivedMessage

from . import instrumentation
from .errors import missing_extra

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ModuleNotFoundError as exc:
    raise missing_extra("outbox.tracing", "tracing", exc) from exc

#: ``messaging.system`` of every span.
SYSTEM = "halfmoon"
#: The instrumentation scope's name.
TRACER_NAME = "outbox"

_propagator = TraceContextTextMapPropagator()


def _parent(carrier: Mapping[str, str]) -> Context | None:
    """The context a message carries, or None (the current one) if it carries none valid."""
    context = _propagator.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _message_attributes(message: Message) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": message.topic,
        "messaging.message.id": message.message_id,
        "messaging.message.body.size": len(message.body),
    }


@contextlib.contextmanager
def _ended(span: Span, operation: instrumentation.Operation) -> Iterator[None]:
    """End ``span`` with the operation: its outcome as ``halfmoon.outcome``, an error as ERROR."""
    try:
        yield
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        if operation.outcome is not None:
            span.set_attribute("halfmoon.outcome", operation.outcome)
        span.end()


class OutboxTracing(instrumentation.Subscriber):
    """The outbox's spans, made by ``tracer`` from instrumentation events."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def listeners(self) -> dict[str, Callable[..., Any]]:
        return {
            instrumentation.SEND: self._on_send,
            instrumentation.SEND_HALF: self._on_send,
            instrumentation.LOCAL_TRANSACTION: self._on_local_transaction,
            instrumentation.END_TRANSACTION: self._on_end_transaction,
            instrumentation.CHECK_BACK: self._on_check_back,
            instrumentation.DELIVERY: self._on_delivery,
            instrumentation.HANDLER: self._on_handler,
            instrumentation.TRANSACTION_FENCED: self._on_fenced,
            instrumentation.DUPLICATE_SKIPPED: self._on_duplicate,
        }

    @contextlib.contextmanager
    def _span(self, operation: instrumentation.Operation, name: str, kind: SpanKind, attributes: dict[str, Any],
              parent: Context | None = None, current: bool = True) -> Iterator[Span]:
        """A span for ``operation``, ended with it; made the current span unless ``current``
        is False (an operation that may end in another scope than it began)."""
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        with _ended(span, operation):
            if current:
                with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                    yield span
            else:
                yield span

    @contextlib.contextmanager
    def _on_send(self, operation: instrumentation.Operation) -> Iterator[None]:
        attributes = operation.attributes
        message: Message = attributes["message"]
        transaction_id = attributes.get("transaction_id")
        name = operation.name
        with self._span(operation, f"{name} {message.topic}", SpanKind.PRODUCER, {
            **_message_attributes(message), "messaging.operation.type": "send", "messaging.operation.name": name,
            "halfmoon.producer_group": attributes["producer_group"],
            **({"halfmoon.transaction_id": transaction_id} if transaction_id else {}),
        }):
            _propagator.inject(operation.message_properties)
            yield

    def _on_local_transaction(self, operation: instrumentation.Operation) -> contextlib.AbstractContextManager[Any]:
        attributes = operation.attributes
        return self._span(operation, "local_transaction", SpanKind.INTERNAL, {
            "halfmoon.producer_group": attributes["producer_group"],
            "halfmoon.transaction_id": attributes["transaction_id"],
        }, current=False)  # the session hook's transaction ends in an event, wherever it is

    def _on_end_transaction(self, operation: instrumentation.Operation) -> contextlib.AbstractContextManager[Any]:
        attributes = operation.attributes
        return self._span(operation, "end_transaction", SpanKind.CLIENT, {
            "messaging.system": SYSTEM, "messaging.operation.type": "settle",
            "messaging.operation.name": "end_transaction",
            "halfmoon.producer_group": attributes["producer_group"],
            "halfmoon.transaction_id": attributes["transaction_id"],
            "halfmoon.resolution": attributes["resolution"].value,
            "halfmoon.from_check": attributes["from_check"],
        })

    def _on_check_back(self, operation: instrumentation.Operation) -> contextlib.AbstractContextManager[Any]:
        attributes = operation.attributes
        message_id = attributes.get("message_id")
        return self._span(operation, "check_back", SpanKind.CONSUMER, {
            "messaging.system": SYSTEM, "messaging.operation.type": "process",
            "messaging.operation.name": "check_back",
            "halfmoon.producer_group": attributes["producer_group"],
            "halfmoon.transaction_id": attributes["transaction_id"],
            **({"messaging.message.id": message_id} if message_id else {}),
        }, parent=_parent(attributes["context"]))

    def _on_delivery(self, operation: instrumentation.Operation) -> contextlib.AbstractContextManager[Any]:
        received: ReceivedMessage = operation.attributes["received"]
        return self._span(operation, f"process {received.message.topic}", SpanKind.CONSUMER, {
            **_message_attributes(received.message), "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": operation.attributes["consumer_group"],
            "halfmoon.delivery_attempt": received.delivery_attempt,
            **({"halfmoon.transaction_id": received.transaction_id} if received.transaction_id else {}),
        }, parent=_parent(received.message.properties))

    def _on_handler(self, operation: instrumentation.Operation) -> contextlib.AbstractContextManager[Any]:
        received: ReceivedMessage = operation.attributes["received"]
        # Under the delivery's span; a handler called by the application's own loop
        # continues the message's trace instead.
        inside = trace.get_current_span().get_span_context().is_valid
        return self._span(operation, f"handle {received.message.topic}", SpanKind.INTERNAL, {
            "messaging.system": SYSTEM, "messaging.message.id": received.message.message_id,
            "messaging.consumer.group.name": operation.attributes["consumer_group"],
        }, parent=None if inside else _parent(received.message.properties))

    def _on_fenced(self, producer_group: str, transaction_id: str) -> None:
        trace.get_current_span().add_event("transaction fenced", {
            "halfmoon.producer_group": producer_group, "halfmoon.transaction_id": transaction_id})

    def _on_duplicate(self, consumer_group: str, received: ReceivedMessage) -> None:
        trace.get_current_span().add_event("duplicate skipped", {
            "messaging.consumer.group.name": consumer_group, "messaging.message.id": received.message.message_id})


_installed: OutboxTracing | None = None
_lock = threading.Lock()


def install(tracer_provider: TracerProvider | None = None) -> OutboxTracing:
    """Trace the outbox with ``tracer_provider`` (default: the global one); installing
    again replaces the provider."""
    global _installed
    with _lock:
        if _installed is not None:
            _installed.remove()
        _installed = OutboxTracing(trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider))
        _installed.listen()
        return _installed


def uninstall() -> None:
    """Stop tracing the outbox (messages no longer carry a trace context)."""
    global _installed
    with _lock:
        if _installed is not None:
            _installed.remove()
            _installed = None
