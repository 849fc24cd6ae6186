"""Kept for imports of ``broker_embedded.console``: the console is ``broker_embedded.http.console``."""

from .http.console import ConsoleApp, TrendSampler, make_console_app

__all__ = ["ConsoleApp", "TrendSampler", "make_console_app"]
