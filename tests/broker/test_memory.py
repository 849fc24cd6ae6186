"""Memory must not grow with history: resolved transactions, ids and queue entries live on disk."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from broker_embedded import BrokerConfig, EmbeddedBroker, Message, Resolution
from broker_embedded.broker.writes import EndCall, HalfCall
from broker_embedded.store.config import StoreConfig
from tests.store.load_writer import rss_bytes

BATCH = 250


def _complete_transactions(broker: EmbeddedBroker, first: int, count: int) -> None:
    """``count`` transactions of one 256-byte message each, sent and committed in batches."""
    for start in range(first, first + count, BATCH):
        ids = [f"tx-{n}" for n in range(start, start + BATCH)]
        halves = broker.produce([HalfCall(Message("orders", b"x" * 256, keys=(i,)), "shop", i) for i in ids])
        ends = broker.produce([EndCall(i, Resolution.COMMIT, "shop") for i in ids])
        assert not [o for o in halves + ends if isinstance(o, Exception)]


def test_rss_does_not_grow_with_completed_transactions(tmp_path: Path) -> None:
    config = BrokerConfig(store=StoreConfig(checkpoint_interval_s=0.2), transaction_timeout_s=600)
    with EmbeddedBroker(tmp_path / "broker", config) as broker:
        _complete_transactions(broker, 0, 10_000)  # warm-up: arenas, files, caches
        broker.store.checkpoint()
        gc.collect()
        before = rss_bytes()
        measured = 30_000
        _complete_transactions(broker, 10_000, measured)
        broker.store.checkpoint()
        gc.collect()
        growth_per_transaction = (rss_bytes() - before) / measured
        assert broker.book.by_id == {}
        assert broker.stats().extra["committed"] == 40_000
        assert broker.end_transaction("tx-5", Resolution.COMMIT, producer_group="shop").applied is False
        assert broker.query_by_key("orders", "tx-39999")
    # the bound; the old in-memory book and index took ~1.5 KB per transaction
    assert growth_per_transaction <= 100, f"{growth_per_transaction:.0f} bytes of RSS per transaction"


def test_deliveries_in_flight_do_not_hold_their_bodies(tmp_path: Path) -> None:
    """A group reads ahead up to ``max_inflight_per_queue`` messages per queue; with 1 MiB
    bodies that must cost headers, not the bodies (which are read again on delivery)."""
    body = b"b" * (1024 * 1024)
    with EmbeddedBroker(tmp_path / "broker", BrokerConfig(default_queues=1)) as broker:
        sent = [broker.send(Message("orders", body)).message_id for _ in range(150)]
        gc.collect()
        tracemalloc.start()
        try:
            [first] = broker.receive("g", "orders", max_messages=1)  # reads ahead the whole queue
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert first.message.body == body
        assert held < 20 * 1024 * 1024, f"{held / 2**20:.0f} MiB held for 150 deliveries in flight"
        broker.ack("g", first.receipt_handle)
        rest = broker.receive("g", "orders", max_messages=200, max_bytes=1 << 40)
        assert [r.message.message_id for r in rest] == sent[1:]
        assert all(r.message.body == body for r in rest)
