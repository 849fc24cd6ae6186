"""``BrokerObserver``: what an ``EmbeddedBroker`` tells an observer (metrics) as it works.

The broker holds at most one observer (``EmbeddedBroker.observer``, None by default: one
attribute check per call then). The calls happen on the broker's own threads, on the hot
paths, so an observer must be quick and must not call back into the broker. Everything
else an observer may want (stored messages, fsyncs, state) it reads or subscribes to:
store dispatch listeners, ``MessageStore.on_fsync`` and the services' plain counters.
"""

from __future__ import annotations

from typing import Protocol

from ..message import ReceivedMessage


class BrokerObserver(Protocol):
    """Told of writes and deliveries; see the module docstring for the rules."""

    def written(self, calls: int, seconds: float) -> None:
        """A batch of ``calls`` writes (send, half message, END) was stored, durable per the
        flush mode, in ``seconds``: each of them waited that long in the broker."""
        ...

    def received(self, group: str, topic: str, messages: list[ReceivedMessage]) -> None:
        """``messages`` of ``topic`` were handed to consumer group ``group``."""
        ...
