"""``manage.py outbox_purge [--database ALIAS ...] [--table T ...] [--dry-run] ...``: delete
what retention allows from the framework tables (docs/retention.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.errors import ConfigurationError
from outbox.purge_command import add_purge_arguments, progress_printer, purge_options

from ...retention import purge_project


class Command(BaseCommand):
    help = ("Delete transaction_log rows past the broker's check horizon that the broker no longer holds open, "
            "and consumed_message rows past the dedup window, in small batches (OUTBOX['RETENTION']).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", action="append",
                            help="an alias to purge (repeatable; default: 'default' and the owned groups' aliases)")
        add_purge_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            reports = purge_project(purge_options(options), progress_printer(self.stdout.write), options["database"],
                                    on_report=lambda report: self.stdout.write(str(report)))
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        skipped = {table for report in reports for table in report.skipped}
        if skipped:
            raise CommandError(f"not purged: {', '.join(sorted(skipped))} (the broker could not be asked)")
