"""The reconciliation job: read, classify, summarise, write the outputs."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from .classify import ANOMALIES, GATES, classify, sanity
from .inputs import (
    CONSUMED_MESSAGE,
    POSTGRES_READS,
    TRANSACTION_LOG,
    read_export,
    union_tables,
    use_jdbc,
)
from .report import write_html

HOPS = ("commit_latency_ms", "consume_latency_ms", "end_to_end_ms")
#: Latency histogram bucket edges (ms), roughly logarithmic.
BUCKETS_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
#: The Spark job group of one run, so that the summary can say how many jobs it took.
JOB_GROUP = "halfmoon-reconcile"
DEFAULT_THRESHOLDS = {"lost": 0, "phantom": 0, "duplicate_effect": 0, "conflict": 0}


@dataclass
class ReconcileInputs:
    """Where the data is: database URLs (SQLAlchemy form) and the broker export directory."""

    producer_databases: list[str]
    consumer_databases: list[str]
    broker_export: str


@dataclass
class ReconcileOptions:
    """Output directory, time window (epoch ms), grace period, pass/fail thresholds, and how
    PostgreSQL is read (``postgres_read``: ``auto``, ``jdbc`` or ``sqlalchemy``; see
    ``inputs.use_jdbc``)."""

    out_dir: str
    since_ms: int | None = None
    until_ms: int | None = None
    grace_s: float = 60.0
    now_ms: int | None = None
    thresholds: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    jdbc_partitions: int = 4
    postgres_read: str = "auto"

    def __post_init__(self) -> None:
        if self.postgres_read not in POSTGRES_READS:
            raise ValueError(f"postgres_read must be one of {', '.join(POSTGRES_READS)}, "
                             f"got {self.postgres_read!r}")
        unknown = sorted(set(self.thresholds) - set(GATES))
        if unknown:
            raise ValueError(f"unknown thresholds {unknown}; known: {', '.join(GATES)}")
        if self.grace_s < 0 or any(limit < 0 for limit in self.thresholds.values()):
            raise ValueError("grace period and thresholds must not be negative")


@dataclass
class ReconcileResult:
    """The summary (also in summary.json) and where the outputs are."""

    summary: dict[str, Any]
    passed: bool
    out_dir: Path


class _Progress:
    """Stage lines on stderr, timed from the start of the job."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[reconcile {time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)


def _latency(row: Row) -> dict[str, Any]:
    entry: dict[str, Any] = {"transactions": int(row["committed_n"] or 0)}
    for hop in HOPS:
        p = row[f"{hop}_p"] or [None, None, None]
        entry[hop] = {"p50": p[0], "p90": p[1], "p99": p[2], "max": row[f"{hop}_max"]}
    return entry


def _breakdowns(classified: DataFrame) -> dict[str, Any]:
    """Latency percentiles (committed transactions) and anomaly counts overall, per topic
    and per hour, as one aggregation over grouping sets: one pass over the data."""
    committed = F.col("committed")
    aggregates = [F.grouping("topic").alias("all_topics"), F.grouping("hour").alias("all_hours"),
                  F.count(F.lit(1)).alias("transactions"), F.sum(committed.cast("int")).alias("committed_n")]
    for hop in HOPS:
        value = F.when(committed, F.col(hop))
        aggregates += [F.percentile_approx(value, [0.5, 0.9, 0.99], 1000).alias(f"{hop}_p"),
                       F.max(value).alias(f"{hop}_max")]
    aggregates += [F.sum(F.col(a).cast("int")).alias(a) for a in ANOMALIES]
    rows = classified.groupingSets([[], ["topic"], ["hour"]], "topic", "hour").agg(*aggregates).collect()
    overall = [r for r in rows if r["all_topics"] and r["all_hours"]]
    topics = sorted((r for r in rows if not r["all_topics"]), key=lambda r: str(r["topic"]))
    hours = sorted((r for r in rows if not r["all_hours"]), key=lambda r: str(r["hour"]))
    return {
        "latency_ms": _latency(overall[0]) if overall else {},
        "per_topic": [{"topic": str(r["topic"]), **_latency(r)} for r in topics if r["committed_n"]],
        "per_hour": [{"hour": str(r["hour"]), **_latency(r)} for r in hours if r["committed_n"]],
        "per_topic_counts": [{"topic": r["topic"], "transactions": r["transactions"],
                              **{a: int(r[a] or 0) for a in ANOMALIES}} for r in topics],
        "timeline": [{"hour": str(r["hour"]), "transactions": r["transactions"],
                      "anomalies": sum(int(r[a] or 0) for a in ANOMALIES)} for r in hours],
    }


