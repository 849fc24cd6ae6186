"""The gRPC clients with an open Telemetry stream, and where check-backs go.

A producer's Telemetry stream is its session: the topics its settings publish, and a queue
of commands the server writes to it. For every topic that some session publishes, the
front offers one check callback to the broker (``BrokerAPI.register_producer`` with the
topic as the producer group, as RocketMQ's proxy does). A check goes to the client that
sent the half message if its stream is still open, else to any open session publishing the
topic; with none the callback raises, which the broker counts as "no route" (a check that
reached nobody, counted toward ``check_max``), exactly as for the native protocol.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
from dataclasses import dataclass, field

from ...api import BrokerAPI
from ...message import CheckRequest
from ._proto import service_pb2 as spb
from .convert import check_to_proto

log = logging.getLogger(__name__)

#: How many transactions' sending clients are remembered (the oldest are forgotten first;
#: a forgotten one is checked through any session publishing its topic).
MAX_REMEMBERED_SENDERS = 100_000


@dataclass(eq=False)
class TelemetrySession:
    """One open Telemetry stream: its client, the topics it publishes, the commands to write."""

    client_id: str
    loop: asyncio.AbstractEventLoop
    outgoing: asyncio.Queue[spb.TelemetryCommand | None] = field(default_factory=asyncio.Queue)
    topics: frozenset[str] = frozenset()

    def push(self, command: spb.TelemetryCommand | None) -> None:
        """Queue ``command`` for the client (None ends the stream); callable from any thread."""
        self.loop.call_soon_threadsafe(self.outgoing.put_nowait, command)


class CheckRouter:
    """The open sessions, and the check callbacks they stand for in the broker."""

    def __init__(self, broker: BrokerAPI) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._sessions: dict[str, TelemetrySession] = {}
        self._callbacks: dict[str, object] = {}  # topic -> the callback registered for it
        self._senders: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._turn = itertools.count()

    def open(self, session: TelemetrySession) -> None:
        with self._lock:
            self._sessions[session.client_id] = session

    def publish(self, session: TelemetrySession, topics: frozenset[str]) -> None:
        """The session's settings say it publishes ``topics``: check-backs of them may go to it."""
        with self._lock:
            session.topics = topics
            new = [topic for topic in topics if topic not in self._callbacks]
            for topic in new:
                self._callbacks[topic] = self._check_callback(topic)
        for topic in new:
            self.broker.register_producer(topic, self._callbacks[topic])  # type: ignore[arg-type]
            log.info("gRPC producers registered for check-backs of topic %s", topic)

    def connected(self, client_id: str) -> bool:
        """Whether ``client_id`` has a Telemetry stream open."""
        with self._lock:
            return client_id in self._sessions

    def close(self, session: TelemetrySession) -> None:
        """The session's stream ended: it answers no more checks."""
        with self._lock:
            if self._sessions.get(session.client_id) is session:
                del self._sessions[session.client_id]
            published = {t for s in self._sessions.values() for t in s.topics}
            gone = [(topic, callback) for topic, callback in self._callbacks.items() if topic not in published]
            for topic, _ in gone:
                del self._callbacks[topic]
        for topic, callback in gone:
            self.broker.unregister_producer(topic, callback)  # type: ignore[arg-type]

    def end_all(self) -> None:
        """End every open stream (the server is stopping)."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.push(None)

    def sent_half(self, transaction_id: str, client_id: str) -> None:
        """``client_id`` sent the half message of ``transaction_id``: its checks go there first."""
        with self._lock:
            self._senders[transaction_id] = client_id
            while len(self._senders) > MAX_REMEMBERED_SENDERS:
                self._senders.popitem(last=False)

    def ended(self, transaction_id: str) -> None:
        with self._lock:
            self._senders.pop(transaction_id, None)

    def _check_callback(self, topic: str) -> object:
        def push_check(request: CheckRequest) -> None:
            session = self._route(topic, request.transaction_id)
            if session is None:
                raise ConnectionError(f"no gRPC client publishing topic {topic!r} is connected")
            session.push(spb.TelemetryCommand(
                recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                    message=check_to_proto(request), transaction_id=request.transaction_id)))

        return push_check

    def _route(self, topic: str, transaction_id: str) -> TelemetrySession | None:
        """The sender's session if open, else one publishing ``topic`` (taking turns)."""
        with self._lock:
            sender = self._sessions.get(self._senders.get(transaction_id, ""))
            if sender is not None:
                return sender
            candidates = [s for s in self._sessions.values() if topic in s.topics]
            return candidates[next(self._turn) % len(candidates)] if candidates else None
