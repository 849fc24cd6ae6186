"""The Reconciliation page: the verdict of the latest nightly reconciliation report and a
link to it, read from a reports directory (``python -m outbox.reconcile.nightly --reports``:
one folder per night and ``LATEST`` naming the newest). The report itself is served as the
job wrote it (inline style and SVG, no script), with a policy of its own."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path

from .markup import Markup, esc, join, tag
from .pages import Page, View
from .wsgi import HttpError, Response

#: Where the console finds the reports when ``make_console_app`` is not told.
REPORTS_ENV = "HALFMOON_RECONCILE_REPORTS"
#: A report may style itself and draw inline SVG, nothing more.
REPORT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{4})?$")


def latest(reports: Path | None) -> Path | None:
    """The folder ``LATEST`` names (a date-named folder inside ``reports``), if there."""
    if reports is None:
        return None
    try:
        name = (reports / "LATEST").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    folder = reports / name
    return folder if _FOLDER.match(name) and (folder / "summary.json").is_file() else None


def page(reports: Path | None, view: View) -> Page:
    """The latest report's verdict, breaches and window, and the link to the report."""
    section = "/reconcile"
    if reports is None:
        text = (
            f"No reports directory is configured: start the broker with {REPORTS_ENV}=<the folder the "
            "nightly reconciliation writes to> (python -m outbox.reconcile.nightly --reports ...)."
        )
        return Page("Reconciliation", tag("p", text, class_="note"), section=section)
    folder = latest(reports)
    if folder is None:
        return Page(
            "Reconciliation",
            tag("p", f"No report in {reports} yet (its LATEST names none).", class_="note"),
            section=section,
        )
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    window = summary.get("window") or {}
    breached = summary.get("breached") or {}
    verdict = "PASS" if summary.get("passed") else "FAIL"
    rows = [
        ("Report", folder.name),
        ("Verdict", verdict),
        ("Window", f"{_time(window.get('since_ms'))} to {_time(window.get('until_ms'))}"),
        ("Transactions", str((summary.get("counts") or {}).get("transactions", "—"))),
        ("Breached", ", ".join(f"{name} {count}" for name, count in breached.items()) or "none"),
    ]
    facts = tag("dl", join(tag("dt", label) + tag("dd", value) for label, value in rows))
    link = tag(
        "p", Markup(f'<a href="{esc(view.url("/reconcile/report"))}">Open the latest report</a>')
    )
    return Page(
        "Reconciliation",
        tag("p", f"Latest report: {verdict}", role="alert" if breached else "status")
        + facts
        + link,
        section=section,
    )


def report(reports: Path | None) -> Response:
    """The latest ``report.html``; 404 when there is none."""
    folder = latest(reports)
    if folder is None or not (folder / "report.html").is_file():
        raise HttpError(HTTPStatus.NOT_FOUND, "There is no reconciliation report yet.")
    return Response(
        HTTPStatus.OK,
        (folder / "report.html").read_bytes(),
        [("Content-Type", "text/html; charset=utf-8"), ("Content-Security-Policy", REPORT_POLICY)],
    )


def _time(ms: int | None) -> str:
    return (
        "—" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")
    )
