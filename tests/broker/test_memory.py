"""Memory must not grow with history: resolved transactions, ids and queue entries live on disk."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from broker_embedded import BrokerConfig, EmbeddedBroker, Message, Resolution
from broker_embedded.broker.writes import EndCall, HalfCall
from broker_embedded.errors import TransactionConflictError
from broker_embedded.store.config import StoreConfig
from tests.store.damage import index_files
from tests.store.load_writer import rss_bytes
from tests.store.test_index_file import IndexPreads

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


def test_a_new_transactions_first_half_reads_hardly_any_index_file_as_history_grows(tmp_path: Path) -> None:
    files = IndexPreads()
    store = StoreConfig(index_slots=64, index_entries=256, filesystem=files)  # small files: many of them soon
    with EmbeddedBroker(tmp_path / "broker", BrokerConfig(store=store)) as broker:
        def reads_per_new_transaction(first: int) -> float:
            files.index_preads = 0
            _complete_transactions(broker, first, BATCH)
            return files.index_preads / BATCH

        early = reads_per_new_transaction(0)
        _complete_transactions(broker, BATCH, 20 * BATCH)
        files_now = len(index_files(tmp_path / "broker"))
        assert files_now > 20
        late = reads_per_new_transaction(21 * BATCH)
        # the ids of the ended transactions are still found, in the files the filters let through
        assert broker.end_transaction("tx-7", Resolution.COMMIT, producer_group="shop").applied is False
        [late_half] = broker.produce([HalfCall(Message("orders", b"late"), "shop", "tx-7")])
        assert isinstance(late_half, TransactionConflictError), late_half
    # Without filters a lookup read a slot and a chain (~5 reads) in every file: 0.6 reads a
    # transaction at first, 76 at 16 files. Now only the files whose filter lets the id
    # through (0.8 % of them) are read.
    assert late - early <= 0.25 * files_now, (
        f"{early:.1f} index reads per new transaction at first, {late:.1f} with {files_now} files")
