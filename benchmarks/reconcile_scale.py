"""Reconciliation at scale: Spark (local[2]) against DuckDB over the same Parquet.

    ./dev bench reconcile_scale [--sizes 10000 1000000 10000000] [--repeat 3]

    ./dev bench reconcile_scale --sizes --incremental 100000 [--days 30]
    ./dev bench reconcile_scale --sizes 1000000 --repeat 3 --baseline /tmp/before   # before/after
    ./dev bench reconcile_scale --sizes 1000000 10000000 --repeat 3 --floor  # and Spark's own floor

For each size: synthetic inputs with every anomaly kind written as Parquet, then the
whole job (``python -m outbox.reconcile``, Spark start included, wall time) and the same
core classification as one DuckDB SQL query, in the same run. Prints both and the ratio
(medians of ``--repeat`` runs), and where the job's start-up goes, from Spark's event log:
``to app`` from the process start to the application's start (Python imports, the JVM,
the SparkContext), ``to job`` from there to the first Spark job (session, schemas,
planning), ``jobs`` from there to the end; then each stage of the median run (seconds,
shuffle written and read). ``--baseline DIR`` runs another checkout (e.g. ``git archive
<commit> outbox broker_embedded | tar -x -C DIR``) in turns with this one over the same
inputs, so a change is measured before and after under the same load. ``--floor`` also
times, from launch, the least any Spark job over these inputs costs here: the session and
one trivial job (``start``), and every input's transaction id shuffled once and counted
per id (``ids + 1 shuffle``), the one shuffle the classification cannot avoid.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

DAY_MS = 86_400_000
#: Rows per Parquet row group: what a filter pushed into the scan can skip at a time.
ROW_GROUP = 100_000


def write_inputs(n: int, folder: Path, start_ms: int | None = None, days: int = 1) -> None:
    """Columnar synthetic data, built with Arrow directly (the per-row generator is for tests):
    ``n`` transactions spread evenly over ``days`` days from ``start_ms`` (default: the day
    before the last hour), every table in time order as the databases append it."""
    if start_ms is None:
        start_ms = int(time.time() * 1000) - 3_600_000 - DAY_MS
    ids = pa.array([f"tx{i:09d}" for i in range(n)])
    mids = pa.array([f"m{i:09d}" for i in range(n)])
    local_ms = [start_ms + i * days * DAY_MS // max(n, 1) for i in range(n)]
    local_state = ["ROLLED_BACK" if i % 997 == 1 else "COMMITTED" for i in range(n)]
    keep_local = [i % 991 != 2 for i in range(n)]  # phantoms: no local row
    (folder / "export").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "transaction_id": ids.filter(pa.array(keep_local)),
        "producer_group": pa.array(["shop"] * sum(keep_local)),
        "state": pa.array([s for s, k in zip(local_state, keep_local, strict=True) if k]),
        "created_at": pa.array([datetime.fromtimestamp(m / 1000, UTC) for m, k in zip(local_ms, keep_local, strict=True)
                                if k], pa.timestamp("us", tz="UTC")),
    }), folder / "transaction_log.parquet", row_group_size=ROW_GROUP)
    broker_state = ["rolled_back" if s == "ROLLED_BACK" else "committed" for s in local_state]
    pq.write_table(pa.table({
        "message_id": mids, "transaction_id": ids, "producer_group": pa.array(["shop"] * n),
        "topic": pa.array([f"topic{i % 5}" for i in range(n)]), "queue_id": pa.array([i % 4 for i in range(n)], pa.int32()),
        "keys": pa.array([""] * n), "tag": pa.array([""] * n), "state": pa.array(broker_state),
        "born_ms": pa.array(local_ms), "store_ms": pa.array(local_ms),
        "commit_ms": pa.array([m + 3 + i % 7 for i, m in enumerate(local_ms)]),
        "copies": pa.array([2 if i % 983 == 3 else 1 for i in range(n)], pa.int32()),
    }), folder / "export" / "messages.parquet", row_group_size=ROW_GROUP)
    delivered = [s == "committed" and i % 977 != 4 for i, s in enumerate(broker_state)]  # lost ones
    pick = pa.array(delivered)
    pq.write_table(pa.table({
        "message_id": mids.filter(pick), "consumer_group": pa.array(["points"] * sum(delivered)),
        "topic": pa.array([f"topic{i % 5}" for i in range(n) if delivered[i]]),
        "delivery_attempts": pa.array([1] * sum(delivered), pa.int32()),
        "first_delivered_ms": pa.array([m + 10 for m, d in zip(local_ms, delivered, strict=True) if d]),
        "acked_ms": pa.array([m + 12 for m, d in zip(local_ms, delivered, strict=True) if d]),
        "dead_lettered": pa.array([False] * sum(delivered)), "transaction_id": ids.filter(pick),
    }), folder / "export" / "deliveries.parquet", row_group_size=ROW_GROUP)
    pq.write_table(pa.table({
        "consumer_group": pa.array(["points"] * sum(delivered)), "message_id": mids.filter(pick),
        "topic": pa.array([f"topic{i % 5}" for i in range(n) if delivered[i]]), "transaction_id": ids.filter(pick),
        "consumed_at": pa.array([datetime.fromtimestamp((m + 12) / 1000, UTC)
                                 for m, d in zip(local_ms, delivered, strict=True) if d], pa.timestamp("us", tz="UTC")),
    }), folder / "consumed_message.parquet", row_group_size=ROW_GROUP)


DUCKDB_SQL = """
WITH local AS (SELECT transaction_id, first(state) AS local_state, min(epoch_ms(created_at)) AS local_ms
               FROM '{d}/transaction_log.parquet' GROUP BY transaction_id),
