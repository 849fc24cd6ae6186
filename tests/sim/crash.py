"""Dropping a broker or a store in-process as a killed process would leave it."""

from __future__ import annotations

from broker_embedded.broker.facade import EmbeddedBroker
from broker_embedded.store.message_store import MessageStore


def abandon(process: EmbeddedBroker | MessageStore) -> None:
    """Drop a broker or a store (or one whose open was cut) as a killed process would:
    its background threads stop without a flush, snapshot or checkpoint; nothing is
    closed (on the simulated disk, the crash then forgets the descriptors)."""
    if isinstance(process, EmbeddedBroker) and hasattr(process, "_service"):
        process._closed.set()
        process._service.join()
    store = process if isinstance(process, MessageStore) else getattr(process, "store", None)
    if store is not None and hasattr(store, "_background"):
        store._stop.set()
        store._background.join()
