"""Instrumentation points: the outbox announces what it does; listeners subscribe.

In the style of SQLAlchemy's event API (``listen``, ``remove``, ``contains``,
``listens_for``), and with no dependency: ``outbox.metrics`` and ``outbox.tracing`` are
listeners, and so can be yours. Two kinds of events:

* **operations** have a duration. A listener is called with the ``Operation`` when it
  starts and may return a context manager, entered at once and exited when the
  operation ends (with its exception, if any; ``operation.outcome`` is set by then)::

      @instrumentation.listens_for(instrumentation.SEND_HALF)
      @contextlib.contextmanager
      def timed(operation):
          start = time.perf_counter()
          yield
          print(operation.attributes["producer_group"], time.perf_counter() - start)

* **occurrences** happen at a point; a listener is called with keyword arguments::

      instrumentation.listen(instrumentation.ROWS_PURGED, lambda table, rows: ...)

The events and their attributes:

=====================  ====================================================  =========================
operation              attributes                                            outcome
=====================  ====================================================  =========================
``SEND``               producer_group, message                               --
``SEND_HALF``          producer_group, transaction_id, message               --
``LOCAL_TRANSACTION``  producer_group, transaction_id                        ``Resolution`` value
``END_TRANSACTION``    producer_group, transaction_id, resolution,           ``"sent"`` or
                       from_check                                            ``"not_sent"``
``CHECK_BACK``         producer_group, transaction_id, message_id,           ``Resolution`` value
                       context (the half message's ``CONTEXT_PROPERTIES``)
``DELIVERY``           consumer_group, received                              ``"handled"``,
                                                                             ``"skipped"``, ``"failed"``
``HANDLER``            consumer_group, received                              --
=====================  ====================================================  =========================

Occurrences: ``TRANSACTION_FENCED(producer_group, transaction_id)`` (a check-back's fence
made the local transaction roll back), ``DUPLICATE_SKIPPED(consumer_group, received)``
(the idempotent consumer found the message already consumed), ``ROWS_PURGED(table,
rows)`` (a purge deleted ``rows`` rows of ``table``), ``MESSAGES_STORED(producer_group,
transaction_id, count)`` (store mode wrote a transaction's messages to its database while
the broker was down), ``MESSAGES_RELAYED(producer_group, count)`` (the relay handed stored
messages to the broker), ``STORED_BACKLOG(producer_group, unrelayed, oldest_age_s)`` (what
still waits for the relay, as the relay last saw it; oldest_age_s is 0 with none).

A listener of ``SEND`` or ``SEND_HALF`` may add properties to the message being sent by
writing ``operation.message_properties`` (tracing adds ``CONTEXT_PROPERTIES`` there); the
application's own properties of the same name win.

Nobody listening costs one dictionary lookup per event (well under a microsecond with its
keyword arguments). A listener that raises is logged and ignored: observing never
changes what the outbox does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

import msgspec

from broker_embedded import Message

from .errors import OutboxError

log = logging.getLogger(__name__)

SEND = "send"
SEND_HALF = "send_half"
LOCAL_TRANSACTION = "local_transaction"
END_TRANSACTION = "end_transaction"
CHECK_BACK = "check_back"
DELIVERY = "delivery"
HANDLER = "handler"
#: Events with a duration: their listeners take the ``Operation``.
OPERATIONS = frozenset({SEND, SEND_HALF, LOCAL_TRANSACTION, END_TRANSACTION, CHECK_BACK, DELIVERY, HANDLER})

TRANSACTION_FENCED = "transaction_fenced"
DUPLICATE_SKIPPED = "duplicate_skipped"
ROWS_PURGED = "rows_purged"
MESSAGES_STORED = "messages_stored"
MESSAGES_RELAYED = "messages_relayed"
STORED_BACKLOG = "stored_backlog"
#: Events at a point: their listeners take keyword arguments.
OCCURRENCES = frozenset({TRANSACTION_FENCED, DUPLICATE_SKIPPED, ROWS_PURGED, MESSAGES_STORED, MESSAGES_RELAYED,
                         STORED_BACKLOG})

#: The message properties that carry the caller's context across the broker (W3C Trace
#: Context), added by ``outbox.tracing`` and forwarded with check-backs.
CONTEXT_PROPERTIES = ("traceparent", "tracestate")

OperationListener = Callable[["Operation"], AbstractContextManager[Any] | None]
L = TypeVar("L", bound=Callable[..., Any])


class UnknownEventError(OutboxError, ValueError):
    """An event name that is neither in ``OPERATIONS`` nor in ``OCCURRENCES``."""


_listeners: dict[str, tuple[Callable[..., Any], ...]] = {}
_lock = threading.Lock()


def _known(name: str) -> str:
    if name not in OPERATIONS and name not in OCCURRENCES:
        raise UnknownEventError(f"no outbox event {name!r}; the events are "
                                f"{sorted(OPERATIONS | OCCURRENCES)}")
    return name


def listen(name: str, listener: Callable[..., Any]) -> None:
    """Call ``listener`` on each event ``name`` (once, however often it is added)."""
    with _lock:
        current = _listeners.get(_known(name), ())
        if listener not in current:
            _listeners[name] = (*current, listener)


def remove(name: str, listener: Callable[..., Any]) -> None:
    """Stop calling ``listener`` on ``name``; nothing happens if it was not listening."""
    with _lock:
        remaining = tuple(known for known in _listeners.get(_known(name), ()) if known != listener)
        if remaining:
            _listeners[name] = remaining
        else:
            _listeners.pop(name, None)


def contains(name: str, listener: Callable[..., Any]) -> bool:
    """Whether ``listener`` listens to ``name``."""
    return listener in _listeners.get(_known(name), ())


def listens_for(name: str) -> Callable[[L], L]:
    """Decorator form of ``listen``."""

    def decorate(listener: L) -> L:
        listen(name, listener)
        return listener

    return decorate


class Subscriber:
    """A set of listeners added and removed together (the outbox's metrics, its tracing):
    ``listeners()`` names them by event."""

    def listeners(self) -> Mapping[str, Callable[..., Any]]:
        raise NotImplementedError

    def listen(self) -> None:
        """Start listening to every event of ``listeners()``."""
        for name, listener in self.listeners().items():
            listen(name, listener)

    def remove(self) -> None:
        """Stop listening."""
        for name, listener in self.listeners().items():
            remove(name, listener)


def announce(name: str, **attributes: Any) -> None:
    """An occurrence: call each listener of ``name`` with ``attributes``."""
    for listener in _listeners.get(name, ()):
        try:
            listener(**attributes)
        except Exception:
            log.exception("listener %r of %s failed", listener, name)


class Operation:
    """One operation under way, as its listeners see it; ends on leaving its ``with``
    block or on ``end()`` (for an operation that ends in another scope than it began)."""

    __slots__ = ("name", "attributes", "message_properties", "outcome", "_managers")

    def __init__(self, name: str, attributes: dict[str, Any], listeners: tuple[OperationListener, ...]) -> None:
        self.name = name
        self.attributes = attributes
        #: Properties listeners add to the message being sent (``SEND`` and ``SEND_HALF``).
        self.message_properties: dict[str, str] = {}
        #: How it ended, set by the outbox before it ends (see the module's table).
        self.outcome: str | None = None
        self._managers: list[AbstractContextManager[Any]] = []
        for listener in listeners:
            try:
                manager = listener(self)
                if manager is not None:
                    manager.__enter__()
                    self._managers.append(manager)
            except Exception:
                log.exception("listener %r of %s failed", listener, name)

    def __enter__(self) -> Operation:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.end(error)

    def end(self, error: BaseException | None = None, outcome: str | None = None) -> None:
        """End the operation (once), with ``outcome`` if given, failed with ``error`` if given."""
        if outcome is not None:
            self.outcome = outcome
        managers, self._managers = self._managers, []
        for manager in reversed(managers):
            try:
                manager.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)
            except Exception:
                log.exception("listener of %s failed at its end", self.name)


class _Unobserved(Operation):
    """The operation nobody listens to: shared, and it keeps nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        object.__setattr__(self, "name", "")
        object.__setattr__(self, "attributes", MappingProxyType({}))
        object.__setattr__(self, "message_properties", MappingProxyType({}))
        object.__setattr__(self, "outcome", None)
        object.__setattr__(self, "_managers", [])

    def __setattr__(self, name: str, value: object) -> None:
        pass  # ``operation.outcome = ...`` of an unobserved operation is dropped

    def end(self, error: BaseException | None = None, outcome: str | None = None) -> None:
        pass


_UNOBSERVED = _Unobserved()


def observed(name: str) -> bool:
    """Whether anyone listens to ``name``: a driver may skip the work of announcing it."""
    return name in _listeners


def operation(name: str, **attributes: Any) -> Operation:
    """Start the operation ``name``: use it as ``with operation(...) as op:``, or call
    ``op.end(...)``. Nobody listening: a shared operation that does nothing."""
    listeners = _listeners.get(name)
    if not listeners:
        return _UNOBSERVED
    return Operation(name, attributes, listeners)


def carried_context(properties: Mapping[str, object]) -> dict[str, str]:
    """The ``CONTEXT_PROPERTIES`` among a message's ``properties`` (text values only)."""
    return {name: value for name in CONTEXT_PROPERTIES if isinstance(value := properties.get(name), str)}


def stamped(message: Message, sending: Operation) -> Message:
    """``message`` with the properties the listeners of its ``sending`` added (the
    message's own properties of the same name win); ``message`` itself if none."""
    if not sending.message_properties:
        return message
    return msgspec.structs.replace(message, properties={**sending.message_properties, **message.properties})
