"""``manage.py outbox_parked``: list the broker's parked transactions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ...conf import producer


class Command(BaseCommand):
    help = "List transactions parked after the maximum number of check-backs."

    def handle(self, *args: Any, **options: Any) -> None:
        parked = producer().broker.list_parked()
        for tx in parked:
            self.stdout.write(f"{tx.transaction_id}\t{tx.producer_group}\t{tx.check_times} checks")
        self.stdout.write(f"{len(parked)} parked")
