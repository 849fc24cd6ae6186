"""``outbox reconcile`` / ``python -m outbox.reconcile``: run the job from the command line.

    outbox reconcile --producer-db URL [--producer-db URL ...] --consumer-db URL ...
                     --broker-export DIR --out DIR [--since ISO] [--until ISO]
                     [--grace-seconds 60] [--max-lost 0] [--max-phantom 0]
                     [--max-duplicate-effect 0] [--master local[*]] [--conf key=value ...]

Exit status 0 when every threshold holds, 1 when one is breached, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime

from .job import ReconcileInputs, ReconcileOptions, reconcile
from .session import build_session


def _epoch_ms(value: str | None) -> int | None:
    if value is None:
        return None
    return int(datetime.fromisoformat(value).timestamp() * 1000)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outbox reconcile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--producer-db", action="append", default=[], help="database with outbox_transaction_log")
    parser.add_argument("--consumer-db", action="append", default=[], help="database with outbox_consumed_message")
    parser.add_argument("--broker-export", required=True, help="directory written by the broker's export")
    parser.add_argument("--out", required=True)
    parser.add_argument("--since", help="ISO time: only transactions from then")
    parser.add_argument("--until", help="ISO time: only transactions before then")
    parser.add_argument("--grace-seconds", type=float, default=60.0, help="recent work is in flight, not lost")
    parser.add_argument("--max-lost", type=int, default=0)
    parser.add_argument("--max-phantom", type=int, default=0)
    parser.add_argument("--max-duplicate-effect", type=int, default=0)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value")
    parser.add_argument("--jdbc-partitions", type=int, default=4)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.producer_db:
        print("error: give at least one --producer-db", file=sys.stderr)
        return 2
    try:
        conf = dict(item.split("=", 1) for item in args.conf)
    except ValueError:
        print("error: --conf takes key=value", file=sys.stderr)
        return 2
    spark = build_session(args.master, conf)
    try:
        result = reconcile(
            spark,
            ReconcileInputs(args.producer_db, args.consumer_db, args.broker_export),
            ReconcileOptions(
                out_dir=args.out, since_ms=_epoch_ms(args.since), until_ms=_epoch_ms(args.until),
                grace_s=args.grace_seconds, jdbc_partitions=args.jdbc_partitions,
                thresholds={"lost": args.max_lost, "phantom": args.max_phantom,
                            "duplicate_effect": args.max_duplicate_effect},
            ),
        )
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(f"report: {result.out_dir / 'report.html'}")
    print(f"summary: {result.out_dir / 'summary.json'} ({'PASS' if result.passed else 'FAIL'})")
    return 0 if result.passed else 1
