"""SIGKILL the broker server while it writes END_TRANSACTION(COMMIT) of three 3 MiB messages.

``python -m broker_embedded serve`` with 5 MiB segments, so the commit's three records
(one batch) roll into new segments part-way. The server is killed 0-20 ms after END is
sent, restarted on the same data dir, and the transaction must be COMMITTED with all three
messages readable once, or not committed with none; a COMMIT sent again (the producer's
retry, or a check-back answer) then delivers all three once.

The oneway variant sends the END as ``@transactional_message`` does (``oneway=True``, not
waited for: the broker holds its record for the next write) and at once the next
transaction's 3 MiB half message, which carries the held END in its one append.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, BrokerError, Message, Resolution, TransactionState

from ..server.conftest import ServerProcess
from .crashcut import describe, exactly_once, kill_delays, kill_later, visible

TOPIC = "orders"
PRODUCER_GROUP = "pg"
TX = "tx-killed"
NEXT_TX = "tx-next"
BODY_SIZE = 3 * 1024 * 1024
SEGMENT_SIZE = 5 * 1024 * 1024
#: Each kill delay of 0..20 ms at least once. With the bug 12 of 40 tries left a partial
#: commit (kills 10-20 ms after END was sent), about 7 of these 24 would; 0.5-1.5 s a try.
TRIES = 24


def kill_during_commit(data: Path, delay_s: float, oneway: bool = False) -> str:
    """One try; its outcome: "committed", "pending" or a description of the violation."""
    server = ServerProcess(data, "--segment-size", str(SEGMENT_SIZE), "--transaction-timeout", "600",
                           "--log-level", "WARNING")
    try:
        server.start()
        with BrokerClient(server.url) as client:
            ids = [client.send_half(Message(TOPIC, os.urandom(BODY_SIZE)), producer_group=PRODUCER_GROUP,
                                    transaction_id=TX).message_id for _ in range(3)]
            killer = kill_later(server, delay_s)
            try:
                if oneway:
                    client.start_end_transaction(TX, Resolution.COMMIT, producer_group=PRODUCER_GROUP, oneway=True)
                    client.send_half(Message(TOPIC, os.urandom(BODY_SIZE)), producer_group=PRODUCER_GROUP,
                                     transaction_id=NEXT_TX)
                else:
                    client.end_transaction(TX, Resolution.COMMIT, producer_group=PRODUCER_GROUP)
            except BrokerError:
                pass  # killed before the answer: the broker decides on restart
            killer.join()
        server.start()
        with BrokerClient(server.url) as client:
            state = client.transaction_state(TX)
            seen = visible(client, TOPIC)
            if state is TransactionState.COMMITTED:
                ok = exactly_once(seen, ids)
                return "committed" if ok else f"COMMITTED with {describe(seen, ids)} readable after restart"
            if seen:
                return f"{state.name} with {describe(seen, ids)} readable after restart"
            client.end_transaction(TX, Resolution.COMMIT, producer_group=PRODUCER_GROUP)
            seen = visible(client, TOPIC)
            return "pending" if exactly_once(seen, ids) else f"COMMIT after restart left {describe(seen, ids)}"
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("oneway", [False, True], ids=["end-waited", "end-oneway-held"])
def test_sigkill_during_commit_never_leaves_a_partial_transaction(tmp_path: Path, oneway: bool) -> None:
    outcomes = [(delay, kill_during_commit(tmp_path / f"try-{n}", delay, oneway))
                for n, delay in enumerate(kill_delays(TRIES))]
    bad = [f"killed after {delay * 1000:.0f} ms: {outcome}" for delay, outcome in outcomes
           if outcome not in ("committed", "pending")]
    committed = sum(outcome == "committed" for _, outcome in outcomes)
    assert not bad, (f"{len(bad)}/{TRIES} tries left a partial commit ({committed} committed, "
                     f"{TRIES - committed - len(bad)} pending):\n  " + "\n  ".join(bad))
