"""The Reconciliation page: the latest nightly report's verdict and a link to it, behind the
console's sign-in."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from broker_embedded import EmbeddedBroker
from broker_embedded.http.console import make_console_app
from broker_embedded.http.console.reconcile import REPORT_POLICY, REPORTS_ENV

from .conftest import ACCESS_KEY, SECRET_KEY, serve, sign_in

REPORT = b"<!doctype html><title>reconciliation</title><p>the nightly report</p>"


def _reports(folder: Path) -> Path:
    night = folder / "2026-11-27"
    night.mkdir(parents=True)
    (night / "summary.json").write_text(
        json.dumps(
            {
                "passed": False,
                "breached": {"lost": 2},
                "counts": {"transactions": 1200},
                "window": {"since_ms": 1_795_651_200_000, "until_ms": 1_795_737_600_000},
            }
        )
    )
    (night / "report.html").write_bytes(REPORT)
    (folder / "LATEST").write_text("2026-11-27\n")
    return folder


def test_the_latest_report_is_linked_for_a_signed_in_operator_only(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    app = make_console_app(
        broker,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        reconcile_reports=_reports(tmp_path / "reports"),
    )
    with serve(app) as url, httpx.Client(base_url=url, follow_redirects=False) as client:
        for path in ("/reconcile", "/reconcile/report"):
            refused = client.get(path)
            assert refused.status_code in (303, 401) and b"nightly report" not in refused.content, (
                path
            )
        sign_in(client)
        page = client.get("/reconcile").text
        assert "Latest report: FAIL" in page and "lost 2" in page and "2026-11-27 00:00 UTC" in page
        assert 'href="/reconcile/report"' in page and 'href="/reconcile"' in client.get("/").text
        report = client.get("/reconcile/report")
        assert report.status_code == 200 and report.content == REPORT
        assert report.headers["Content-Security-Policy"] == REPORT_POLICY


def test_without_reports_the_page_says_how_to_configure_them(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REPORTS_ENV, raising=False)
    with serve(make_console_app(broker, access_key=None, secret_key=None)) as url:
        assert f"start the broker with {REPORTS_ENV}=" in httpx.get(url + "/reconcile").text
        assert httpx.get(url + "/reconcile/report").status_code == 404
    monkeypatch.setenv(REPORTS_ENV, str(tmp_path))
    with serve(make_console_app(broker, access_key=None, secret_key=None)) as url:
        assert f"No report in {tmp_path} yet" in httpx.get(url + "/reconcile").text
