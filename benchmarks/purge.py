"""What the retention purge costs producers on PostgreSQL, and how fast it deletes.

    ./dev bench purge [--rows 1000000] [--producers 4] [--seconds 5] [--batch-size 1000] [--postgres URL]

In one run, on a fresh database whose two framework tables hold ``--rows`` rows each, the
oldest tenth past retention:

* producers (threads, each transaction: a transaction_log row as the real producer writes
  it, then a consumed_message row) run for ``--seconds`` with nothing else going on: their
  p50 / p99 / max transaction latency;
* the same producers while ``outbox purge`` deletes the old tenth in batches: their
  latencies, and the purge's rate per table;
* the peer, in the same run after the old rows are put back: the same producers while one
  ``DELETE ... WHERE created_at < horizon`` per table removes them in a single statement.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from _common import percentile, scratch_postgres
from sqlalchemy import Engine, text

from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import record_committed, run, sql_for
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.retention import PurgeOptions, RetentionPolicy
from outbox.schema import CONSUMED_MESSAGE, TRANSACTION_LOG

#: The broker's horizon plus a week, and a week's dedup window: the old rows are a month
#: old, the others an hour.
POLICY = RetentionPolicy()


def fill(engine: Engine, first: int, last: int, old: int) -> None:
    """Rows ``first``..``last`` of both tables, those up to ``old`` a month old."""
    age = f"CASE WHEN g <= {old} THEN now() - interval '30 days' ELSE now() - interval '1 hour' END"
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {TRANSACTION_LOG} (transaction_id, producer_group, state, created_at) "
                          f"SELECT 'tx-' || g, 'shop', 'COMMITTED', {age} FROM generate_series({first}, {last}) g"))
        conn.execute(text(f"INSERT INTO {CONSUMED_MESSAGE} (consumer_group, message_id, topic, consumed_at) "
                          f"SELECT 'points', 'm-' || g, 'order.paid', {age} FROM generate_series({first}, {last}) g"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {TRANSACTION_LOG}"))
        conn.execute(text(f"VACUUM ANALYZE {CONSUMED_MESSAGE}"))


T = TypeVar("T")


def nothing_open(producer_group: str | None) -> list[str]:
    """No broker here: no transaction is open."""
    return []


def produced_during(engine: Engine, producers: int, work: Callable[[], T]) -> tuple[list[float], T]:
    """Producer transaction latencies (ms) while ``work()`` runs, and what it returned."""
    sql = sql_for(engine)
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(producers)]

    def produce(slot: int) -> None:
        while not stop.is_set():
            transaction_id = uuid.uuid4().hex
            start = time.perf_counter()
            with engine.begin() as conn:
                record_committed(conn, transaction_id, "shop")
                run(conn, sql.record_consumed, ["points", transaction_id, "order.paid", transaction_id])
            latencies[slot].append((time.perf_counter() - start) * 1000)

    threads = [threading.Thread(target=produce, args=(slot,)) for slot in range(producers)]
    for thread in threads:
        thread.start()
    try:
        result = work()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return [value for values in latencies for value in values], result


def show(name: str, seconds: float, latencies: list[float], note: str = "") -> None:
    print(f"{name:<34}{len(latencies) / seconds:>8,.0f}{percentile(latencies, 0.5):>9.2f}"
          f"{percentile(latencies, 0.99):>9.2f}{max(latencies, default=float('nan')):>9.1f}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in each table")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="of producers alone")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    old = args.rows // 10
    with scratch_postgres(args.postgres) as url:
        engine = create_engine(url, pool_size=args.producers + 2)
        metadata.create_all(engine)
        fill(engine, 1, args.rows, old)
        print(f"{args.rows:,} rows per table, {old:,} past retention; {args.producers} producers")
        print(f"{'producers':<34}{'tx/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")

        idle, _ = produced_during(engine, args.producers, lambda: time.sleep(args.seconds))
        show("alone", args.seconds, idle)

        start = time.perf_counter()
        during, report = produced_during(engine, args.producers, lambda: purge_engine(
            engine, POLICY, nothing_open, PurgeOptions(batch_size=args.batch_size, pause_s=0)))
        took = time.perf_counter() - start
        rates = ", ".join(f"{t.table} {t.rows:,} rows at {t.rate:,.0f}/s" for t in report.tables)
        show(f"during outbox purge (batch {args.batch_size})", took, during, rates)

        fill(engine, 1, old, old)  # the old rows again, for the peer

        def one_statement() -> None:
            with engine.begin() as conn:
                conn.execute(text(f"DELETE FROM {TRANSACTION_LOG} WHERE created_at < now() - interval '7 days'"))
            with engine.begin() as conn:
                conn.execute(text(f"DELETE FROM {CONSUMED_MESSAGE} WHERE consumed_at < now() - interval '7 days'"))

        start = time.perf_counter()
        during_peer, _ = produced_during(engine, args.producers, one_statement)
        took = time.perf_counter() - start
        show("during one DELETE per table (peer)", took, during_peer, f"{2 * old:,} rows at {2 * old / took:,.0f}/s")
        engine.dispose()


if __name__ == "__main__":
    main()
