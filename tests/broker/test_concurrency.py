"""END_TRANSACTION from many threads: each transaction resolves once, nothing is orphaned."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from broker_embedded import Message, Resolution, TransactionState
from broker_embedded.errors import TransactionConflictError


def test_concurrent_resolutions_apply_once_each(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=600, default_queues=2)
    ids = [f"t{n}" for n in range(60)]
    for tx in ids:
        broker.send_half(Message("orders", tx.encode()), producer_group="pg", transaction_id=tx)

    def resolve(tx: str) -> bool:
        resolution = Resolution.COMMIT if int(tx[1:]) % 2 == 0 else Resolution.ROLLBACK
        return broker.end_transaction(tx, resolution, producer_group="pg").applied

    with ThreadPoolExecutor(6) as pool:
        applied = list(pool.map(resolve, ids * 3))  # every transaction ended three times at once
    assert sum(applied) == len(ids)
    got = []
    while batch := broker.receive("g", "orders", max_messages=64, wait_s=0.5):
        got.extend(r.message.body for r in batch)
    assert sorted(got) == sorted(tx.encode() for tx in ids if int(tx[1:]) % 2 == 0)


def test_a_half_message_racing_the_commit_is_committed_or_refused(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=600, default_queues=1)
    accepted: list[bytes] = []
    for n in range(30):
        tx = f"race{n}"
        broker.send_half(Message("orders", f"{tx}-a".encode()), producer_group="pg", transaction_id=tx)
        accepted.append(f"{tx}-a".encode())
        start = threading.Barrier(2)

        def late_half(tx: str = tx, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                broker.send_half(Message("orders", f"{tx}-b".encode()), producer_group="pg", transaction_id=tx)
                accepted.append(f"{tx}-b".encode())
            except TransactionConflictError:
                pass

        racer = threading.Thread(target=late_half)
        racer.start()
        start.wait()
        broker.end_transaction(tx, Resolution.COMMIT, producer_group="pg")
        racer.join()
    assert broker.stats().pending_half == 0  # no half message left behind a commit
    got = []
    while batch := broker.receive("g", "orders", max_messages=64, wait_s=0.5):
        got.extend(r.message.body for r in batch)
    assert sorted(got) == sorted(accepted)


def test_snapshots_taken_during_commits_restore_every_resolution(broker_factory) -> None:
    broker = broker_factory(transaction_timeout_s=600, default_queues=1)
    snapshot = broker.data_dir / "transactions.snapshot"
    ids = [f"t{n}" for n in range(80)]
    taken: list[bytes] = []
    done = threading.Event()

    def snapshots() -> None:
        while not done.is_set():
            broker.write_snapshots()
            taken.append(snapshot.read_bytes())

    def transaction(tx: str) -> None:
        broker.send_half(Message("orders", tx.encode()), producer_group="pg", transaction_id=tx)
        broker.end_transaction(tx, Resolution.COMMIT, producer_group="pg")

    snapshotter = threading.Thread(target=snapshots)
    snapshotter.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(transaction, ids))
    done.set()
    snapshotter.join()
    assert len(taken) >= 2
    broker.close()
    snapshot.write_bytes(taken[len(taken) // 2])  # one taken mid-way: the rest is replayed
    broker = broker_factory(transaction_timeout_s=600, default_queues=1)
    assert all(broker.transaction_state(tx) is TransactionState.COMMITTED for tx in ids)
    assert broker.book.by_id == {}  # resolved transactions leave memory
    assert broker.stats().extra["committed"] == len(ids)  # nothing applied twice
    got = []
    while batch := broker.receive("g", "orders", max_messages=64, wait_s=0.5):
        got.extend(r.message.body for r in batch)
    assert sorted(got) == sorted(tx.encode() for tx in ids)
