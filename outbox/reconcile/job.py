"""The reconciliation job: read, classify, summarise, write the outputs.

Three Spark actions whatever the size: the per-transaction table is built in one pass
(see ``classify``) and kept; one aggregation over grouping sets gives the counts, the
percentiles overall, per topic and per hour, the histograms and the derived sanity
counts; one partitioned write stores every anomalous transaction under
``anomalies/category=<name>/``. The report's samples are read back from those files.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlalchemy.engine import make_url

from .classify import ANOMALIES, classify, events, per_transaction
from .inputs import TimeWindow, read_export, union_tables, use_jdbc
from .preflight import (
    CONSUMED_MESSAGE,
    GATES,
    POSTGRES_READS,
    STORED_MESSAGE,
    TRANSACTION_LOG,
    export_files,
)
from .report import write_html
from .summary import aggregate, summarise

#: The Spark job group of one run, so that the summary can say how many jobs it took.
JOB_GROUP = "halfmoon-reconcile"
#: Anomalous transactions listed per category in the summary and the report.
SAMPLES = 100
DEFAULT_THRESHOLDS = {"lost": 0, "phantom": 0, "duplicate_effect": 0, "conflict": 0, "unrelayed_stale": 0}
#: How long a stored message may wait for the relay before it is ``unrelayed_stale`` (s).
DEFAULT_MAX_UNRELAYED_S = 3600.0


@dataclass
class ReconcileInputs:
    """Where the data is: database URLs (SQLAlchemy form) and the broker export directory."""

    producer_databases: list[str]
    consumer_databases: list[str]
    broker_export: str


@dataclass
class ReconcileOptions:
    """Output directory, time window (epoch ms), grace period, how long a stored message may
    wait for the relay (``max_unrelayed_s``), pass/fail thresholds, and how PostgreSQL is
    read (``postgres_read``: ``auto``, ``jdbc`` or ``sqlalchemy``; see ``inputs.use_jdbc``)."""

    out_dir: str
    since_ms: int | None = None
    until_ms: int | None = None
    grace_s: float = 60.0
    max_unrelayed_s: float = DEFAULT_MAX_UNRELAYED_S
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
        if self.grace_s < 0 or self.max_unrelayed_s < 0 or any(limit < 0 for limit in self.thresholds.values()):
            raise ValueError("grace period, max unrelayed seconds and thresholds must not be negative")


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


def _labels(urls: list[str]) -> list[str]:
    """How a database appears in the outputs (its URL without a password)."""
    return [url if url.startswith("parquet://") else make_url(url).render_as_string(hide_password=True)
            for url in urls]


def _delivery_ids_known(export_dir: str) -> bool:
    """Whether the export's deliveries carry transaction ids (exports since they were added)."""
    path = export_files(export_dir)["deliveries"]
    if path.suffix == ".parquet":
        return "transaction_id" in ds.dataset(path).schema.names
    with path.open(encoding="utf-8") as lines:
        first = lines.readline()
    return not first or "transaction_id" in json.loads(first)


def _write_anomalies(classified: DataFrame, topics: dict[int, str], producers: list[str],
                     consumers: list[str], folder: Path) -> None:
    """Every anomalous transaction once per category it is in, partitioned by category."""
    names = F.create_map(*[F.lit(x) for pair in topics.items() for x in pair]) if topics else None
    categories = F.filter(F.array(*[F.when(F.col(a), F.lit(a)) for a in ANOMALIES]), lambda c: c.isNotNull())
    anomalous = classified.where(F.exists(categories, lambda c: c.isNotNull()))
    rows = anomalous.select(
        "*",
        (F.coalesce(F.element_at(names, F.col("topic_code")), F.lit("?")) if names is not None else F.lit("?"))
        .alias("topic"),
        _databases("producer_bits", producers).alias("producer_databases"),
        _databases("consumer_bits", consumers).alias("consumer_databases"),
        F.explode(categories).alias("category"),
    )
    rows.write.mode("overwrite").partitionBy("category").parquet(str(folder))


