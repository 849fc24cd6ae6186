"""``python -m example_shop demo``: the order/points demo (``--help`` for options)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .demo import SCENARIOS, DemoOptions, run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="example_shop", description="halfmoon's order/points demo")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run every service, place orders with faults, check the books")
    demo.add_argument("--orders", type=int, default=300)
    demo.add_argument("--concurrency", type=int, default=4)
    demo.add_argument("--work-dir", type=Path, default=Path(os.environ.get("SHOP_WORK_DIR", "demo-work")))
    demo.add_argument("--database-url", default=os.environ.get("SHOP_DATABASE_URL"),
                      help="PostgreSQL server URL (two databases are made from its name); default SQLite")
    demo.add_argument("--redis-url", default=os.environ.get("SHOP_REDIS_URL"),
                      help="Celery transport for check-backs; default the server-less filesystem transport")
    demo.add_argument("--scenario", action="append", choices=SCENARIOS,
                      help="run only these fault scenarios (repeatable); default all")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--no-report", action="store_true", help="skip the Spark reconciliation report")
    demo.add_argument("--keep", action="store_true",
                      help="after the checks, keep every service up (the broker's console too) until Ctrl-C or SIGTERM")
    args = parser.parse_args(argv)
    return run_demo(DemoOptions(
        orders=args.orders, concurrency=args.concurrency, work_dir=args.work_dir,
        database_url=args.database_url, redis_url=args.redis_url,
        scenarios=frozenset(args.scenario or SCENARIOS), seed=args.seed, reconcile=not args.no_report,
        keep=args.keep,
    ))


if __name__ == "__main__":
    sys.exit(main())
