"""Classify every transaction: one row per transaction id with independent flags and latencies.

Flags:

* ``committed`` / ``rolled_back``: the producer's transaction_log says so (a rollback may
  also be known only to the broker, when the fence row is absent);
* ``half_pending`` / ``parked``: the broker still holds the half message(s);
* ``delivered`` / ``consumed``: how many deliveries (message x consumer group) and
  consumed_message rows there are;
* ``phantom``: committed at the broker or consumed, but not committed locally;
* ``lost``: committed locally before the grace period, and never delivered by the broker
  to any group, or (when consumer databases are given) never consumed; for a transaction
  whose messages went through store mode, relayed before the grace period, and never while
  a stored message still waits for the relay (it waits in the producer's database);
* ``stored`` / ``stored_unrelayed``: how many of the transaction's messages were stored in
  the producer's ``outbox_stored_message`` (store mode), and whether one has not been
  relayed to the broker yet;
* ``unrelayed_stale``: a stored message has waited for the relay longer than
  ``--max-unrelayed-seconds`` (no relay runs, or the broker does not take them);
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
-> consumed (first consumed_at); for a stored-then-relayed transaction also local commit ->
relayed (its last stored message's relayed_at).

A stored-then-relayed transaction is an ordinary one at the broker (the relay commits its
messages under its transaction id), so it is delivered, never phantom.

How (one pass): the five inputs are projected to one row shape (``events``: numbers
only, besides the transaction id) and shuffled once on the transaction id (the consumed
rows in a shuffle of their own, partitioned alike); the consumed rows are counted per
message and per consumer group, then every row of a transaction goes through one hash
aggregation (``per_transaction``), with no further shuffle. States, topics, consumer groups and databases travel
as integer codes so every aggregate hashes; topic names come back through a dictionary
observed while the messages are read. Input sanity counts are observed during the same
scan (``Observation``), never by reading an input again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

ANOMALIES = ("conflict", "phantom", "lost", "unrelayed_stale", "duplicate_delivery", "duplicate_effect",
             "half_pending", "parked", "clock_skew")
#: Producer database states by code; "COMMITTED" has the lowest, so the minimum over a
#: transaction's rows says committed when any row does.
LOCAL_STATES = {"COMMITTED": 1, "ROLLED_BACK": 2}
#: Broker states by code.
BROKER_STATES = {"committed": 1, "rolled_back": 2, "half": 3, "parked": 4, "normal": 5}
UNKNOWN = 9
KNOWN_LOCAL_STATES = tuple(LOCAL_STATES)
KNOWN_BROKER_STATES = tuple(BROKER_STATES)
#: At most this many databases of each side: each is one bit of a 64-bit mask.
MAX_DATABASES = 63
HOUR_MS = 3_600_000

LOCAL, MESSAGE, DELIVERY, CONSUMED, STORED = 0, 1, 2, 3, 4
#: The kinds of a row that only marks a transaction carried over by an incremental run (see
#: ``state``), whose broker rows the next run reads again (``CARRIED``) or finds in the
#: state (``KEPT``): every aggregate of ``per_transaction`` skips them.
CARRIED, KEPT = 5, 6
_MEASURES = ("local_code", "broker_code", "time_ms", "commit_ms", "topic_code", "copies", "attempts",
             "group_code", "message_code", "database_bit")
#: The shape every input row takes (``events``), as a Spark DDL schema.
EVENT_SCHEMA = ", ".join(["transaction_id string", "kind tinyint", *[f"{name} bigint" for name in _MEASURES]])


@dataclass(frozen=True)
class Events:
    """The inputs' rows in the shape of ``EVENT_SCHEMA``: the consumed rows apart (they are
    counted per consumer group and message before the rest, see ``per_transaction``)."""

    others: DataFrame
    consumed: DataFrame

    def add(self, rows: DataFrame) -> Events:
        """These and ``rows`` (of any kind), e.g. an incremental run's carried rows."""
        kind = F.col("kind")
        return Events(self.others.unionByName(rows.where(kind != CONSUMED)),
                      self.consumed.unionByName(rows.where(kind == CONSUMED)))

    def all(self) -> DataFrame:
        """Every row, of every kind."""
        return self.others.unionByName(self.consumed)

    def persist(self, level: StorageLevel) -> Events:
        """Both parts kept at ``level``."""
        return Events(self.others.persist(level), self.consumed.persist(level))

    def unpersist(self) -> None:
        """Both parts no longer kept."""
        self.others.unpersist()
        self.consumed.unpersist()


