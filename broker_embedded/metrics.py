"""Kept for imports of ``broker_embedded.metrics``: it is ``broker_embedded.http.metrics``."""

from .http.metrics import BrokerMetrics, register_broker_metrics

__all__ = ["BrokerMetrics", "register_broker_metrics"]
