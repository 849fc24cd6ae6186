"""Kept for imports of ``broker_embedded.http_port``: the port is ``broker_embedded.http.port``."""

from .http.port import HttpLimits, HttpPort, MetricsAccess, check_exposure

__all__ = ["HttpLimits", "HttpPort", "MetricsAccess", "check_exposure"]
