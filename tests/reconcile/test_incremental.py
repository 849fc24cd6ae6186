"""Incremental runs (``--state-dir``): N runs over N windows count what one full run counts.

The history is a timeline: the producer and consumer databases hold every row (each run
reads only its window of them), and the broker export of each run is the broker's state at
the end of that run's window, as a nightly export would be (a half message committed later
is half in the earlier exports).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from outbox.reconcile import ReconcileInputs, ReconcileOptions, reconcile
from outbox.reconcile.state import StateError
from outbox.reconcile.synthetic import GROUP, Synthetic, write_export, write_sqlite

HOUR = 3_600_000
MINUTE = 60_000
T0 = int(datetime(2026, 11, 20, tzinfo=UTC).timestamp() * 1000)
WINDOWS = [T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]


@dataclass
class _Tx:
    """One transaction's times (ms; None: it never happened)."""

    name: str
    local_ms: int | None
    local_state: str = "COMMITTED"
    store_ms: int | None = None
    commit_ms: int | None = None
    rollback_ms: int | None = None
    delivered_ms: int | None = None
    consumed_ms: list[int] = field(default_factory=list)


def _timeline() -> list[_Tx]:
    w0, w1, w2 = WINDOWS[:3]
    txs = [
        _clean(f"clean{k}-{i}", WINDOWS[k] + 10 * MINUTE + i * 1000)
        for k in range(3)
        for i in range(10)
    ]
    txs += [
        # committed and delivered before the first cut, consumed after it
        _Tx(
            "straddler",
            w1 - 2000,
            store_ms=w1 - 2010,
            commit_ms=w1 - 1900,
            delivered_ms=w1 + 3000,
            consumed_ms=[w1 + 4000],
        ),
        # consumed twenty minutes into the next window: lost at the first cut, fine after
        _Tx(
            "late",
            w0 + 10 * MINUTE,
            store_ms=w0 + 10 * MINUTE - 5,
            commit_ms=w0 + 10 * MINUTE + 3,
            delivered_ms=w0 + 10 * MINUTE + 10,
            consumed_ms=[w1 + 20 * MINUTE],
        ),
        # half at the broker through two windows, committed by a check-back in the third
        _Tx(
            "pending",
            w0 + 20 * MINUTE + 1000,
            store_ms=w0 + 20 * MINUTE,
            commit_ms=w2 + 30 * MINUTE,
            delivered_ms=w2 + 30 * MINUTE + 5,
            consumed_ms=[w2 + 30 * MINUTE + 6],
        ),
        # never delivered
        _Tx(
            "lost", w0 + 30 * MINUTE, store_ms=w0 + 30 * MINUTE - 5, commit_ms=w0 + 30 * MINUTE + 3
        ),
        _Tx(
            "phantom",
            None,
            store_ms=w1 + 10 * MINUTE,
            commit_ms=w1 + 10 * MINUTE + 3,
            delivered_ms=w1 + 10 * MINUTE + 5,
            consumed_ms=[w1 + 10 * MINUTE + 6],
        ),
        _Tx(
            "rolled",
            w0 + 40 * MINUTE,
            "ROLLED_BACK",
            store_ms=w0 + 40 * MINUTE - 5,
            rollback_ms=w0 + 40 * MINUTE + 5,
        ),
        _Tx(
            "twice",
            w1 + 40 * MINUTE,
            store_ms=w1 + 40 * MINUTE - 5,
            commit_ms=w1 + 40 * MINUTE + 3,
            delivered_ms=w1 + 40 * MINUTE + 5,
            consumed_ms=[w1 + 40 * MINUTE + 6, w1 + 40 * MINUTE + 8],
        ),
        # its half message is stored before the second cut, its local commit comes after
        _Tx(
            "cut",
            w2 + 1000,
            store_ms=w2 - 1000,
            commit_ms=w2 + 1005,
            delivered_ms=w2 + 1010,
            consumed_ms=[w2 + 1020],
        ),
        # still half when the last window ends
        _Tx("half", None, store_ms=w2 + 40 * MINUTE),
        # before the history starts: never counted, nor its consumption in the first window
        _Tx(
            "before",
            w0 - 10 * MINUTE,
            store_ms=w0 - 10 * MINUTE - 5,
            commit_ms=w0 - 10 * MINUTE + 3,
            delivered_ms=w0 + 5 * MINUTE,
            consumed_ms=[w0 + 5 * MINUTE + 1],
        ),
    ]
    return txs


