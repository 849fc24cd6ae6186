"""Kept for imports of ``broker_embedded.aio_client``: the client is ``broker_embedded.client.aio``."""

from .client.aio import AsyncBrokerClient

__all__ = ["AsyncBrokerClient"]