@dataclass
class Observed:
    """What is counted while the inputs are read (see ``events``)."""

    transaction_log: Observation
    messages: Observation
    consumed: Observation
    stored: Observation
    deliveries: Observation

    def rows_read(self) -> dict[str, int]:
        """How many rows each input gave the job (after the window's filter at the source)."""
        return {name: int(_metrics(getattr(self, name)).get("rows") or 0)
                for name in ("transaction_log", "stored", "messages", "deliveries", "consumed")}

    def sanity(self) -> dict[str, int]:
        """The input sanity counts; call after the first action over the events."""
        local, broker, consumed = _metrics(self.transaction_log), _metrics(self.messages), _metrics(self.consumed)
        return {
            "transaction_log_null_ids": int(local.get("null_ids") or 0),
            "unknown_local_states": int(local.get("unknown_states") or 0),
            "messages_null_ids": int(broker.get("null_ids") or 0),
            "unknown_broker_states": int(broker.get("unknown_states") or 0),
            "consumed_null_ids": int(consumed.get("null_ids") or 0),
        }

    def topics(self) -> dict[int, str]:
        """Topic names by code, from the messages, the consumed rows and the stored messages."""
        pairs = [topic for observation in (self.messages, self.consumed, self.stored)
                 for topic in _metrics(observation).get("topics") or []]
        return {int(row["code"]): str(row["topic"]) for row in pairs}


def _metrics(observation: Observation) -> dict[str, Any]:
    """An observation's values; none when Spark optimised the scan away because every
    input was empty (then there was nothing to count)."""
    try:
        return dict(observation.get)
    except Py4JJavaError:
        return {}


def _code(column: str, codes: dict[str, int]) -> Column:
    expression = F.lit(UNKNOWN)
    for name, code in codes.items():
        expression = F.when(F.col(column) == name, F.lit(code)).otherwise(expression)
    return expression


def _database_bit(labels: list[str]) -> Column:
    """Each row's ``source_db`` as one bit of a mask, by its place in ``labels``."""
    if len(labels) > MAX_DATABASES:
        raise ValueError(f"at most {MAX_DATABASES} databases of each side, got {len(labels)}")
    bit = F.lit(0).cast("long")
    for index, label in enumerate(labels):
        bit = F.when(F.col("source_db") == label, F.lit(1 << index)).otherwise(bit)
    return bit


def _millis(column: str) -> Column:
    return F.unix_millis(F.col(column).cast("timestamp"))


def _topic_dictionary(topic: str) -> Column:
    return F.collect_set(F.struct(F.xxhash64(topic).alias("code"), F.col(topic).alias("topic"))).alias("topics")


def _row(kind: int, **columns: Column) -> list[Column]:
    """One input row in the shape shared by all five inputs (absent measures are null). A
    stored message reuses two: ``time_ms`` is its created_at while it waits for the relay
    (null once relayed), ``commit_ms`` its relayed_at."""
    return [F.col("transaction_id"), F.lit(kind).cast("byte").alias("kind"),
            *[columns.get(name, F.lit(None)).cast("long").alias(name) for name in _MEASURES]]


