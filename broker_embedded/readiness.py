"""Kept for imports of ``broker_embedded.readiness``: it is ``broker_embedded.http.readiness``."""

from .http.readiness import Readiness

__all__ = ["Readiness"]
