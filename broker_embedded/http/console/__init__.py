"""The broker console: server-rendered pages over an ``EmbeddedBroker``, as a WSGI app.

``make_console_app(broker, access_key=..., secret_key=...)`` returns the application; the
broker's HTTP port mounts it at ``/``. Without keys it is read-only. See docs/console.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...broker.facade import EmbeddedBroker
from .app import ConsoleApp
from .reconcile import REPORTS_ENV
from .session import Sessions
from .trends import TrendSampler

#: How long a console session lasts after signing in.
DEFAULT_SESSION_TTL_S = 8 * 3600.0
#: How long "Resolve" waits for the producer group's checker (like ``parked resolve --wait``).
DEFAULT_RESOLVE_WAIT_S = 10.0


def make_console_app(
    broker: EmbeddedBroker,
    *,
    access_key: str | None,
    secret_key: str | None,
    session_ttl_s: float = DEFAULT_SESSION_TTL_S,
    resolve_wait_s: float = DEFAULT_RESOLVE_WAIT_S,
    trends: TrendSampler | None = None,
    reconcile_reports: str | Path | None = None,
) -> ConsoleApp:
    """The console of ``broker`` as a WSGI application. With the broker's ``access_key`` and
    ``secret_key`` an operator who signs in with them may act (resend, recheck, resolve);
    with neither the console is read-only; one without the other is a ``ValueError``.
    ``trends`` samples what the Trends page draws; by default a ``TrendSampler`` started on a
    thread of its own, which ends when the broker closes. ``reconcile_reports`` (default:
    ``HALFMOON_RECONCILE_REPORTS``) is the nightly reconciliation's reports folder, which the
    Reconciliation page reads."""
    if bool(access_key) != bool(secret_key):
        raise ValueError("give the console both the access key and the secret key, or neither (read-only)")
    sessions = Sessions(access_key, secret_key, session_ttl_s) if access_key and secret_key else None
    if trends is None:
        trends = TrendSampler(broker)
        trends.start()
    reports = reconcile_reports or os.environ.get(REPORTS_ENV) or None
    return ConsoleApp(broker, sessions, resolve_wait_s, trends, Path(reports) if reports else None)


__all__ = ["ConsoleApp", "TrendSampler", "make_console_app"]