def events(transaction_log: DataFrame, messages: DataFrame, deliveries: DataFrame, consumed: DataFrame,
           stored: DataFrame, producer_labels: list[str], consumer_labels: list[str],
           delivery_ids_known: bool) -> tuple[Events, Observed]:
    """The five inputs as rows of one shape, transactional rows only, and what their scan
    observes. ``delivery_ids_known``: the deliveries carry their transaction id (exports
    since it was added); otherwise it is found by joining the messages on message_id.
    ``stored``: the producers' stored messages (transaction_id, topic, created_at, relayed_at)."""
    observed = Observed(Observation("transaction_log"), Observation("messages"), Observation("consumed"),
                        Observation("stored"), Observation("deliveries"))
    rows_read = F.count(F.lit(1)).alias("rows")
    local = transaction_log.observe(
        observed.transaction_log, rows_read,
        F.count_if(F.col("transaction_id").isNull()).alias("null_ids"),
        F.count_if(~F.col("state").isin(*KNOWN_LOCAL_STATES)).alias("unknown_states"),
    )
    broker = messages.observe(
        observed.messages, rows_read,
        F.count_if(F.col("message_id").isNull()).alias("null_ids"),
        F.count_if(~F.col("state").isin(*KNOWN_BROKER_STATES)).alias("unknown_states"),
        _topic_dictionary("topic"),
    )
    consumptions = consumed.observe(
        observed.consumed, rows_read,
        F.count_if(F.col("transaction_id").isNull()).alias("null_ids"),
        _topic_dictionary("topic"),
    )
    waiting = stored.observe(observed.stored, rows_read, _topic_dictionary("topic"))
    deliveries = deliveries.observe(observed.deliveries, rows_read)
    if not delivery_ids_known:
        deliveries = deliveries.drop("transaction_id").join(
            messages.select("message_id", "transaction_id").where(F.col("transaction_id").isNotNull()),
            "message_id")
    rows = [
        local.select(*_row(LOCAL, local_code=_code("state", LOCAL_STATES), time_ms=_millis("created_at"),
                           database_bit=_database_bit(producer_labels))),
        broker.select(*_row(MESSAGE, broker_code=_code("state", BROKER_STATES), time_ms=F.col("store_ms"),
                            commit_ms=F.col("commit_ms"), topic_code=F.xxhash64("topic"),
                            copies=F.col("copies"))),
        deliveries.select(*_row(DELIVERY, time_ms=F.col("first_delivered_ms"),
                                attempts=F.col("delivery_attempts"))),
        consumptions.select(*_row(CONSUMED, time_ms=_millis("consumed_at"), topic_code=F.xxhash64("topic"),
                                  group_code=F.xxhash64("consumer_group"),
                                  message_code=F.xxhash64("message_id"),
                                  database_bit=_database_bit(consumer_labels))),
        waiting.select(*_row(STORED, time_ms=F.when(F.col("relayed_at").isNull(), _millis("created_at")),
                             commit_ms=_millis("relayed_at"), topic_code=F.xxhash64("topic"),
                             database_bit=_database_bit(producer_labels))),
    ]
    consumed_rows = rows.pop(3)
    union = rows[0]
    for frame in rows[1:]:
        union = union.unionByName(frame)
    present = F.col("transaction_id").isNotNull()
    return Events(union.where(present), consumed_rows.where(present)), observed


def _kind(kind: int, column: Column | str) -> Column:
    """``column`` of the rows of one kind (null on the others)."""
    return F.when(F.col("kind") == kind, F.col(column) if isinstance(column, str) else column)


def _consumer_groups(consumed: DataFrame) -> DataFrame:
    """A transaction's consumed rows, one per consumer group: how many (``n``), how many of
    its messages the group consumed more than once (``duplicate_keys``)."""
    per_message = consumed.groupBy("transaction_id", "group_code", "message_code").agg(
        F.count(F.lit(1)).alias("n"), F.min("time_ms").alias("time_ms"),
        F.max("topic_code").alias("topic_code"), F.bit_or("database_bit").alias("database_bit"))
    return per_message.groupBy("transaction_id", "group_code").agg(
        F.lit(CONSUMED).cast("byte").alias("kind"), F.sum("n").alias("n"),
        F.count_if(F.col("n") > 1).alias("duplicate_keys"), F.min("time_ms").alias("time_ms"),
        F.max("topic_code").alias("topic_code"), F.bit_or("database_bit").alias("database_bit"))


