"""The summary's numbers from the classified table in one small aggregation.

Each transaction becomes at most five rows: one carrying its flags, and one per latency
hop carrying the hop's value rounded to a *fine bucket* (exact below one second, three
significant digits above: at most 0.1 % off). They are grouped by topic, hour, hop and
bucket, which leaves a few thousand rows whatever the number of transactions; the driver
adds them up overall, per topic and per hour, and reads percentiles and histograms off the
fine buckets. Everything hashes (integer keys, sums and maxima), nothing is sorted, and no
grouping set multiplies the transactions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from .classify import ANOMALIES
from .preflight import GATES

HOPS = ("commit_latency_ms", "consume_latency_ms", "end_to_end_ms", "relay_latency_ms")
#: Latency histogram bucket edges (ms), roughly logarithmic.
BUCKETS_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
#: The ``hop`` of the row that carries a transaction's flags.
FLAGS_ROW = -1
#: Sums taken over the flag rows, besides the flags themselves.
TOTALS = ("deliveries", "consumptions", "stored", "stored_messages", "transaction_ids_in_several_producer_rows",
          "transaction_ids_with_conflicting_local_states", "consumed_duplicate_keys")
DERIVED_SANITY = ("transaction_ids_in_several_producer_rows", "transaction_ids_with_conflicting_local_states",
                  "clock_skew", "consumed_duplicate_keys")


def fine_bucket(value: Column) -> Column:
    """A latency rounded down to its fine bucket: exact below 1,000 ms, three significant
    digits above; null for a negative one (clock skew, counted apart)."""
    scale = F.pow(F.lit(10.0), F.floor(F.log10(value)) - 2)
    rounded = F.when(value < 1000, value).otherwise(F.floor(value / scale) * scale)
    return F.when(value >= 0, rounded.cast("long"))


def aggregate(classified: DataFrame) -> DataFrame:
    """Flags and latency buckets grouped by topic, hour, hop and bucket (see the module),
    apart for the transactions an incremental run carries over (``carried``)."""
    committed = F.col("committed")
    flag_row = F.struct(F.lit(FLAGS_ROW).alias("hop"), F.lit(None).cast("long").alias("bucket"))
    hop_rows = [F.struct(F.lit(index).alias("hop"), F.when(committed, fine_bucket(F.col(hop))).alias("bucket"))
                for index, hop in enumerate(HOPS)]
    rows = classified.select(
        "*", F.explode(F.filter(F.array(flag_row, *hop_rows),
                                lambda row: (row["hop"] == FLAGS_ROW) | row["bucket"].isNotNull())).alias("row"),
    ).select("*", F.col("row.hop").alias("hop"), F.col("row.bucket").alias("bucket"))
    is_flags = F.col("hop") == FLAGS_ROW

    def total(condition: Column) -> Column:
        return F.count_if(is_flags & condition)

    return rows.groupBy("carried", "topic_code", "hour_ms", "hop", "bucket").agg(
        F.count(F.lit(1)).alias("n"),
        total(committed).alias("committed_n"),
        *[total(F.col(flag)).alias(flag) for flag in GATES],
        F.sum(F.when(is_flags, F.col("delivered"))).alias("deliveries"),
        F.sum(F.when(is_flags, F.col("consumed"))).alias("consumptions"),
        total(F.col("stored") > 0).alias("stored"),
        F.sum(F.when(is_flags, F.col("stored"))).alias("stored_messages"),
        total(F.col("local_rows") > 1).alias("transaction_ids_in_several_producer_rows"),
        total(F.col("conflicting_local_states")).alias("transaction_ids_with_conflicting_local_states"),
        F.sum(F.when(is_flags, F.col("consumed_duplicate_keys"))).alias("consumed_duplicate_keys"),
        *[F.max(F.when(is_flags & committed, F.col(hop))).alias(f"{hop}_max") for hop in HOPS],
    )


class _Group:
    """The sums, maxima and fine latency distributions of one set of grouped rows."""

    def __init__(self) -> None:
        self.sums: dict[str, int] = defaultdict(int)
        self.maxima: dict[str, int | None] = dict.fromkeys(HOPS)
        self.latencies: dict[str, dict[int, int]] = {hop: defaultdict(int) for hop in HOPS}

    def add(self, row: Row) -> None:
        if row["hop"] != FLAGS_ROW:
            self.latencies[HOPS[row["hop"]]][row["bucket"]] += row["n"]
            return
        self.sums["transactions"] += row["n"]
        for name in ("committed_n", *GATES, *TOTALS):
            self.sums[name] += int(row[name] or 0)
        for hop in HOPS:
            value = row[f"{hop}_max"]
            current = self.maxima[hop]
            if value is not None and (current is None or value > current):
                self.maxima[hop] = value

    def latency(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"transactions": self.sums["committed_n"]}
        for hop in HOPS:
            entry[hop] = {**percentiles(self.latencies[hop]), "max": self.maxima[hop]}
        return entry

    def histogram(self, hop: str) -> list[int]:
        counts = [0] * len(BUCKETS_MS)
        for bucket, n in self.latencies[hop].items():
            counts[sum(1 for edge in BUCKETS_MS[1:] if bucket >= edge)] += n
        return counts


def percentiles(distribution: dict[int, int]) -> dict[str, int | None]:
    """The nearest-rank percentiles of a fine-bucket distribution (None when empty)."""
    total = sum(distribution.values())
    result: dict[str, int | None] = dict.fromkeys(name for name, _ in PERCENTILES)
    if not total:
        return result
    ordered = sorted(distribution.items())
    for name, fraction in PERCENTILES:
        rank, seen = max(1, int(fraction * total + 0.999999)), 0
        for bucket, n in ordered:
            seen += n
            if seen >= rank:
                result[name] = bucket
                break
    return result


def _hour(hour_ms: int) -> str:
    return datetime.fromtimestamp(hour_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _grouped(rows: Iterable[Row], key: str) -> dict[Any, _Group]:
    groups: dict[Any, _Group] = defaultdict(_Group)
    for row in rows:
        groups[row[key]].add(row)
    return groups


def summarise(rows: list[Row], topics: dict[int, str]) -> dict[str, Any]:
    """Counts, latencies overall / per topic / per hour, histograms and derived sanity."""
    overall = _Group()
    for row in rows:
        overall.add(row)
    by_topic = sorted(((topics.get(code, "?"), group) for code, group in _grouped(rows, "topic_code").items()),
                      key=lambda pair: pair[0])
    by_hour = sorted(_grouped(rows, "hour_ms").items(), key=lambda pair: pair[0] or 0)
    sums = overall.sums
    return {
        "counts": {"transactions": sums["transactions"], **{flag: sums[flag] for flag in GATES},
                   "deliveries": sums["deliveries"], "consumptions": sums["consumptions"],
                   "stored": sums["stored"], "stored_messages": sums["stored_messages"]},
        "latency_ms": overall.latency(),
        "per_topic": [{"topic": name, **group.latency()} for name, group in by_topic if group.sums["committed_n"]],
        "per_hour": [{"hour": _hour(hour), **group.latency()} for hour, group in by_hour
                     if hour is not None and group.sums["committed_n"]],
        "per_topic_counts": [{"topic": name, "transactions": group.sums["transactions"],
                              **{a: group.sums[a] for a in ANOMALIES}} for name, group in by_topic],
        "timeline": [{"hour": _hour(hour), "transactions": group.sums["transactions"],
                      "anomalies": sum(group.sums[a] for a in ANOMALIES)} for hour, group in by_hour
                     if hour is not None],
        "histogram_buckets_ms": list(BUCKETS_MS),
        "histograms": {hop: overall.histogram(hop) for hop in HOPS},
        "derived_sanity": {name: sums[name] for name in DERIVED_SANITY},
    }
