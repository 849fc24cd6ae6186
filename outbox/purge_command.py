"""The purge's command-line face, shared by ``outbox purge`` and ``manage.py outbox_purge``:
the flags, the options they make, and the progress lines."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .errors import ConfigurationError
from .retention import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_PAUSE_S,
    TABLES,
    Progress,
    PurgeOptions,
    TablePurge,
    parse_duration,
)
from .schema import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG

#: ``--table`` names.
TABLE_NAMES = {"transaction_log": TRANSACTION_LOG, "consumed_message": CONSUMED_MESSAGE,
               "stored_message": STORED_MESSAGE}
#: The least time between two progress lines of one table.
PROGRESS_EVERY_S = 1.0


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_purge_arguments(parser: argparse.ArgumentParser) -> None:
    """``--table``, ``--batch-size``, ``--pause``, ``--dry-run`` and the age overrides."""
    parser.add_argument("--table", action="append", choices=sorted(TABLE_NAMES),
                        help="only this table (repeatable; default: all)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help=f"rows per batch, each its own transaction (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--pause", type=float, default=DEFAULT_PAUSE_S,
                        help=f"seconds between batches (default {DEFAULT_PAUSE_S})")
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    parser.add_argument("--transaction-log-older-than", type=_duration, metavar="AGE",
                        help="instead of the broker's check horizon plus margin (e.g. 30d; open transactions stay; "
                             "never below the broker's horizon); also how long relayed stored messages stay")
    parser.add_argument("--consumed-older-than", type=_duration, metavar="AGE",
                        help="instead of the dedup window (e.g. 7d, 12h)")


def purge_options(values: Mapping[str, Any], producer_groups: Collection[str] | None = None) -> PurgeOptions:
    """The options of parsed ``add_purge_arguments`` flags (``vars(args)``, or a Django
    command's options)."""
    return PurgeOptions(
        tables=[TABLE_NAMES[name] for name in values["table"]] if values["table"] else TABLES,
        batch_size=values["batch_size"], pause_s=values["pause"], dry_run=values["dry_run"],
        transaction_log_older_than_s=values["transaction_log_older_than"],
        consumed_message_older_than_s=values["consumed_older_than"], producer_groups=producer_groups,
    )


def progress_printer(write: Callable[[str], object]) -> Progress:
    """Writes a table's progress at most every ``PROGRESS_EVERY_S``."""
    printed: dict[str, float] = {}

    def show(progress: TablePurge) -> None:
        now = time.monotonic()
        if now - printed.get(progress.table, -PROGRESS_EVERY_S) >= PROGRESS_EVERY_S:
            printed[progress.table] = now
            write(f"  {progress.summary()}")

    return show
