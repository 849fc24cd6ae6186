"""Clients of a broker elsewhere: ``BrokerClient`` and ``AsyncBrokerClient`` over TCP,
``RocketMQ5Broker`` on a RocketMQ 5 cluster.

``tcp`` and ``aio`` do only the I/O; the protocol state they share is
``broker_embedded.wire.session``. ``rocketmq5`` needs the ``[rocketmq5]`` extra.

May import the root vocabulary and ``wire``; never ``store``, ``broker``, ``server``,
``http`` or ``cli`` (checked by ``.importlinter``).
"""

from .tcp import BrokerClient

__all__ = ["BrokerClient"]
