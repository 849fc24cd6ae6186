"""``Readiness``: whether a served broker is ready, for the HTTP port's ``/readyz``."""

from __future__ import annotations

from .broker import EmbeddedBroker


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
