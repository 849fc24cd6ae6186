"""``manage.py outbox_consume --group G --topic T --handler module:function``."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.consumer import run_consumer, stop_on_signals

from ...conf import producer


class Command(BaseCommand):
    help = "Run a consumer: receive, call the handler (e.g. @idempotent_consumer), ack; SIGTERM stops it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", required=True)
        parser.add_argument("--topic", required=True)
        parser.add_argument("--handler", required=True, help="module:function taking a ReceivedMessage")
        parser.add_argument("--batch", type=int, default=16)

    def handle(self, *args: Any, **options: Any) -> None:
        module, _, name = options["handler"].partition(":")
        try:
            handler = getattr(importlib.import_module(module), name) if module and name else None
        except (ImportError, AttributeError) as exc:
            raise CommandError(f"cannot load handler {options['handler']!r}: {exc}") from exc
        if not callable(handler):
            raise CommandError(f"--handler must name a function as module:function, not {options['handler']!r}")
        stop = threading.Event()
        stop_on_signals(stop)
        handled = run_consumer(producer().broker, options["group"], options["topic"], handler, stop,
                               batch_size=options["batch"])
        self.stdout.write(f"stopped after {handled} messages")
