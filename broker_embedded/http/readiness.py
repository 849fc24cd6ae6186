"""``Readiness``: whether a served broker is ready, for the HTTP port's ``/readyz``, and
whether it is degraded, for ``/healthz``."""

from __future__ import annotations

from ..broker.facade import EmbeddedBroker
from ..store.scrub import damage_reasons


class Readiness:
    """Why the broker process is not ready to serve, for ``/readyz``: the serve command
    sets ``broker`` once the store is open and recovered, and ``listening`` once the TCP
    port accepts connections."""

    def __init__(self) -> None:
        self.broker: EmbeddedBroker | None = None
        self.listening = False

    def reason(self) -> str | None:
        """What keeps the broker from being ready, or None when it is."""
        if self.broker is None:
            return "the store is being opened and recovered"
        if self.broker.closed:
            return "the broker is closed"
        if not self.listening:
            return "the TCP port is not listening"
        return None

    def degraded(self) -> list[str]:
        """Why the broker serves degraded (acknowledged messages lost and not acknowledged by
        an operator, a scrub that cannot read the log), for ``/healthz``; empty when it
        does not or is not open."""
        broker = self.broker
        if broker is None or broker.closed:
            return []
        return damage_reasons(broker.store)
