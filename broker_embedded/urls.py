"""``connect(url)``: one call for an in-process or a remote broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .api import BrokerAPI


def connect(url: str, **options: Any) -> BrokerAPI:
    """A broker for ``url``.

    * ``tcp://host:port``: a ``BrokerClient`` (``options``: timeout_s, access_key, secret_key);
    * ``rocketmq5://host:port[?topics=a,b]``: a ``RocketMQ5Broker`` on a RocketMQ 5 proxy through the
      official Python client (``options``: topics, access_key, secret_key, namespace, timeout_s);
    * ``embedded:///abs/path`` or ``embedded://rel/path``: an ``EmbeddedBroker`` on that data
      directory (``options``: config, checker). Only one process may open a directory.
    """
    parsed = urlparse(url)
    if parsed.scheme == "tcp":
        from .client.tcp import BrokerClient

        return BrokerClient(url, **options)
    if parsed.scheme == "rocketmq5":
        from .client.rocketmq5 import RocketMQ5Broker

        return RocketMQ5Broker(url, **options)
    if parsed.scheme == "embedded":
        from .broker.facade import EmbeddedBroker

        path = Path(parsed.netloc + parsed.path) if parsed.netloc else Path(parsed.path)
        return EmbeddedBroker(path, **options)
    raise ValueError(f"unsupported broker URL {url!r}: use tcp://host:port, rocketmq5://host:port or embedded:///path")