def _histograms(frame: DataFrame) -> dict[str, list[int]]:
    edges = list(BUCKETS_MS)
    expressions = []
    for hop in HOPS:
        bucket = F.lit(len(edges) - 1)
        for index in range(len(edges) - 1, 0, -1):
            bucket = F.when(F.col(hop) < edges[index], F.lit(index - 1)).otherwise(bucket)
        # Negative latencies are clock skew (counted apart), not a bucket.
        expressions.append(F.when(F.col(hop) >= 0, bucket).alias(hop))
    # Every bucket of every hop in one aggregation: one pass over the data.
    sums = [F.sum(F.when(F.col(hop) == index, 1).otherwise(0)).alias(f"{hop}_{index}")
            for hop in HOPS for index in range(len(edges))]
    row = frame.select(*expressions).agg(*sums).collect()[0]
    return {hop: [int(row[f"{hop}_{index}"] or 0) for index in range(len(edges))] for hop in HOPS}


def reconcile(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions) -> ReconcileResult:
    """Run the job; writes summary.json, anomalies/<category>/ (Parquet) and report.html."""
    progress = _Progress()
    spark.sparkContext.setJobGroup(JOB_GROUP, "halfmoon reconciliation")
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now_ms = options.now_ms or int(time.time() * 1000)
    progress("reading producer databases, consumer databases and the broker export")
    jdbc = use_jdbc(spark, options.postgres_read, [*inputs.producer_databases, *inputs.consumer_databases])
    transaction_log = union_tables(spark, inputs.producer_databases, TRANSACTION_LOG, options.jdbc_partitions, jdbc)
    consumed = union_tables(spark, inputs.consumer_databases, CONSUMED_MESSAGE, options.jdbc_partitions, jdbc)
    messages, deliveries = read_export(spark, inputs.broker_export)
    progress("classifying transactions")
    classified = classify(transaction_log, messages, deliveries, consumed, now_ms,
                          int(options.grace_s * 1000), bool(inputs.consumer_databases))
    if options.since_ms is not None:
        classified = classified.where(F.col("event_ms") >= options.since_ms)
    if options.until_ms is not None:
        classified = classified.where(F.col("event_ms") < options.until_ms)
    classified = classified.cache()
    counts_row = classified.agg(
        F.count(F.lit(1)).alias("transactions"),
        *[F.sum(F.col(flag).cast("int")).alias(flag) for flag in GATES],
        F.sum("delivered").alias("deliveries"),
        F.sum("consumed").alias("consumptions"),
    ).collect()[0]
    counts = {k: int(v or 0) for k, v in counts_row.asDict().items()}
    total = max(counts["transactions"], 1)
    progress(f"{counts['transactions']} transactions classified; computing latencies")
    breakdowns = _breakdowns(classified)
    progress("latency histograms")
    histograms = _histograms(classified.where(F.col("committed")))
    progress("writing anomalies")
    anomaly_counts = {}
    for category in ANOMALIES:
        anomaly_counts[category] = counts[category]
        classified.where(F.col(category)).write.mode("overwrite").parquet(str(out / "anomalies" / category))
    progress("input sanity checks")
    checks = sanity(transaction_log, messages, consumed, classified)
    breached = {name: counts.get(name, 0) for name, limit in options.thresholds.items()
                if counts.get(name, 0) > limit}
    summary: dict[str, Any] = {
        "generated_at_ms": now_ms,
        "inputs": asdict(inputs),
        "window": {"since_ms": options.since_ms, "until_ms": options.until_ms, "grace_s": options.grace_s},
        "counts": counts,
        "rates": {flag: counts[flag] / total for flag in GATES},
        "anomalies": anomaly_counts,
        "thresholds": options.thresholds,
        "breached": breached,
        "passed": not breached,
        **breakdowns,
        "histogram_buckets_ms": list(BUCKETS_MS),
        "histograms": histograms,
        "sanity": checks,
        "seconds": round(time.monotonic() - progress.started, 2),
        "spark_jobs": len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP)),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_html(summary, out / "report.html")
    classified.unpersist()
    progress(f"done in {summary['seconds']}s: {'PASS' if summary['passed'] else 'FAIL ' + str(breached)}")
    return ReconcileResult(summary, not breached, out)
