"""``outbox reconcile`` / ``python -m outbox.reconcile``: run the job from the command line.

    outbox reconcile --producer-db URL [--producer-db URL ...] --consumer-db URL ...
                     --broker-export DIR --out DIR [--since ISO] [--until ISO]
                     [--state-dir DIR [--max-carry-days 7]] [--grace-seconds 60] [--max-unrelayed-seconds 3600] [--max-lost 0]
                     [--max-phantom 0] [--max-duplicate-effect 0] [--max-conflict 0]
                     [--max-unrelayed 0] [--threshold NAME=N ...]
                     [--master URL] [--conf key=value ...]
                     [--postgres-read auto|jdbc|sqlalchemy]

Exit status 0 when every threshold holds, 1 when one is breached, 2 on bad input, said in
one line on stderr (``outbox reconcile: error: ...``): an option, a database file or an
export that is not there (all checked before Spark starts), a database that cannot be
read, ``--postgres-read jdbc`` without the PostgreSQL JDBC driver, or no PySpark (the
``spark`` extra). ``--help`` needs no PySpark.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from broker_embedded.cli_tools import CommandParser, quiet_on_broken_pipe

from ..errors import ConfigurationError
from .preflight import GATES, POSTGRES_READS, check_inputs

#: What the job needs beyond the core (the ``spark`` extra); imported when it runs.
SPARK_MODULES = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "sqlalchemy"})


def _epoch_ms(value: str | None) -> int | None:
    """An ISO time (naive means UTC) as epoch milliseconds."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not an ISO time: {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} takes key=value, got {item!r}")
        pairs[key] = value
    return pairs


def _thresholds(args: argparse.Namespace) -> dict[str, int]:
    thresholds = {"lost": args.max_lost, "phantom": args.max_phantom, "duplicate_effect": args.max_duplicate_effect,
                  "conflict": args.max_conflict, "unrelayed_stale": args.max_unrelayed}
    for name, value in _pairs(args.threshold, "--threshold").items():
        if name not in GATES:
            raise ValueError(f"unknown threshold {name!r}; known: {', '.join(GATES)}")
        if not value.isdigit():
            raise ValueError(f"threshold {name} needs a count, got {value!r}")
        thresholds[name] = int(value)
    return thresholds


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="outbox reconcile", description="run the reconciliation job (also: python -m "
                           "outbox.reconcile; exit status 0: every threshold holds, 1: one is breached, 2: bad input)")
    parser.add_argument("--producer-db", action="append", default=[], help="a database with outbox_transaction_log "
                        "(repeatable; at least one)")
    parser.add_argument("--consumer-db", action="append", default=[], help="a database with outbox_consumed_message "
                        "(repeatable)")
    parser.add_argument("--broker-export", required=True, help="directory written by the broker's export")
    parser.add_argument("--out", required=True, help="the report's folder: summary.json, anomalies/, report.html")
    parser.add_argument("--since", help="ISO time: only transactions from then")
    parser.add_argument("--until", help="ISO time: only transactions before then")
    parser.add_argument("--state-dir", help="incremental run: reconcile from where the last run kept in this "
                        "folder ended (the first run: from --since) to --until (default: now), and keep the "
                        "transactions still open there for the next run")
    parser.add_argument("--max-carry-days", type=float, default=7.0, help="with --state-dir: a transaction "
                        "still open after this long is reported as it stands and no longer carried")
    parser.add_argument("--grace-seconds", type=float, default=60.0, help="seconds: work this recent is in "
                        "flight, not lost")
    parser.add_argument("--max-unrelayed-seconds", type=float, default=3600.0, help="seconds: a message stored "
                        "in a producer database (store mode) waiting longer for the relay is unrelayed_stale")
    parser.add_argument("--max-lost", type=int, default=0, help="transactions committed but never delivered")
    parser.add_argument("--max-phantom", type=int, default=0, help="transactions rolled back or unknown, delivered")
    parser.add_argument("--max-duplicate-effect", type=int, default=0, help="messages consumed with effect twice")
    parser.add_argument("--max-conflict", type=int, default=0,
                        help="transactions the producer databases disagree on, or rolled back yet delivered")
    parser.add_argument("--max-unrelayed", type=int, default=0,
                        help="transactions whose stored messages waited longer than --max-unrelayed-seconds")
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=N",
                        help=f"fail when more than N transactions are NAME ({', '.join(GATES)})")
    parser.add_argument("--master", help="the Spark master (default: spark-submit's --master, else spark.master "
                        "from spark-defaults.conf, else local[*])")
    parser.add_argument("--conf", action="append", default=[], help="a Spark setting key=value (wins over "
                        "spark-submit's and spark-defaults.conf's)")
    parser.add_argument("--jdbc-partitions", type=int, default=4, help="parallel JDBC reads per PostgreSQL table")
    parser.add_argument("--postgres-read", choices=POSTGRES_READS, default="auto",
                        help="PostgreSQL through JDBC (needs the driver jar), through SQLAlchemy on the "
                        "driver, or auto: JDBC when the driver is there (default)")
    return parser


def _error(message: object) -> int:
    print(f"outbox reconcile: error: {message}", file=sys.stderr)
    return 2


@quiet_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; 0 when every threshold holds, 1 when one is breached, 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        conf = _pairs(args.conf, "--conf")
        thresholds = _thresholds(args)
        since_ms, until_ms = _epoch_ms(args.since), _epoch_ms(args.until)
        check_inputs(args.producer_db, args.consumer_db, args.broker_export, args.out)
        if args.max_carry_days < 0:
            raise ValueError(f"--max-carry-days must not be negative, got {args.max_carry_days}")
        if args.state_dir is not None and Path(args.state_dir).exists() and not Path(args.state_dir).is_dir():
            raise ValueError(f"--state-dir {args.state_dir} is a file, not a folder")
        from sqlalchemy.exc import SQLAlchemyError

        from .job import ReconcileInputs, ReconcileOptions, reconcile
        from .session import build_session
    except (ValueError, ConfigurationError) as exc:
        return _error(exc)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SPARK_MODULES:
            raise
        return _error(f"needs PySpark ({exc.name} is missing): pip install 'halfmoon[spark]'")
    spark = build_session(args.master, conf)
    try:
        result = reconcile(
            spark,
            ReconcileInputs(args.producer_db, args.consumer_db, args.broker_export),
            ReconcileOptions(
                out_dir=args.out, since_ms=since_ms, until_ms=until_ms, grace_s=args.grace_seconds,
                max_unrelayed_s=args.max_unrelayed_seconds,
                jdbc_partitions=args.jdbc_partitions, thresholds=thresholds, postgres_read=args.postgres_read,
                state_dir=args.state_dir, max_carry_s=args.max_carry_days * 86_400,
            ),
        )
    except ConfigurationError as exc:
        return _error(exc)
    except SQLAlchemyError as exc:  # a server database that cannot be reached or read
        return _error(f"cannot read a database: {str(exc).splitlines()[0]}")
    finally:
        spark.stop()
    print(f"report: {result.out_dir / 'report.html'}")
    print(f"summary: {result.out_dir / 'summary.json'} ({'PASS' if result.passed else 'FAIL'})")
    return 0 if result.passed else 1