broker AS (SELECT transaction_id, first(state) AS broker_state, max(commit_ms) AS commit_ms, max(copies) AS copies,
                  count(*) AS message_count
           FROM '{d}/export/messages.parquet' WHERE transaction_id IS NOT NULL GROUP BY transaction_id),
delivered AS (SELECT m.transaction_id, count(*) AS delivered, max(d.delivery_attempts) AS attempts
              FROM '{d}/export/deliveries.parquet' d JOIN '{d}/export/messages.parquet' m USING (message_id)
              WHERE m.transaction_id IS NOT NULL GROUP BY m.transaction_id),
consumed AS (SELECT transaction_id, count(*) AS consumed, min(epoch_ms(consumed_at)) AS consumed_ms
             FROM '{d}/consumed_message.parquet' GROUP BY transaction_id),
tx AS (SELECT coalesce(l.transaction_id, b.transaction_id) AS transaction_id, l.local_state, b.broker_state,
              l.local_ms, b.commit_ms, b.copies, b.message_count, coalesce(c.consumed, 0) AS consumed, c.consumed_ms,
              coalesce(v.delivered, 0) AS delivered, coalesce(v.attempts, 0) AS attempts
       FROM local l FULL OUTER JOIN broker b USING (transaction_id)
            LEFT JOIN delivered v USING (transaction_id) LEFT JOIN consumed c USING (transaction_id))
SELECT count(*) AS transactions,
       sum(CASE WHEN local_state = 'COMMITTED' THEN 1 ELSE 0 END) AS committed,
       sum(CASE WHEN (broker_state = 'committed' OR consumed > 0) AND coalesce(local_state, '') <> 'COMMITTED'
                THEN 1 ELSE 0 END) AS phantom,
       sum(CASE WHEN local_state = 'COMMITTED' AND (delivered = 0 OR consumed = 0) THEN 1 ELSE 0 END) AS lost,
       sum(CASE WHEN copies > 1 OR attempts > 1 THEN 1 ELSE 0 END) AS duplicate_delivery,
       quantile_cont(commit_ms - local_ms, 0.5) AS commit_p50,
       quantile_cont(consumed_ms - commit_ms, 0.99) AS consume_p99
