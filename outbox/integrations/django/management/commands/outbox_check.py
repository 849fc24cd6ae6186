"""``manage.py outbox_check TRANSACTION_ID [--group G] [--send]``: answer one check-back by hand."""

from __future__ import annotations

import functools
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker_embedded import BrokerError, Resolution

from .....check_back import answer_check_back
from ...conf import ForeignGroupError, outbox_settings, producer
from ...recorder import fenced_answer
from ...resolve import require_group


class Command(BaseCommand):
    help = ("Answer a check-back from the transaction_log (fences an absent id) for a transaction the "
            "broker holds under a producer group owned here (or does not know); --send tells the broker.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("transaction_id")
        parser.add_argument("--group", help="its producer group (default: OUTBOX['PRODUCER_GROUP'])")
        parser.add_argument("--database", help="the alias to fence on (default: the group's, see PRODUCER_GROUPS)")
        parser.add_argument("--send", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        transaction_id = options["transaction_id"]
        conf = outbox_settings()
        group = options["group"] or conf.producer_group
        try:
            alias = options["database"] or conf.database_for(group)
            require_group(transaction_id, group)
            resolution = answer_check_back(functools.partial(fenced_answer, using=alias), None, group,
                                           transaction_id)
            if options["send"] and resolution is not Resolution.UNKNOWN:
                producer().broker.end_transaction(transaction_id, resolution, producer_group=group,
                                                  from_check=True)
        except (BrokerError, ForeignGroupError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(resolution.value)