def _clean(name: str, local_ms: int) -> _Tx:
    return _Tx(
        name,
        local_ms,
        store_ms=local_ms - 5,
        commit_ms=local_ms + 3,
        delivered_ms=local_ms + 5,
        consumed_ms=[local_ms + 6],
    )


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _tables(txs: list[_Tx], export_at_ms: int) -> Synthetic:
    """Every database row, and the broker's export as it stood at ``export_at_ms``."""
    data = Synthetic()
    for tx in txs:
        common = {"transaction_id": tx.name, "topic": "orders"}
        if tx.local_ms is not None:
            data.transaction_log.append(
                {
                    "transaction_id": tx.name,
                    "producer_group": "shop",
                    "state": tx.local_state,
                    "created_at": _ts(tx.local_ms),
                }
            )
        for n, consumed_ms in enumerate(tx.consumed_ms):
            data.consumed.append(
                {
                    **common,
                    "consumer_group": GROUP,
                    "message_id": f"m-{tx.name}-{n}",
                    "consumed_at": _ts(consumed_ms),
                }
            )
        if tx.store_ms is None or tx.store_ms >= export_at_ms:
            continue
        state, commit_ms = "half", None
        if tx.commit_ms is not None and tx.commit_ms < export_at_ms:
            state, commit_ms = "committed", tx.commit_ms
        elif tx.rollback_ms is not None and tx.rollback_ms < export_at_ms:
            state = "rolled_back"
        data.messages.append(
            {
                **common,
                "message_id": f"m-{tx.name}-0",
                "producer_group": "shop",
                "queue_id": 0,
                "keys": "",
                "tag": "",
                "state": state,
                "born_ms": tx.store_ms - 1,
                "store_ms": tx.store_ms,
                "commit_ms": commit_ms,
                "copies": 1,
            }
        )
        if tx.delivered_ms is not None and tx.delivered_ms < export_at_ms:
            data.deliveries.append(
                {
                    **common,
                    "message_id": f"m-{tx.name}-0",
                    "consumer_group": GROUP,
                    "delivery_attempts": 1,
                    "first_delivered_ms": tx.delivered_ms,
                    "acked_ms": tx.delivered_ms + 1,
                    "dead_lettered": False,
                }
            )
    return data


def _inputs(tmp_path: Path, txs: list[_Tx]) -> tuple[list[ReconcileInputs], Synthetic]:
    """The databases (all rows) and one export per window end."""
    producer, consumer = (
        f"sqlite:///{tmp_path / 'producer.sqlite3'}",
        f"sqlite:///{tmp_path / 'consumer.sqlite3'}",
    )
    full = _tables(txs, WINDOWS[-1])
    write_sqlite(full, producer, consumer)
    inputs = []
    for until in WINDOWS[1:]:
        export = tmp_path / f"export-{until}"
        write_export(_tables(txs, until), export)
        inputs.append(ReconcileInputs([producer], [consumer], str(export)))
    return inputs, full


COUNTED = (
    "transactions",
    "committed",
    "rolled_back",
    "phantom",
    "lost",
    "half_pending",
    "parked",
    "duplicate_delivery",
    "duplicate_effect",
    "conflict",
    "clock_skew",
    "deliveries",
    "consumptions",
)


