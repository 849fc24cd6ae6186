"""``manage.py outbox_resolve TRANSACTION_ID``: resolve a parked transaction by the fencing rule."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker_embedded import BrokerError

from ...conf import ForeignGroupError
from ...resolve import resolve_parked


class Command(BaseCommand):
    help = ("Resolve a parked transaction of a producer group owned here as its transaction_log says "
            "(fencing it if absent).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("transaction_id")
        parser.add_argument("--database", help="the alias to fence on (default: the group's, see PRODUCER_GROUPS)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = resolve_parked(options["transaction_id"], options["database"])
        except (BrokerError, ForeignGroupError) as exc:
            raise CommandError(str(exc)) from exc
        if result is None:
            raise CommandError("the transaction is still running (lock timeout); try again")
        self.stdout.write(result.state.value)
