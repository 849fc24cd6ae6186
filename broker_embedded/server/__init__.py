"""Serving a ``BrokerAPI`` over the network: the TCP server, its write batches, the gRPC front.

``tcp`` is ``BrokerServer`` (see docs/server.md), ``batching`` the shared write batches,
``grpc`` the RocketMQ 5 gRPC front (the ``[grpc]`` extra).

May import the root vocabulary, ``store``, ``broker`` and ``wire``; never ``client``,
``http`` or ``cli`` (checked by ``.importlinter``).
"""

from .tcp import BrokerServer, run_server

__all__ = ["BrokerServer", "run_server"]