FROM tx
"""


def startup(event_log: Path, launched_ms: float) -> tuple[float, float, float]:
    """Seconds from ``launched_ms`` to the application's start, from there to the first job's
    submission, and from there to the application's end, read off one Spark event log."""
    marks: dict[str, float] = {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            marks["app"] = event["Timestamp"]
        elif kind == "SparkListenerJobStart":
            marks.setdefault("job", event["Submission Time"])
        elif kind == "SparkListenerApplicationEnd":
            marks["end"] = event["Timestamp"]
    return ((marks["app"] - launched_ms) / 1000, (marks["job"] - marks["app"]) / 1000,
            (marks["end"] - marks["job"]) / 1000)


SHUFFLE_WRITTEN = "internal.metrics.shuffle.write.bytesWritten"
SHUFFLE_READ = ("internal.metrics.shuffle.read.remoteBytesRead", "internal.metrics.shuffle.read.localBytesRead")


def stages(event_log: Path) -> list[tuple[int, str, float, float, float, float]]:
    """Each completed stage of one Spark event log: id, name, seconds, executor CPU seconds
    (summed over its tasks: what the stage costs whatever else runs on the machine), shuffle
    MB written and read."""
    found, cpu_ns = [], {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskEnd" and event.get("Task Metrics"):
            cpu_ns[event["Stage ID"]] = cpu_ns.get(event["Stage ID"], 0) + event["Task Metrics"]["Executor CPU Time"]
        if event["Event"] != "SparkListenerStageCompleted":
            continue
        info = event["Stage Info"]
        metrics = {item["Name"]: float(item.get("Value") or 0) for item in info.get("Accumulables", [])
                   if isinstance(item.get("Value"), (int, float, str)) and str(item.get("Value")).isdigit()}
        found.append((info["Stage ID"], info["Stage Name"].split(" at ")[0],
                      (info["Completion Time"] - info["Submission Time"]) / 1000, cpu_ns.get(info["Stage ID"], 0) / 1e9,
                      metrics.get(SHUFFLE_WRITTEN, 0) / 1e6, sum(metrics.get(name, 0) for name in SHUFFLE_READ) / 1e6))
    return found


def run_job(folder: Path, out: Path, *options: str, code: str | None = None) -> tuple[float, dict[str, object]]:
    """``python -m outbox.reconcile`` over ``folder``'s inputs with ``options``: wall seconds
    (Spark start included) and its summary; ``code``: a checkout to run instead of this one."""
    env = {**os.environ, "PYTHONPATH": code} if code else None
    start = time.perf_counter()
    job = subprocess.run(
        [sys.executable, "-m", "outbox.reconcile", "--producer-db", f"parquet://{folder / 'transaction_log.parquet'}",
         "--consumer-db", f"parquet://{folder / 'consumed_message.parquet'}",
         "--broker-export", str(folder / "export"), "--out", str(out), "--master", "local[2]",
         "--grace-seconds", "0", "--conf", "spark.driver.memory=6g", *options],
        capture_output=True, text=True, env=env, cwd=code,  # -m puts the working directory first on the path
    )
    wall = time.perf_counter() - start
    if job.returncode not in (0, 1):
        print(job.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the Spark job failed over {folder}")
    return wall, json.loads((out / "summary.json").read_text())


def run_spark(folder: Path, run: str, code: str | None = None) -> tuple[float, dict[str, object],
                                                                      tuple[float, float, float], Path]:
    """One whole job over ``folder``'s inputs: wall seconds, its summary, its start-up, its event log."""
    events = folder / f"events-{run}"
    events.mkdir()
    launched_ms = time.time() * 1000
    wall, summary = run_job(folder, folder / f"out-{run}", "--conf", "spark.eventLog.enabled=true",
                            "--conf", f"spark.eventLog.dir={events.as_uri()}", "--conf", "spark.eventLog.compress=false",
                            "--conf", "spark.eventLog.rolling.enabled=false", code=code)
    (log,) = events.iterdir()
    return wall, summary, startup(log, launched_ms), log


FLOOR_JOBS = ("start", "ids + 1 shuffle")


def floor_job(folder: Path, which: str) -> None:
    """One of ``FLOOR_JOBS`` over ``folder``'s inputs, in this process (run it as a fresh one)."""
    from pyspark.sql import functions as F  # only the floor's own process starts Spark

    from outbox.reconcile.session import build_session

    spark = build_session("local[2]", {"spark.driver.memory": "6g"})
    if which == "start":
        spark.read.parquet(str(folder / "transaction_log.parquet")).where("state = 'none'").count()
    else:
        ids = [spark.read.parquet(str(folder / path)).select("transaction_id")
               for path in ("transaction_log.parquet", "consumed_message.parquet", "export/messages.parquet",
                            "export/deliveries.parquet")]
        union = ids[0].unionByName(ids[1]).unionByName(ids[2]).unionByName(ids[3])
        union.groupBy("transaction_id").count().where(F.col("count") > 100).count()
    spark.stop()


def run_floor(folder: Path, which: str) -> float:
    """Wall seconds of one ``floor_job`` from its process's launch to its end."""
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--floor-job", which, str(folder)], check=True, capture_output=True)
    return time.perf_counter() - start


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def incremental(per_day: int, days: int, repeat: int) -> None:
    """The nightly run over the last day of a ``days``-day history (``--state-dir``, the state
    left by the night before) next to a run over a data set of that day alone, and the
    windowed full run over the whole history; the counts of the last two nights together
    against one full run over both days."""
    end = int(time.time() * 1000) // DAY_MS * DAY_MS
    start, last = end - days * DAY_MS, end - DAY_MS
    root = Path(tempfile.mkdtemp(prefix="hm-reconcile-incr-"))
    try:
        history, alone = root / "history", root / "alone"
        write_inputs(per_day * days, history, start, days)
        write_inputs(per_day, alone, last, 1)
        state = str(root / "state")
        _, before = run_job(history, root / "night-before", "--state-dir", state, "--since", _iso(last - DAY_MS),
                            "--until", _iso(last))
        nights, days_alone, windowed = [], [], []
        for run in range(repeat):  # in turns, so that each sees the same load
            # a rerun of the same night starts from the same state
            nights.append(run_job(history, root / f"night-{run}", "--state-dir", state, "--until", _iso(end)))
            days_alone.append(run_job(alone, root / f"alone-{run}"))
            windowed.append(run_job(history, root / f"windowed-{run}", "--since", _iso(last), "--until", _iso(end)))
        _, both = run_job(history, root / "both", "--since", _iso(last - DAY_MS), "--until", _iso(end))
        night, day, window = (statistics.median(wall for wall, _ in runs) for runs in (nights, days_alone, windowed))
        print(f"\nincremental: {days} days x {per_day:,} transactions; medians of {repeat}")
        for label, wall, runs in (("nightly --state-dir", night, nights), ("that day alone", day, days_alone),
                                  ("--since/--until, full", window, windowed)):
            summary = runs[-1][1]
            print(f"{label:>24}{wall:>9.1f} s  rows read {summary['rows_read']}")
        print(f"{'nightly / day alone':>24}{night / day:>9.2f}")
        counted = before["incremental"]["resolved"]  # type: ignore[index]
        last_night = nights[-1][1]["counts"]
        full = both["counts"]
        equal = all(counted[name] + last_night[name] == full[name] for name in full)  # type: ignore[index]
        print(f"{'counts = full run':>24}  {'yes' if equal else 'NO'}  (full: {full})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; medians are printed")
    parser.add_argument("--incremental", type=int, metavar="PER_DAY", help="also the nightly incremental run "
                        "over the last of --days days of PER_DAY transactions each")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--baseline", help="a checkout of another version (its root folder) to run in turns "
                        "with this one over the same inputs: before/after in one run")
    parser.add_argument("--floor", action="store_true", help="also Spark's floor over the same inputs, in turns")
    parser.add_argument("--floor-job", nargs=2, metavar=("WHICH", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_job:
        floor_job(Path(args.floor_job[1]), args.floor_job[0])
        return
    if args.incremental:
        incremental(args.incremental, args.days, args.repeat)
    if args.sizes:
        print(f"{'transactions':>14}{'spark wall s':>14}{'to app s':>10}{'to job s':>10}{'jobs s':>8}"
              f"{'spark jobs':>12}{'duckdb s':>10}{'ratio':>8}  counts (spark | duckdb)")
    versions = [("this", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    for n in args.sizes:
        folder = Path(tempfile.mkdtemp(prefix="hm-reconcile-bench-"))
        try:
            write_inputs(n, folder)
            runs: dict[str, list[tuple[float, dict[str, object], tuple[float, float, float], Path]]] = {
                label: [] for label, _ in versions}
            floors: dict[str, list[float]] = {which: [] for which in FLOOR_JOBS}
            for run in range(args.repeat):  # the versions in turns, so that both see the same load
                for label, code in versions:
                    runs[label].append(run_spark(folder, f"{label}-{run}", code))
                for which in floors if args.floor else ():
                    floors[which].append(run_floor(folder, which))
            duck = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                row = duckdb.connect().execute(DUCKDB_SQL.format(d=folder)).fetchall()[0]
                duck.append(time.perf_counter() - start)
            duck_s = statistics.median(duck)
            for label, _ in versions:
                done = runs[label]
                spark_s = statistics.median(wall for wall, _, _, _ in done)
                to_app, to_job, jobs = (statistics.median(parts)
                                        for parts in zip(*(marks for _, _, marks, _ in done), strict=True))
                summary = done[-1][1]
                counts = summary["counts"]
                assert isinstance(counts, dict)
                print(f"{n:>14,}{spark_s:>14.1f}{to_app:>10.1f}{to_job:>10.1f}{jobs:>8.1f}"
                      f"{summary.get('spark_jobs', '?'):>12}{duck_s:>10.2f}{spark_s / duck_s:>8.1f}  "
                      f"phantom {counts['phantom']}|{row[2]} lost {counts['lost']}|{row[3]} "
                      f"dup {counts['duplicate_delivery']}|{row[4]}  ({label})", flush=True)
            for which, walls in floors.items() if args.floor else ():
                print(f"  Spark's floor, {which}: {statistics.median(walls):.1f} s from launch "
                      f"({', '.join(f'{wall:.1f}' for wall in walls)}); {statistics.median(walls) / duck_s:.1f}x DuckDB")
            for label, _ in versions:
                cpu = statistics.median(sum(stage[3] for stage in stages(log)) for _, _, _, log in runs[label])
                print(f"  {label}: executor CPU s, all stages, median of {len(runs[label])}: {cpu:.1f}")
            for label, _ in versions:
                median_run = sorted(runs[label], key=lambda done: done[0])[len(runs[label]) // 2]
                print(f"  stages of the median {label} run: id, seconds, CPU s, shuffle MB written / read, name")
                for stage, name, seconds, cpu_s, written, read in stages(median_run[3]):
                    print(f"  {stage:>4}{seconds:>8.1f}{cpu_s:>8.1f}{written:>9.1f}{read:>9.1f}  {name}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

if __name__ == "__main__":
    main()
