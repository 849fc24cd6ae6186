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

from ..errors import ConfigurationError
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
from .state import (
    CARRIED_REREAD,
    DEFAULT_MAX_CARRY_S,
    RESOLVED,
    Carry,
    carried,
    carried_ids,
    only_carried,
    plan,
    read_rows,
    save,
)
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
    read (``postgres_read``: ``auto``, ``jdbc`` or ``sqlalchemy``; see ``inputs.use_jdbc``).
    With ``state_dir`` the run is incremental (see ``state``): it reconciles from where the
    last run there ended (the first: from ``since_ms``) to ``until_ms`` (default: now), and
    carries transactions still open for at most ``max_carry_s``."""

    out_dir: str
    since_ms: int | None = None
    until_ms: int | None = None
    grace_s: float = 60.0
    max_unrelayed_s: float = DEFAULT_MAX_UNRELAYED_S
    now_ms: int | None = None
    thresholds: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    jdbc_partitions: int = 4
    postgres_read: str = "auto"
    state_dir: str | None = None
    max_carry_s: float = DEFAULT_MAX_CARRY_S

    def __post_init__(self) -> None:
        if self.postgres_read not in POSTGRES_READS:
            raise ValueError(f"postgres_read must be one of {', '.join(POSTGRES_READS)}, "
                             f"got {self.postgres_read!r}")
        unknown = sorted(set(self.thresholds) - set(GATES))
        if unknown:
            raise ValueError(f"unknown thresholds {unknown}; known: {', '.join(GATES)}")
        if self.grace_s < 0 or self.max_unrelayed_s < 0 or self.max_carry_s < 0 or any(limit < 0 for limit in self.thresholds.values()):
            raise ValueError("grace period, max unrelayed seconds, max carry and thresholds must not be negative")


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


def _margin(options: ReconcileOptions) -> int:
    return max(WINDOW_MARGIN_MS, int(options.grace_s * 1000))


def _windows(options: ReconcileOptions) -> tuple[TimeWindow | None, TimeWindow | None]:
    """What to read for a windowed run: producer rows and broker messages around the window,
    deliveries and consumptions from its start on (they may come any time later)."""
    if options.since_ms is None and options.until_ms is None:
        return None, None
    margin = _margin(options)
    low = None if options.since_ms is None else options.since_ms - margin
    high = None if options.until_ms is None else options.until_ms + margin
    return TimeWindow(low, high), TimeWindow(low, None)


#: Session settings for the length of a run: adaptive execution may merge the partitions
#: of the kept per-transaction table (else a small run pays for every shuffle partition).
RUN_SETTINGS = {"spark.sql.adaptive.enabled": "true",
                "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true"}
#: Session settings for the length of a run unless the session has its own: the kept
#: per-transaction table is written and read back once each, so encoding its columns
#: costs more than it saves (at 1M, 6-8 s CPU to build it encoded, 3-3.5 s plain).
RUN_DEFAULTS = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


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
    unset = {key: value for key, value in RUN_DEFAULTS.items() if spark.conf.get(key, None) is None}
    with _settings(spark, {**RUN_SETTINGS, **unset}):
        return _run(spark, inputs, options)


@dataclass
class _Read:
    """The five inputs of a run, the rows it carries in, and the window it classifies."""

    transaction_log: DataFrame
    stored: DataFrame
    consumed: DataFrame
    messages: DataFrame
    deliveries: DataFrame
    carried_in: DataFrame | None
    since_ms: int | None
    until_ms: int | None
    #: Where the broker's messages read stop (see ``classify``).
    seen_until_ms: int | None


def _read_window(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions, jdbc: bool) -> _Read:
    """A full run: all of history, or around ``--since/--until`` (see ``_windows``)."""
    around, onwards = _windows(options)
    partitions = options.jdbc_partitions
    messages, deliveries = read_export(spark, inputs.broker_export, onwards)
    if around is not None and around.high_ms is not None:  # a filter Spark pushes into the scan
        messages = messages.where(F.col("store_ms") < around.high_ms)
    return _Read(union_tables(spark, inputs.producer_databases, TRANSACTION_LOG, partitions, jdbc, around),
                 union_tables(spark, inputs.producer_databases, STORED_MESSAGE, partitions, jdbc, around),
                 union_tables(spark, inputs.consumer_databases, CONSUMED_MESSAGE, partitions, jdbc, onwards),
                 messages, deliveries, None, options.since_ms, options.until_ms,
                 around.high_ms if around is not None else None)


def _read_increment(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions, jdbc: bool,
                    carry: Carry, until_ms: int) -> _Read:
    """An incremental run (see ``state``): the append-only inputs in the window (the first
    run from a margin before it, as a full run reads), the changeable ones also before it
    for the carried transactions."""
    if not _delivery_ids_known(inputs.broker_export):
        raise ConfigurationError(f"--state-dir needs a broker export whose deliveries carry transaction_id; "
                                 f"{inputs.broker_export} is from an older broker: run without --state-dir")
    first = carry.rows is None
    window = TimeWindow(carry.from_ms - (_margin(options) if first else 0), until_ms)
    changeable = TimeWindow(min(window.low_ms or carry.refresh_ms, carry.refresh_ms), until_ms)
    rows = read_rows(spark, carry)
    ids = carried_ids(rows)
    partitions = options.jdbc_partitions
    messages, deliveries = read_export(spark, inputs.broker_export, changeable)
    stored = union_tables(spark, inputs.producer_databases, STORED_MESSAGE, partitions, jdbc, changeable)
    return _Read(union_tables(spark, inputs.producer_databases, TRANSACTION_LOG, partitions, jdbc, window),
                 only_carried(stored, "created_at", carry, ids),
                 union_tables(spark, inputs.consumer_databases, CONSUMED_MESSAGE, partitions, jdbc, window),
                 only_carried(messages, "store_ms", carry, ids), only_carried(deliveries, "first_delivered_ms",
                                                                             carry, ids),
                 rows, carry.history_ms, until_ms, until_ms)


def _run(spark: SparkSession, inputs: ReconcileInputs, options: ReconcileOptions) -> ReconcileResult:
    progress = _Progress()
    spark.sparkContext.setJobGroup(JOB_GROUP, "halfmoon reconciliation")
    out = Path(options.out_dir)
    now_ms = options.now_ms or int(time.time() * 1000)
    carry, until_ms = None, options.until_ms if options.until_ms is not None else now_ms
    if options.state_dir is not None:
        carry = plan(Path(options.state_dir), options.since_ms, until_ms)
    out.mkdir(parents=True, exist_ok=True)
    jdbc = use_jdbc(spark, options.postgres_read, [*inputs.producer_databases, *inputs.consumer_databases],
                    options.jdbc_partitions)
    read = (_read_increment(spark, inputs, options, jdbc, carry, until_ms) if carry is not None
            else _read_window(spark, inputs, options, jdbc))
    producers, consumers = _labels(inputs.producer_databases), _labels(inputs.consumer_databases)
    rows, observed = events(read.transaction_log, read.messages, read.deliveries, read.consumed, read.stored,
                            producers, consumers, _delivery_ids_known(inputs.broker_export))
    if read.carried_in is not None:
        rows = rows.add(read.carried_in)
    if carry is not None:  # read again for the carry-over: kept, not read twice
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    # Kept for the two actions below: the narrow per-transaction table, not the classified one
    transactions = per_transaction(rows).persist(StorageLevel.DISK_ONLY)
    grace_ms = int(options.grace_s * 1000)
    classified = classify(transactions, now_ms, grace_ms, bool(inputs.consumer_databases),
                          int(options.max_unrelayed_s * 1000), read.seen_until_ms)
    if read.since_ms is not None:
        classified = classified.where(F.col("event_ms") >= read.since_ms)
    if read.until_ms is not None:
        classified = classified.where(F.col("event_ms") < read.until_ms)
    open_ = F.lit(RESOLVED)
    if carry is not None and read.until_ms is not None:
        open_ = carried(min(now_ms, read.until_ms), grace_ms, bool(inputs.consumer_databases),
                        int(options.max_carry_s * 1000))
    classified = classified.withColumn("carried", open_)
    progress("reading the producer databases, the consumer databases and the broker export; classifying")
    grouped = aggregate(classified).collect()
    result = summarise(grouped, observed.topics())
    counts = result.pop("counts")
    checks = {**observed.sanity(), **result.pop("derived_sanity")}
    progress(f"{counts['transactions']} transactions classified; writing the anomalous ones")
    _write_anomalies(classified, observed.topics(), producers, consumers, out / "anomalies")
    incremental = None
    if carry is not None and read.until_ms is not None and options.state_dir is not None:
        progress("keeping the open transactions for the next run")
        oldest = min((row["hour_ms"] for row in grouped if row["carried"] == CARRIED_REREAD),
                     default=read.until_ms)
        incremental = {
            "state_dir": options.state_dir, "history_since_ms": carry.history_ms, "from_ms": carry.from_ms,
            "until_ms": read.until_ms,
            "carried_in": carry.carried,
            "carried_out": save(Path(options.state_dir), rows.all(), classified, carry, read.until_ms,
                                oldest - _margin(options)),
            "resolved": summarise([row for row in grouped if not row["carried"]], {})["counts"],
        }
        rows.unpersist()
    transactions.unpersist()
    total = max(counts["transactions"], 1)
    breached = {name: counts.get(name, 0) for name, limit in options.thresholds.items()
                if counts.get(name, 0) > limit}
    summary: dict[str, Any] = {
        "generated_at_ms": now_ms,
        "inputs": asdict(inputs),
        "window": {"since_ms": carry.from_ms if carry is not None else options.since_ms,
                   "until_ms": read.until_ms, "grace_s": options.grace_s, "max_unrelayed_s": options.max_unrelayed_s},
        "rows_read": observed.rows_read(),
        "incremental": incremental,
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
