"""``manage.py outbox_relay [--database ALIAS ...]``: hand the stored messages (store mode)
to the broker until SIGTERM; ``--status``: how many wait, and since when."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.consumer import stop_on_signals
from outbox.relay import Relay

from ...backlog import project_backlog
from ...conf import outbox_settings, producer
from ...recorder import RECORDER


class Command(BaseCommand):
    help = ("Relay the messages calls stored while the broker was down (OUTBOX['ON_BROKER_DOWN'] = 'store') to "
            "the broker, in the order they were stored, until SIGTERM; several relays at once are safe.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", action="append",
                            help="an alias to relay from (repeatable; default: the owned producer groups' aliases)")
        parser.add_argument("--status", action="store_true",
                            help="print the stored messages waiting per alias and producer group, and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["status"]:
            backlog = project_backlog()
            for group in backlog:
                self.stdout.write(str(group))
            self.stdout.write(f"{sum(group.waiting for group in backlog)} stored messages waiting")
            return
        aliases = options["database"] or outbox_settings().owned_aliases
        stop = threading.Event()
        stop_on_signals(stop)
        failures: list[BaseException] = []

        def relay(alias: str) -> None:
            try:
                Relay(RECORDER, alias, producer().broker).run(stop)
            except BaseException as exc:  # stops the others; reported below
                failures.append(exc)
                stop.set()

        threads = [threading.Thread(target=relay, args=(alias,), name=f"outbox-relay-{alias}") for alias in aliases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise CommandError(f"the relay stopped: {failures[0]}") from failures[0]
        self.stdout.write(f"stopped relaying from {', '.join(aliases)}")
