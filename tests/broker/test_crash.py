"""SIGKILL the broker's process: resolutions, half messages and fsync'd acks survive."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Resolution, TransactionState

from .conftest import FAST

CHILD = textwrap.dedent("""
    import sys, time
    from dataclasses import replace
    from broker_embedded import EmbeddedBroker, Message, Resolution
    from tests.broker.conftest import FAST

    broker = EmbeddedBroker(sys.argv[1], replace(FAST, sync_consumer_progress=True,
                                                 transaction_timeout_s=600, default_queues=1))
    for n in range(5):
        broker.send(Message("orders", b"m%d" % n))
    broker.send_half(Message("orders", b"c"), producer_group="pg", transaction_id="commit-me")
    broker.send_half(Message("orders", b"p"), producer_group="pg", transaction_id="pending")
    broker.end_transaction("commit-me", Resolution.COMMIT, producer_group="pg")
    batch = broker.receive("g", "orders", max_messages=3)
    for received in batch:
        broker.ack("g", received.receipt_handle)
    print(",".join(r.message.body.decode() for r in batch), flush=True)
    time.sleep(60)
""")


@pytest.mark.slow
def test_sigkill_keeps_acks_resolutions_and_half_messages(tmp_path) -> None:
    data = tmp_path / "broker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data)], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).parents[2])
    try:
        assert child.stdout is not None
        acked = set(child.stdout.readline().strip().split(","))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert len(acked) == 3
    broker = EmbeddedBroker(data, replace(FAST, transaction_timeout_s=600))
    try:
        assert broker.transaction_state("commit-me") is TransactionState.COMMITTED
        assert broker.transaction_state("pending") is TransactionState.PENDING
        rest = {r.message.body.decode() for r in broker.receive("g", "orders", max_messages=10, wait_s=1)}
        assert rest == {"m0", "m1", "m2", "m3", "m4", "c"} - acked
        broker.end_transaction("pending", Resolution.COMMIT, producer_group="pg")
        assert [r.message.body for r in broker.receive("g", "orders", wait_s=2)] == [b"p"]
    finally:
        broker.close()
