"""``manage.py outbox_check TRANSACTION_ID [--send]``: answer one check-back by hand."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from broker_embedded import Resolution

from ...checks import fenced_answer
from ...conf import producer


class Command(BaseCommand):
    help = "Answer a check-back from the transaction_log (fences an absent id); --send tells the broker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("transaction_id")
        parser.add_argument("--database", default="default")
        parser.add_argument("--send", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        resolution = fenced_answer(options["transaction_id"], options["database"])
        if options["send"] and resolution is not Resolution.UNKNOWN:
            producer().end_transaction(options["transaction_id"], resolution, from_check=True)
        self.stdout.write(resolution.value)
