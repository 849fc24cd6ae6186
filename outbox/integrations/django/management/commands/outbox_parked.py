"""``manage.py outbox_parked``: list the broker's parked transactions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ...conf import outbox_settings, producer


class Command(BaseCommand):
    help = "List transactions parked after the maximum number of check-backs (other groups: read-only)."

    def handle(self, *args: Any, **options: Any) -> None:
        owned = outbox_settings().owned_groups
        parked = producer().broker.list_parked()
        for tx in parked:
            owner = "" if tx.producer_group in owned else "\towned by another service"
            self.stdout.write(f"{tx.transaction_id}\t{tx.producer_group}\t{tx.check_times} checks{owner}")
        self.stdout.write(f"{len(parked)} parked")
