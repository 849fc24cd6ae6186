"""The nightly reconciliation: one incremental run up to midnight (UTC), its report in a
folder of its own under a reports directory, the last N kept, and the exit status that
raises the alert.

    python -m outbox.reconcile.nightly --reports DIR --state-dir DIR [--keep 14] \\
        -- --producer-db URL --consumer-db URL --broker-export DIR [other reconcile options]

Each run writes ``<reports>/<until day>/`` (``summary.json``, ``report.html``,
``anomalies/``), points ``<reports>/LATEST`` at it (a text file with the folder's name,
replaced atomically; the broker console's Reconciliation page reads it) and deletes the
oldest report folders beyond ``--keep``. Exit status as ``outbox reconcile``: 0 pass,
1 a threshold is breached (the alert: cron mails it, the Celery task fails with
``ReconcileBreachedError``), 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker_embedded.cli_tools import CommandParser

from . import cli

#: The file in the reports directory that names the latest report's folder.
LATEST = "LATEST"
DEFAULT_KEEP = 14
_REPORT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}\d{2})?$")


def midnight(now: datetime | None = None) -> datetime:
    """The last midnight (UTC) at or before ``now``: where a nightly window ends."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def report_folders(reports: Path) -> list[Path]:
    """The report folders under ``reports``, oldest first (their names sort by date)."""
    if not reports.is_dir():
        return []
    return sorted(
        path for path in reports.iterdir() if path.is_dir() and _REPORT_NAME.match(path.name)
    )


def publish(reports: Path, folder: Path, keep: int) -> list[Path]:
    """Point ``LATEST`` at ``folder`` and delete the oldest report folders beyond ``keep``;
    returns the deleted ones."""
    staging = reports / f".{LATEST}.tmp"
    staging.write_text(folder.name + "\n", encoding="utf-8")
    os.replace(staging, reports / LATEST)
    stale = report_folders(reports)[:-keep] if keep > 0 else []
    for old in stale:
        shutil.rmtree(old)
    return stale


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m outbox.reconcile.nightly",
        description="the nightly incremental "
        "reconciliation up to the last midnight (UTC); the options after -- go to outbox reconcile",
    )
    parser.add_argument(
        "--reports", required=True, help="folder of the reports: one folder per night, and LATEST"
    )
    parser.add_argument(
        "--state-dir",
        required=True,
        help="the carry-over between nights (outbox reconcile --state-dir)",
    )
    parser.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help="report folders kept (the oldest go)"
    )
    parser.add_argument(
        "--until", help="ISO time the window ends (default: the last midnight, UTC)"
    )
    parser.add_argument(
        "--since",
        help="the first night only: where the reconciled history starts "
        "(default: a day before --until)",
    )
    parser.add_argument(
        "reconcile", nargs=argparse.REMAINDER, help="-- then outbox reconcile's options"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """One nightly run; the exit status of ``outbox reconcile`` (1: a threshold is breached)."""
    args = build_parser().parse_args(argv)
    if args.keep < 1:
        print("outbox reconcile nightly: error: --keep needs at least 1", file=sys.stderr)
        return 2
    until = midnight()
    if args.until:
        until = datetime.fromisoformat(args.until)
        until = until if until.tzinfo else until.replace(tzinfo=UTC)
    reports = Path(args.reports)
    folder = reports / until.strftime("%Y-%m-%d" if until == midnight(until) else "%Y-%m-%dT%H%M")
    forwarded = [arg for arg in args.reconcile if arg != "--"]
    window = ["--until", until.isoformat()]
    if not any(Path(args.state_dir).glob("until=*")):  # the first night: one day unless told
        since = args.since or (until - timedelta(days=1)).isoformat()
        window += ["--since", since]
    status = cli.main([*forwarded, "--state-dir", args.state_dir, "--out", str(folder), *window])
    if (folder / "summary.json").exists():
        publish(reports, folder, args.keep)
    return status


if __name__ == "__main__":
    sys.exit(main())
