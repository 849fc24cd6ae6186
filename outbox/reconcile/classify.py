"""Classify every transaction: one row per transaction id with independent flags and latencies.

Flags:

* ``committed`` / ``rolled_back``: the producer's transaction_log says so (a rollback may
  also be known only to the broker, when the fence row is absent);
* ``half_pending`` / ``parked``: the broker still holds the half message(s);
* ``delivered`` / ``consumed``: how many deliveries (message x consumer group) and
  consumed_message rows there are;
* ``phantom``: committed at the broker or consumed, but not committed locally;
* ``lost``: committed locally before the grace period, and never delivered by the broker
  to any group, or (when consumer databases are given) never consumed;
* ``duplicate_delivery``: the broker wrote the message more than once, or a group received
  it more than once;
* ``duplicate_effect``: a consumer group recorded more consumptions of the transaction
  than it has messages;
* ``conflict``: the producer databases disagree about the transaction (one says
  COMMITTED, another ROLLED_BACK), or a database rolled it back while its messages were
  delivered or consumed. A transaction committed in one database and fenced in another is
  one of these: whichever verdict is true, a database or a consumer is wrong.

A transaction with any COMMITTED row counts as committed (so a conflict whose messages
never arrived is also ``lost``).

Latencies (ms): local commit (transaction_log.created_at) -> broker commit (commit_ms)
-> consumed (first consumed_at).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

FLAGS = ("committed", "rolled_back", "half_pending", "parked", "phantom", "lost",
         "duplicate_delivery", "duplicate_effect", "conflict")
#: What a threshold can gate on (a count of transactions with that flag).
GATES = (*FLAGS, "clock_skew")
ANOMALIES = ("conflict", "phantom", "lost", "duplicate_delivery", "duplicate_effect", "half_pending", "parked",
             "clock_skew")
KNOWN_LOCAL_STATES = ("COMMITTED", "ROLLED_BACK")
KNOWN_BROKER_STATES = ("normal", "half", "committed", "rolled_back", "parked")


def _millis(column: str) -> Column:
    return F.unix_millis(F.col(column).cast("timestamp"))


def classify(
    transaction_log: DataFrame,
    messages: DataFrame,
    deliveries: DataFrame,
    consumed: DataFrame,
    now_ms: int,
    grace_ms: int,
    has_consumers: bool,
) -> DataFrame:
    """The per-transaction table (see the module docstring)."""
    local = (
        transaction_log.where(F.col("transaction_id").isNotNull())
        .groupBy("transaction_id")
        .agg(
            # "COMMITTED" sorts first: a transaction committed anywhere counts as committed
            F.min("state").alias("local_state"),
            (F.min("state") != F.max("state")).alias("conflicting_local_states"),
            F.max(F.col("state") == "ROLLED_BACK").alias("rolled_back_somewhere"),
            F.count(F.lit(1)).alias("local_rows"),
            F.min(_millis("created_at")).alias("local_ms"),
            F.first("producer_group").alias("local_group"),
        )
    )
    tx_messages = messages.where(F.col("transaction_id").isNotNull())
    broker = tx_messages.groupBy("transaction_id").agg(
        F.first("state").alias("broker_state"),
        F.count(F.lit(1)).alias("message_count"),
        F.max("commit_ms").alias("commit_ms"),
        F.min("store_ms").alias("store_ms"),
        F.first("topic").alias("topic"),
        F.max("copies").alias("max_copies"),
    )
    delivered = (
        deliveries.join(tx_messages.select("message_id", "transaction_id"), "message_id")
        .groupBy("transaction_id")
        .agg(
            F.sum(F.when(F.col("delivery_attempts") > 0, 1).otherwise(0)).alias("delivered"),
            F.max("delivery_attempts").alias("max_attempts"),
        )
    )
    per_group = (
        consumed.where(F.col("transaction_id").isNotNull())
        .groupBy("transaction_id", "consumer_group")
        .agg(F.count(F.lit(1)).alias("n"), F.min(_millis("consumed_at")).alias("first_ms"),
             F.first("topic").alias("consumed_topic"))
    )
    consumption = per_group.groupBy("transaction_id").agg(
        F.sum("n").alias("consumed"),
        F.max("n").alias("max_per_group"),
        F.min("first_ms").alias("consumed_ms"),
        F.first("consumed_topic").alias("consumed_topic"),
    )
    joined = (
        local.join(broker, "transaction_id", "full_outer")
        .join(delivered, "transaction_id", "left")
        .join(consumption, "transaction_id", "left")
        .fillna(0, ["delivered", "consumed", "max_per_group", "max_attempts", "max_copies"])
    )
    committed = F.col("local_state") == "COMMITTED"
    not_committed = F.coalesce(F.col("local_state"), F.lit("")) != "COMMITTED"
    settled_before = F.coalesce(F.col("local_ms"), F.col("store_ms")) < F.lit(now_ms - grace_ms)
    unreached = (F.col("delivered") == 0) | ((F.col("consumed") == 0) if has_consumers else F.lit(False))
    commit_latency = F.col("commit_ms") - F.col("local_ms")
    consume_latency = F.col("consumed_ms") - F.col("commit_ms")
    event_ms = F.coalesce(F.col("local_ms"), F.col("store_ms"), F.col("commit_ms"))
    return joined.select(
        "transaction_id",
        F.coalesce("topic", "consumed_topic", F.lit("?")).alias("topic"),
        "local_state", "broker_state", "local_rows", "conflicting_local_states", "message_count",
        "local_ms", "commit_ms", "consumed_ms",
        F.date_trunc("hour", F.timestamp_millis(event_ms)).alias("hour"),
        event_ms.alias("event_ms"),
        committed.alias("committed"),
        ((F.col("local_state") == "ROLLED_BACK")
         | (F.col("local_state").isNull() & (F.col("broker_state") == "rolled_back"))).alias("rolled_back"),
        F.coalesce(F.col("broker_state") == "half", F.lit(False)).alias("half_pending"),
        F.coalesce(F.col("broker_state") == "parked", F.lit(False)).alias("parked"),
        F.col("delivered").cast("int").alias("delivered"),
        F.col("consumed").cast("int").alias("consumed"),
        (((F.coalesce(F.col("broker_state"), F.lit("")) == "committed") | (F.col("consumed") > 0))
         & not_committed).alias("phantom"),
        (committed & settled_before & unreached).alias("lost"),
        (F.coalesce(F.col("conflicting_local_states"), F.lit(False))
         | (F.coalesce(F.col("rolled_back_somewhere"), F.lit(False))
            & ((F.col("delivered") > 0) | (F.col("consumed") > 0)))).alias("conflict"),
        ((F.col("max_copies") > 1) | (F.col("max_attempts") > 1)).alias("duplicate_delivery"),
        (F.col("max_per_group") > F.coalesce(F.col("message_count"), F.lit(1))).alias("duplicate_effect"),
        commit_latency.alias("commit_latency_ms"),
        consume_latency.alias("consume_latency_ms"),
        (F.col("consumed_ms") - F.col("local_ms")).alias("end_to_end_ms"),
        (F.coalesce(commit_latency < 0, F.lit(False)) | F.coalesce(consume_latency < 0, F.lit(False)))
        .alias("clock_skew"),
    )


def sanity(transaction_log: DataFrame, messages: DataFrame, consumed: DataFrame,
           classified: DataFrame) -> dict[str, int]:
    """Input problems worth a line in the report, counted (never fatal); one job per input."""

    def count_if(condition: Column) -> Column:
        return F.sum(F.when(condition, 1).otherwise(0))

    local = transaction_log.agg(
        count_if(F.col("transaction_id").isNull()).alias("transaction_log_null_ids"),
        count_if(~F.col("state").isin(*KNOWN_LOCAL_STATES)).alias("unknown_local_states"),
    ).collect()[0].asDict()
    broker = messages.agg(
        count_if(F.col("message_id").isNull()).alias("messages_null_ids"),
        count_if(~F.col("state").isin(*KNOWN_BROKER_STATES)).alias("unknown_broker_states"),
    ).collect()[0].asDict()
    derived = classified.agg(
        count_if(F.col("local_rows") > 1).alias("transaction_ids_in_several_producer_rows"),
        count_if(F.coalesce(F.col("conflicting_local_states"), F.lit(False)))
        .alias("transaction_ids_with_conflicting_local_states"),
        count_if(F.col("clock_skew")).alias("clock_skew"),
    ).collect()[0].asDict()
    duplicates = consumed.groupBy("consumer_group", "message_id").count().where(F.col("count") > 1).count()
    return {k: int(v or 0) for k, v in {**local, **broker, **derived, "consumed_duplicate_keys": duplicates}.items()}