def _databases(bits: str, labels: list[str]) -> Column:
    """A database bit mask as the list of their labels."""
    present = [F.when((F.col(bits).bitwiseAND(F.lit(1 << i))) != 0, F.lit(label)) for i, label in enumerate(labels)]
    if not present:
        return F.array().cast("array<string>")
    return F.filter(F.array(*present), lambda label: label.isNotNull())


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _samples(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The first ``SAMPLES`` anomalous transactions of each category, from the written files."""
    if not folder.exists():
        return {}
    dataset = ds.dataset(folder, format="parquet", partitioning="hive")
    if "category" not in dataset.schema.names:
        return {}
    columns = ["transaction_id", "topic", "local_state", "broker_state", "local_ms", "commit_ms",
               "consumed_ms", "producer_databases", "consumer_databases", "delivered", "consumed", "stored",
               "oldest_unrelayed_ms"]
    samples = {}
    for category in ANOMALIES:
        rows = dataset.to_table(columns=columns, filter=ds.field("category") == category).slice(0, SAMPLES)
        samples[category] = [
            {"transaction_id": r["transaction_id"], "topic": r["topic"], "local_state": r["local_state"],
             "broker_state": r["broker_state"], "local_time": _iso(r["local_ms"]), "commit_time": _iso(r["commit_ms"]),
             "consumed_time": _iso(r["consumed_ms"]), "producer_databases": r["producer_databases"] or [],
             "consumer_databases": r["consumer_databases"] or [], "delivered": r["delivered"] or 0,
             "consumed": r["consumed"] or 0, "stored": r["stored"] or 0,
             "oldest_unrelayed_time": _iso(r["oldest_unrelayed_ms"])}
            for r in sorted(rows.to_pylist(), key=lambda r: r["transaction_id"])
        ]
    return samples


#: How far around a --since/--until window the inputs are read, so that each transaction
#: of the window is seen whole (its half message is stored before its local commit; a
#: producer row and its broker messages are minutes apart at most).
WINDOW_MARGIN_MS = 3_600_000


def _windows(options: ReconcileOptions) -> tuple[TimeWindow | None, TimeWindow | None]:
    """What to read for a windowed run: producer rows and broker messages around the window,
    deliveries and consumptions from its start on (they may come any time later)."""
    if options.since_ms is None and options.until_ms is None:
        return None, None
    margin = max(WINDOW_MARGIN_MS, int(options.grace_s * 1000))
    low = None if options.since_ms is None else options.since_ms - margin
    high = None if options.until_ms is None else options.until_ms + margin
    return TimeWindow(low, high), TimeWindow(low, None)


#: Session settings for the length of a run: adaptive execution may merge the partitions
#: of the kept per-transaction table (else a small run pays for every shuffle partition).
RUN_SETTINGS = {"spark.sql.adaptive.enabled": "true",
                "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true"}


@contextmanager
def _settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` on the session while the block runs, the caller's values after."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, previous in before.items():
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)


def reconcile(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions) -> ReconcileResult:
    """Run the job; writes summary.json, anomalies/category=<name>/ (Parquet) and report.html."""
    with _settings(spark, RUN_SETTINGS):
        return _run(spark, inputs, options)


def _run(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions) -> ReconcileResult:
    progress = _Progress()
    spark.sparkContext.setJobGroup(JOB_GROUP, "halfmoon reconciliation")
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now_ms = options.now_ms or int(time.time() * 1000)
    jdbc = use_jdbc(spark, options.postgres_read, [*inputs.producer_databases, *inputs.consumer_databases],
                    options.jdbc_partitions)
    around, onwards = _windows(options)
    transaction_log = union_tables(spark, inputs.producer_databases, TRANSACTION_LOG, options.jdbc_partitions,
                                   jdbc, around)
    stored = union_tables(spark, inputs.producer_databases, STORED_MESSAGE, options.jdbc_partitions, jdbc, around)
    consumed = union_tables(spark, inputs.consumer_databases, CONSUMED_MESSAGE, options.jdbc_partitions, jdbc,
                            onwards)
    messages, deliveries = read_export(spark, inputs.broker_export, onwards)
    if around is not None and around.high_ms is not None:  # a filter Spark pushes into the scan
        messages = messages.where(F.col("store_ms") < around.high_ms)
    producers, consumers = _labels(inputs.producer_databases), _labels(inputs.consumer_databases)
    rows, observed = events(transaction_log, messages, deliveries, consumed, stored, producers, consumers,
                            _delivery_ids_known(inputs.broker_export))
    # Kept for the two actions below: the narrow per-transaction table, not the classified one
    transactions = per_transaction(rows).persist(StorageLevel.DISK_ONLY)
    classified = classify(transactions, now_ms, int(options.grace_s * 1000), bool(inputs.consumer_databases),
                          int(options.max_unrelayed_s * 1000), around.high_ms if around is not None else None)
    if options.since_ms is not None:
        classified = classified.where(F.col("event_ms") >= options.since_ms)
    if options.until_ms is not None:
        classified = classified.where(F.col("event_ms") < options.until_ms)
    progress("reading the producer databases, the consumer databases and the broker export; classifying")
    result = summarise(aggregate(classified).collect(), observed.topics())
    counts = result.pop("counts")
    checks = {**observed.sanity(), **result.pop("derived_sanity")}
    progress(f"{counts['transactions']} transactions classified; writing the anomalous ones")
    _write_anomalies(classified, observed.topics(), producers, consumers, out / "anomalies")
    transactions.unpersist()
    total = max(counts["transactions"], 1)
    breached = {name: counts.get(name, 0) for name, limit in options.thresholds.items()
                if counts.get(name, 0) > limit}
    summary: dict[str, Any] = {
        "generated_at_ms": now_ms,
        "inputs": asdict(inputs),
        "window": {"since_ms": options.since_ms, "until_ms": options.until_ms, "grace_s": options.grace_s,
                   "max_unrelayed_s": options.max_unrelayed_s},
        "counts": counts,
        "rates": {flag: counts[flag] / total for flag in GATES},
        "anomalies": {category: counts[category] for category in ANOMALIES},
        "anomaly_samples": _samples(out / "anomalies"),
        "thresholds": options.thresholds,
        "breached": breached,
        "passed": not breached,
        **result,
        "sanity": checks,
        "seconds": round(time.monotonic() - progress.started, 2),
        "spark_jobs": len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP)),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_html(summary, out / "report.html")
    progress(f"done in {summary['seconds']}s: {'PASS' if summary['passed'] else 'FAIL ' + str(breached)}")
    return ReconcileResult(summary, not breached, out)
