"""Kept for imports of ``broker_embedded.rocketmq5``: the client is ``broker_embedded.client.rocketmq5``."""

from .client.rocketmq5 import RocketMQ5Broker

__all__ = ["RocketMQ5Broker"]
