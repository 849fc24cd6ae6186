"""The carry-over of incremental runs (``--state-dir``): what a run leaves for the next.

A run over the window ``[from, until)`` reads each append-only input (transaction_log,
consumed messages) only in the window, and each input the broker or the relay may still
change (broker messages, deliveries, stored messages, all keyed by a time that never
changes) from the window's start, and before it only for the carried transactions whose
broker side may still change (half, parked, waiting for the relay). It classifies what it
read together with the carry-over, and keeps for the next run the transactions still
unresolved at ``until``: young ones (within the grace period), those the broker still
holds half or parked, those whose stored messages wait for the relay, and those committed
but not yet delivered or consumed (``carried``). A resolved transaction is counted once,
by the run that resolved it.

The state directory holds one folder per run, ``until=<epoch ms>/`` with ``rows/`` (the
carried transactions' append-only rows, the broker rows of those whose broker side is
settled, in the shape of ``classify.events``, and one marker row per carried
transaction) and ``meta.json``, written last and renamed into
place, so a run that fails leaves the state as it was. The last ``GENERATIONS`` are kept:
rerunning the latest window starts from the one before and gives the same result.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ..errors import ConfigurationError
from .classify import CARRIED, CONSUMED, EVENT_SCHEMA, KEPT, LOCAL

#: Runs kept in the state directory (the latest can be rerun from the one before).
GENERATIONS = 3
#: How long a transaction may stay unresolved before a run reports it as it stands (7 days).
DEFAULT_MAX_CARRY_S = 7 * 86_400.0
_PREFIX = "until="


class StateError(ConfigurationError):
    """The state directory does not fit the asked window (a gap, an overlap, an old window)."""


@dataclass(frozen=True)
class Carry:
    """Where a run starts: the first run's ``--since`` (``history_ms``: transactions before
    it are never counted), this window's start (``from_ms``), how far back the changeable
    inputs are read for carried transactions (``refresh_ms``), the carried rows (``rows``:
    None on the first run) and how many transactions they carry."""

    history_ms: int
    from_ms: int
    refresh_ms: int
    rows: Path | None
    carried: int = 0


def _generations(state_dir: Path) -> dict[int, Path]:
    """The complete runs in the state directory by their ``until`` (ms)."""
    if not state_dir.is_dir():
        return {}
    found = {}
    for folder in state_dir.iterdir():
        if folder.name.startswith(_PREFIX) and (folder / "meta.json").exists():
            found[int(folder.name[len(_PREFIX) :])] = folder
    return found


def _carry(folder: Path) -> Carry:
    meta = json.loads((folder / "meta.json").read_text())
    return Carry(
        meta["history_ms"], meta["until_ms"], meta["refresh_ms"], folder / "rows", meta["carried"]
    )


def plan(state_dir: Path, since_ms: int | None, until_ms: int) -> Carry:
    """The carry-over a run over ``[since, until)`` starts from; ``StateError`` when the
    window does not follow the last run (the first run needs ``since``)."""
    generations = _generations(state_dir)
    before = sorted(until for until in generations if until < until_ms)
    latest = max(generations, default=None)
    if latest is not None and until_ms < latest:
        raise StateError(
            f"--state-dir {state_dir} already reconciled up to {_iso(latest)}; a window ending "
            f"{_iso(until_ms)} is in the past: reconcile it with a full run (--since/--until "
            "without --state-dir)"
        )
    if not before:
        if latest is not None:  # the first window again: its --since is kept in its state
            since_ms = since_ms if since_ms is not None else _carry(generations[latest]).history_ms
        if since_ms is None:
            raise StateError(
                f"--state-dir {state_dir} holds no run yet: the first run needs --since "
                "(where the reconciled history starts)"
            )
        if since_ms >= until_ms:
            raise StateError(f"--since {_iso(since_ms)} is not before --until {_iso(until_ms)}")
        return Carry(since_ms, since_ms, since_ms, None)
    carry = _carry(generations[before[-1]])
    if since_ms is not None and since_ms != carry.from_ms:
        raise StateError(
            f"--state-dir {state_dir}: the last run ended at {_iso(carry.from_ms)}, so the next "
            f"window starts there, not at --since {_iso(since_ms)} (leave --since out)"
        )
    return carry


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


#: ``carried`` of a transaction resolved by the run, carried with its broker rows kept in
#: the state, carried with its broker rows read again by the next run.
RESOLVED, CARRIED_KEPT, CARRIED_REREAD = 0, 1, 2


def carried(seen_until_ms: int, grace_ms: int, has_consumers: bool, max_carry_ms: int) -> Column:
    """Whether a classified transaction stays open at ``seen_until_ms``: young (within the
    grace period), held half or parked by the broker, waiting for the relay, or committed
    and not yet delivered (or consumed); none older than ``max_carry_ms``. An open one
    whose broker side may still change (half, parked, waiting for the relay) is
    ``CARRIED_REREAD``: the next run reads its broker messages, deliveries and stored
    messages again; the others are ``CARRIED_KEPT``: the state keeps those rows (only new
    rows, in the next window, can still come for them)."""
    unreached = (F.col("delivered") == 0) | (
        (F.col("consumed") == 0) if has_consumers else F.lit(False)
    )
    open_ = (
        (F.col("event_ms") >= F.lit(seen_until_ms - grace_ms))
        | F.col("half_pending")
        | F.col("parked")
        | F.col("stored_unrelayed")
        | (F.col("committed") & unreached)
    )
    unsettled = F.col("half_pending") | F.col("parked") | F.col("stored_unrelayed")
    return (
        F.when(
            ~(open_ & (F.col("event_ms") >= F.lit(seen_until_ms - max_carry_ms))), F.lit(RESOLVED)
        )
        .when(unsettled, F.lit(CARRIED_REREAD))
        .otherwise(F.lit(CARRIED_KEPT))
    )


def read_rows(spark: SparkSession, carry: Carry) -> DataFrame | None:
    """The carried rows (append-only inputs and markers), None on the first run."""
    return None if carry.rows is None else spark.read.schema(EVENT_SCHEMA).parquet(str(carry.rows))


def only_carried(
    frame: DataFrame, time_column: str, carry: Carry, ids: DataFrame | None
) -> DataFrame:
    """A changeable input read from ``carry.refresh_ms``: its rows before the window only for
    the carried transactions (``ids``)."""
    if ids is None:
        return frame
    recent = frame.where(F.col(time_column) >= _bound(frame, time_column, carry.from_ms))
    older = frame.where(F.col(time_column) < _bound(frame, time_column, carry.from_ms))
    return recent.unionByName(older.join(F.broadcast(ids), "transaction_id", "left_semi"))


def _bound(frame: DataFrame, column: str, ms: int) -> Column:
    kind = dict(frame.dtypes)[column]
    return F.timestamp_millis(F.lit(ms)) if kind == "timestamp" else F.lit(ms)


def carried_ids(rows: DataFrame | None) -> DataFrame | None:
    """The transaction ids whose broker rows a run reads again (their marker rows)."""
    return None if rows is None else rows.where(F.col("kind") == CARRIED).select("transaction_id")


def save(
    state_dir: Path,
    events: DataFrame,
    classified: DataFrame,
    carry: Carry,
    until_ms: int,
    refresh_ms: int,
) -> int:
    """Write the next carry-over (the open transactions' append-only rows, the broker rows of
    the ``CARRIED_KEPT`` ones, and a marker each) as ``until=<until_ms>/``, replacing a
    rerun's, keeping the last ``GENERATIONS``; returns how many transactions it carries."""
    open_ids = classified.where(F.col("carried") != RESOLVED).select("transaction_id", "carried")
    markers = open_ids.select(
        "transaction_id",
        F.when(F.col("carried") == CARRIED_REREAD, F.lit(CARRIED))
        .otherwise(F.lit(KEPT))
        .cast("byte")
        .alias("kind"),
        *[F.lit(None).cast(kind).alias(name) for name, kind in _measures()],
    )
    kept = (
        events.where(~F.col("kind").isin(CARRIED, KEPT))
        .join(F.broadcast(open_ids), "transaction_id")
        .where(F.col("kind").isin(LOCAL, CONSUMED) | (F.col("carried") == CARRIED_KEPT))
        .drop("carried")
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    staging = state_dir / f".{_PREFIX}{until_ms}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    markers.unionByName(kept).write.parquet(str(staging / "rows"))
    count = _markers(staging / "rows")
    (staging / "meta.json").write_text(
        json.dumps(
            {
                "history_ms": carry.history_ms,
                "from_ms": carry.from_ms,
                "until_ms": until_ms,
                "refresh_ms": min(refresh_ms, until_ms),
                "carried": count,
            }
        )
    )
    final = state_dir / f"{_PREFIX}{until_ms}"
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in sorted(_generations(state_dir))[:-GENERATIONS]:
        shutil.rmtree(state_dir / f"{_PREFIX}{old}")
    return count


def _measures() -> list[tuple[str, str]]:
    return [tuple(part.split()) for part in EVENT_SCHEMA.split(", ")[2:]]  # type: ignore[misc]


def _markers(rows: Path) -> int:
    dataset = ds.dataset(rows, format="parquet")
    return dataset.count_rows(filter=ds.field("kind").isin([CARRIED, KEPT]))