def per_transaction(rows: Events) -> DataFrame:
    """One row per transaction id, from one shuffle on the id (``spark.sql.shuffle.partitions``,
    merged by adaptive execution when small): the consumed rows are first counted per
    consumer group and message (for the duplicates), then every row of a transaction is
    aggregated once, each measure from the rows of the kind it belongs to."""
    consumed = _consumer_groups(rows.consumed.repartition("transaction_id")).drop("group_code")
    others = rows.others.select(
        "transaction_id", "kind", "local_code", "broker_code", "time_ms", "commit_ms", "topic_code",
        "copies", "attempts", "database_bit", F.lit(1).cast("long").alias("n"),
        F.lit(None).cast("long").alias("duplicate_keys"))
    # both sides hash-partitioned alike: the union keeps that, so the aggregation needs no shuffle
    every = others.repartition("transaction_id").unionByName(consumed, allowMissingColumns=True)
    local_code = _kind(LOCAL, "local_code")
    rolled_back = (F.col("local_code") == LOCAL_STATES["ROLLED_BACK"]).cast("int")
    return every.groupBy("transaction_id").agg(
        F.min(local_code).alias("local_code"),
        F.sum(_kind(LOCAL, "n")).alias("local_rows"),
        (F.min(local_code) != F.max(local_code)).alias("conflicting_local_states"),
        F.max(_kind(LOCAL, rolled_back)).alias("rolled_back_somewhere"),
        F.min(_kind(LOCAL, "time_ms")).alias("local_ms"),
        F.bit_or(F.when(F.col("kind").isin(LOCAL, STORED), F.col("database_bit"))).alias("producer_bits"),
        F.min(_kind(MESSAGE, "broker_code")).alias("broker_code"),
        F.sum(_kind(MESSAGE, "n")).alias("message_count"),
        F.min(_kind(MESSAGE, "time_ms")).alias("store_ms"),
        F.max(_kind(MESSAGE, "commit_ms")).alias("commit_ms"),
        F.max(_kind(MESSAGE, "copies")).alias("max_copies"),
        F.max(_kind(MESSAGE, "topic_code")).alias("message_topic"),
        F.count_if((F.col("kind") == DELIVERY) & (F.col("attempts") > 0)).alias("delivered"),
        F.max(_kind(DELIVERY, "attempts")).alias("max_attempts"),
        F.sum(_kind(CONSUMED, "n")).alias("consumed"),
        F.max(_kind(CONSUMED, "n")).alias("max_per_group"),
        F.sum(_kind(CONSUMED, "duplicate_keys")).alias("consumed_duplicate_keys"),
        F.min(_kind(CONSUMED, "time_ms")).alias("consumed_ms"),
        F.max(_kind(CONSUMED, "topic_code")).alias("consumed_topic"),
        F.bit_or(_kind(CONSUMED, "database_bit")).alias("consumer_bits"),
        F.sum(_kind(STORED, "n")).alias("stored"),
        F.max(_kind(STORED, "topic_code")).alias("stored_topic"),
        F.min(_kind(STORED, "time_ms")).alias("oldest_unrelayed_ms"),
        F.max(_kind(STORED, "commit_ms")).alias("relayed_ms"),
    )