def _run(
    spark: Any,
    inputs: ReconcileInputs,
    out: Path,
    until: int,
    state: Path | None,
    since: int | None = None,
) -> dict[str, Any]:
    options = ReconcileOptions(
        str(out),
        since_ms=since,
        until_ms=until,
        now_ms=until,
        state_dir=None if state is None else str(state),
    )
    return reconcile(spark, inputs, options).summary


@pytest.mark.spark
def test_incremental_runs_count_what_one_full_run_counts(spark, tmp_path: Path) -> None:
    txs = _timeline()
    inputs, full_data = _inputs(tmp_path, txs)
    state = tmp_path / "state"
    with pytest.raises(StateError, match="the first run needs --since"):
        _run(spark, inputs[0], tmp_path / "none", WINDOWS[1], state)

    runs = [_run(spark, inputs[0], tmp_path / "run1", WINDOWS[1], state, since=WINDOWS[0])]
    runs += [
        _run(spark, inputs[k], tmp_path / f"run{k + 1}", WINDOWS[k + 1], state) for k in (1, 2)
    ]
    full = _run(spark, inputs[-1], tmp_path / "full", WINDOWS[-1], None, since=WINDOWS[0])

    assert full["counts"]["transactions"] == len(txs) - 1  # all but the one before the history
    assert (
        full["counts"]["lost"] == 1
        and full["counts"]["phantom"] == 1
        and full["counts"]["half_pending"] == 1
    )
    # Each transaction counted once: by the run that resolved it, or as the last run left it.
    for name in COUNTED:
        once = (
            sum(run["incremental"]["resolved"][name] for run in runs[:-1])
            + runs[-1]["counts"][name]
        )
        assert once == full["counts"][name], name

    first, second, last = (run["incremental"] for run in runs)
    # straddler, late, pending, lost open at the first cut; pending, lost, cut-half at the second
    assert (first["carried_in"], first["carried_out"]) == (0, 4)
    assert (second["carried_in"], second["carried_out"]) == (4, 3)
    assert (last["carried_in"], last["carried_out"]) == (3, 2)  # lost and half stay open
    # The late consumption and the one still half at the broker are lost at the first cut (and
    # alert, with the lost one), then resolved as fine.
    assert runs[0]["counts"]["lost"] == 3 and runs[0]["breached"] == {"lost": 3}
    assert runs[1]["counts"]["lost"] == 2 and runs[1]["incremental"]["resolved"]["lost"] == 0
    assert runs[-1]["counts"]["lost"] == 1

    # Every run read its own window only (the first from an hour before, as a full run does).
    for k, run in enumerate(runs[1:], start=1):
        low, high = WINDOWS[k], WINDOWS[k + 1]
        assert run["rows_read"]["transaction_log"] == sum(
            low <= row["created_at"].timestamp() * 1000 < high for row in full_data.transaction_log
        )
        assert run["rows_read"]["consumed"] == sum(
            low <= row["consumed_at"].timestamp() * 1000 < high for row in full_data.consumed
        )
    assert (
        sum(run["rows_read"]["transaction_log"] for run in runs)
        == full["rows_read"]["transaction_log"]
    )
    assert (
        max(run["rows_read"]["transaction_log"] for run in runs)
        < full["rows_read"]["transaction_log"] / 2
    )

    # Rerunning the last window starts from the state before it: the same report.
    again = _run(spark, inputs[-1], tmp_path / "again", WINDOWS[-1], state)
    assert again["counts"] == runs[-1]["counts"] and again["incremental"] == {**last}
    # An earlier window again, or a gap, is refused with a message that says what to do.
    with pytest.raises(StateError, match="already reconciled up to 2026-11-20T03:00:00.*full run"):
        _run(spark, inputs[1], tmp_path / "old", WINDOWS[2], state)
    with pytest.raises(
        StateError, match="the last run ended at 2026-11-20T03:00:00.*leave --since out"
    ):
        _run(spark, inputs[-1], tmp_path / "gap", WINDOWS[-1] + HOUR, state, since=WINDOWS[-1] + 1)