def classify(transactions: DataFrame, now_ms: int, grace_ms: int, has_consumers: bool,
             max_unrelayed_ms: int, messages_until_ms: int | None = None) -> DataFrame:
    """The flags and latencies of each transaction (see the module docstring) from
    ``per_transaction``; topics stay codes (``topic_code``), states become names.

    A transaction is judged lost only when it was handed to the broker (its local commit,
    or its last relay) a grace period before ``now_ms`` and before ``messages_until_ms``,
    where a windowed run stops reading the broker's messages: a relay after that is not in
    what was read."""
    zero = ["delivered", "consumed", "max_per_group", "max_attempts", "max_copies", "local_rows",
            "consumed_duplicate_keys", "stored"]
    frame = transactions.fillna(0, zero)
    local_code, broker_code = F.col("local_code"), F.col("broker_code")
    committed = F.coalesce(local_code == LOCAL_STATES["COMMITTED"], F.lit(False))
    broker_committed = F.coalesce(broker_code == BROKER_STATES["committed"], F.lit(False))
    unrelayed = F.col("oldest_unrelayed_ms").isNotNull()
    relayed_ms = F.when(~unrelayed, F.col("relayed_ms"))
    seen_until_ms = now_ms if messages_until_ms is None else min(now_ms, messages_until_ms)
    settled_before = F.coalesce(relayed_ms, F.col("local_ms"), F.col("store_ms")) < F.lit(seen_until_ms - grace_ms)
    unreached = (F.col("delivered") == 0) | ((F.col("consumed") == 0) if has_consumers else F.lit(False))
    commit_latency = F.col("commit_ms") - F.col("local_ms")
    consume_latency = F.col("consumed_ms") - F.col("commit_ms")
    event_ms = F.coalesce(F.col("local_ms"), F.col("oldest_unrelayed_ms"), F.col("store_ms"), F.col("commit_ms"))
    rolled_back_somewhere = F.coalesce(F.col("rolled_back_somewhere") == 1, F.lit(False))
    return frame.select(
        "transaction_id",
        F.coalesce("message_topic", "consumed_topic", "stored_topic", F.lit(0)).alias("topic_code"),
        _name(local_code, LOCAL_STATES).alias("local_state"),
        _name(broker_code, BROKER_STATES).alias("broker_state"),
        "local_rows", "message_count", "local_ms", "store_ms", "commit_ms", "consumed_ms",
        "oldest_unrelayed_ms", "relayed_ms",
        "producer_bits", "consumer_bits", "consumed_duplicate_keys",
        F.coalesce(F.col("conflicting_local_states"), F.lit(False)).alias("conflicting_local_states"),
        (F.floor(event_ms / HOUR_MS) * HOUR_MS).alias("hour_ms"),
        event_ms.alias("event_ms"),
        committed.alias("committed"),
        (F.coalesce(local_code == LOCAL_STATES["ROLLED_BACK"], F.lit(False))
         | (local_code.isNull() & F.coalesce(broker_code == BROKER_STATES["rolled_back"], F.lit(False))))
        .alias("rolled_back"),
        F.coalesce(broker_code == BROKER_STATES["half"], F.lit(False)).alias("half_pending"),
        F.coalesce(broker_code == BROKER_STATES["parked"], F.lit(False)).alias("parked"),
        F.col("delivered").cast("int").alias("delivered"),
        F.col("consumed").cast("int").alias("consumed"),
        ((broker_committed | (F.col("consumed") > 0)) & ~committed).alias("phantom"),
        (committed & ~unrelayed & F.coalesce(settled_before, F.lit(False)) & unreached).alias("lost"),
        F.col("stored").cast("int").alias("stored"),
        unrelayed.alias("stored_unrelayed"),
        F.coalesce(F.col("oldest_unrelayed_ms") < F.lit(now_ms - max_unrelayed_ms), F.lit(False))
        .alias("unrelayed_stale"),
        ((F.col("max_copies") > 1) | (F.col("max_attempts") > 1)).alias("duplicate_delivery"),
        (F.col("max_per_group") > F.coalesce(F.col("message_count"), F.lit(1))).alias("duplicate_effect"),
        (F.coalesce(F.col("conflicting_local_states"), F.lit(False))
         | (rolled_back_somewhere & ((F.col("delivered") > 0) | (F.col("consumed") > 0)))).alias("conflict"),
        commit_latency.alias("commit_latency_ms"),
        consume_latency.alias("consume_latency_ms"),
        (F.col("consumed_ms") - F.col("local_ms")).alias("end_to_end_ms"),
        (relayed_ms - F.col("local_ms")).alias("relay_latency_ms"),
        (F.coalesce(commit_latency < 0, F.lit(False)) | F.coalesce(consume_latency < 0, F.lit(False)))
        .alias("clock_skew"),
    )


def _name(code: Column, codes: dict[str, int]) -> Column:
    """A state code back to its name (unknown codes to "unknown", null stays null)."""
    expression: Any = F.when(code.isNotNull(), F.lit("unknown"))
    for name, value in codes.items():
        expression = F.when(code == value, F.lit(name)).otherwise(expression)
    return expression  # type: ignore[no-any-return]
