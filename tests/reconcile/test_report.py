"""The HTML report of ``outbox reconcile``, from hand-made summaries (no Spark)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from outbox.reconcile.report import bar_chart, bucket_labels, write_html
from tests.conftest import unavailable
from tests.reconcile.test_reconcile import assert_screenshot_not_blank

LONG_TOPIC = "orders.payment-settled.v2"
HOSTILE = "<script>alert(1)</script>"
PRODUCER_DB = "postgresql+psycopg://app@db1.internal.example:5432/shop_production_orders_and_payments"
CONSUMER_DB = "sqlite:////var/lib/points/consumer-with-a-rather-long-path/points.sqlite3"
CATEGORIES = ("conflict", "phantom", "lost", "unrelayed_stale", "duplicate_delivery", "duplicate_effect",
              "half_pending", "parked", "clock_skew")
HOPS = ("commit_latency_ms", "consume_latency_ms", "end_to_end_ms")
EDGES = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]


def _sample(i: int, topic: str = LONG_TOPIC, **changes: Any) -> dict[str, Any]:
    """A lost transaction as the job lists it: committed locally, never seen by the broker."""
    return {"transaction_id": f"tx-{i:05d}", "topic": topic, "local_state": "COMMITTED", "broker_state": None,
            "local_time": "2026-11-24T08:00:01.123+00:00", "commit_time": None, "consumed_time": None,
            "producer_databases": [PRODUCER_DB], "consumer_databases": [], "delivered": 0, "consumed": 0,
            **changes}


def _percentiles(p50: int | None) -> dict[str, int | None]:
    return {"p50": p50, "p90": None if p50 is None else p50 * 2, "p99": None if p50 is None else p50 * 3,
            "max": None if p50 is None else p50 * 4}


def _summary(breached: dict[str, int] | None = None, topics: tuple[str, ...] = (LONG_TOPIC, "topic1"),
             samples: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """A summary shaped like the job's, with 12,345 lost transactions when ``lost`` is breached."""
    breached = breached or {}
    anomalies = {name: breached.get(name, 0) for name in CATEGORIES}
    total = 123_456
    return {
        "generated_at_ms": 1795510926142,
        "inputs": {"producer_databases": [PRODUCER_DB], "consumer_databases": [CONSUMER_DB],
                   "broker_export": "/var/lib/halfmoon/exports/nightly"},
        "window": {"since_ms": None, "until_ms": None, "grace_s": 60.0},
        "counts": {"transactions": total, "committed": total - 10, "rolled_back": 10, "deliveries": total,
                   "consumptions": total, **anomalies},
        "rates": {name: count / total for name, count in anomalies.items()},
        "anomalies": anomalies,
        "anomaly_samples": {name: [] for name in CATEGORIES} if samples is None else samples,
        "thresholds": {"lost": 0, "phantom": 0, "duplicate_effect": 0, "conflict": 0, "unrelayed_stale": 0},
        "breached": breached,
        "passed": not breached,
        "latency_ms": {"transactions": total, **{hop: _percentiles(12) for hop in HOPS}},
        "per_topic": [{"topic": t, "transactions": 10, **{hop: _percentiles(12) for hop in HOPS}} for t in topics],
        "per_hour": [],
        "per_topic_counts": [{"topic": t, "transactions": 61_728, **anomalies} for t in topics],
        "timeline": [{"hour": f"2026-11-24 {h:02d}:00:00", "transactions": 5_000 + h, "anomalies": h % 3}
                     for h in range(24)],
        "histogram_buckets_ms": EDGES,
        "histograms": {hop: [0, 0, 27, 71, 40, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] for hop in HOPS},
        "sanity": {"transaction_log_null_ids": 0, "unknown_local_states": None, "clock_skew": 0},
        "seconds": 10.44,
    }


def _failing() -> dict[str, Any]:
    """Lost (12,345, 100 listed), phantom and duplicate effect breached; a delivered duplicate too."""
    summary = _summary({"lost": 12_345, "phantom": 2, "duplicate_effect": 1})
    summary["anomaly_samples"].update(
        lost=[_sample(i) for i in range(100)],
        phantom=[_sample(1, "topic1", transaction_id="tx-phantom", local_state=None, local_time=None,
                         producer_databases=[], broker_state="committed", commit_time="2026-11-24T08:00:02.000+00:00", delivered=1,
                         consumed=1, consumed_time="2026-11-24T08:00:02.500+00:00",
                         consumer_databases=[CONSUMER_DB])],
    )
    summary["counts"]["duplicate_delivery"] = summary["anomalies"]["duplicate_delivery"] = 3
    return summary


def _page(summary: dict[str, Any], tmp_path: Path) -> str:
    write_html(summary, tmp_path / "report.html")
    return (tmp_path / "report.html").read_text(encoding="utf-8")


#: Tags that separate words (the others, such as <b> and <span>, run on).
BLOCKS = {"p", "br", "li", "tr", "td", "th", "caption", "h1", "h2", "h3", "summary", "text", "title", "svg"}


class _Text(HTMLParser):
    """The text a reader sees: tag contents outside <style>, with entities decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_style = self._in_style or tag == "style"
        self.parts.append(" " if tag in BLOCKS else "")

    def handle_endtag(self, tag: str) -> None:
        self._in_style = self._in_style and tag != "style"
        self.parts.append(" " if tag in BLOCKS else "")

    def handle_data(self, data: str) -> None:
        if not self._in_style:
            self.parts.append(data)


def _text(page: str) -> str:
    parser = _Text()
    parser.feed(page)
    return " ".join("".join(parser.parts).split())


def _sample_rows(page: str, category: str) -> list[str]:
    """The text of each listed transaction row of one category."""
    block = page.split(f"<h3>{category}</h3>", 1)[1].split("</details>", 1)[0]
    return [_text(row) for row in block.split("<tbody>", 1)[1].split("</tr>")[:-1]]


def test_anomalous_transactions_are_listed_with_topic_times_and_databases(tmp_path: Path) -> None:
    page = _page(_failing(), tmp_path)
    lost = _sample_rows(page, "lost")
    assert len(lost) == 100
    assert lost[0].startswith(f"tx-00000 {LONG_TOPIC} COMMITTED 2026-11-24 08:00:01.123 {PRODUCER_DB} — —")
    summary = _failing()
    summary["anomaly_samples"]["lost"][0].update(broker_state="committed", commit_time="2026-11-24T08:00:01.200Z")
    [never_delivered, *_] = _sample_rows(_page(summary, tmp_path), "lost")
    assert never_delivered.endswith("COMMITTED 2026-11-24 08:00:01.123 "
                                    f"{PRODUCER_DB} committed at 2026-11-24 08:00:01.200 delivered 0× —")
    [phantom] = _sample_rows(page, "phantom")
    assert phantom == ("tx-phantom topic1 — committed at 2026-11-24 08:00:02.000 delivered 1× "
                       f"consumed 1× first 2026-11-24 08:00:02.500 {CONSUMER_DB}")
    text = _text(page)
    assert "showing 100 of 12,345; all of them are in anomalies/category=lost/ (Parquet)" in text
    assert "showing 1 of 2; all of them are in anomalies/category=phantom/ (Parquet)" in text
    # Each category says what it means; one with nothing listed still says how many there are.
    assert "lost 12,345 transactions committed in the producer database but never delivered" in text
    assert "showing 0 of 3; all of them are in anomalies/category=duplicate_delivery/" in text
    assert "transaction id" not in page.split("<h3>duplicate_delivery</h3>", 1)[1].split("</details>")[0]
    assert "category=conflict/" not in text  # none of them: no empty list


def test_messages_waiting_for_the_relay_say_where_since_when_and_what_to_do(tmp_path: Path) -> None:
    summary = _summary({"unrelayed_stale": 4})
    summary["window"]["max_unrelayed_s"] = 3600.0
    summary["anomaly_samples"]["unrelayed_stale"] = [
        _sample(0, stored=2, oldest_unrelayed_time="2026-11-24T06:59:58.000+00:00")]
    page = _page(summary, tmp_path)
    [waiting] = _sample_rows(page, "unrelayed_stale")
    assert waiting == (f"tx-00000 {LONG_TOPIC} COMMITTED 2026-11-24 08:00:01.123 stored 2×, waiting since "
                       f"2026-11-24 06:59:58.000 {PRODUCER_DB} — —")
    text = _text(page)
    assert "FAIL: unrelayed_stale 4 > 0" in text and "max unrelayed 3,600 s" in text
    assert "waiting there for the relay after the limit" in text and "Next: start a relay" in text


def test_a_summary_without_samples_still_renders_without_them(tmp_path: Path) -> None:
    summary = _failing()
    del summary["anomaly_samples"]
    text = _text(_page(summary, tmp_path))
    assert "FAIL: lost 12,345 > 0" in text and "Anomalous transactions" not in text and "showing" not in text


@pytest.mark.parametrize("make", [_summary, _failing])
def test_no_none_on_the_page(make: Any, tmp_path: Path) -> None:
    summary = make()
    summary["latency_ms"]["consume_latency_ms"] = _percentiles(None)
    summary["per_topic_counts"][0]["lost"] = None
    text = _text(_page(summary, tmp_path))
    assert not re.search(r"\b(None|nan)\b", text), text


def test_missing_values_are_dashes_and_numbers_are_readable(tmp_path: Path) -> None:
    summary = _failing()
    summary["latency_ms"]["consume_latency_ms"] = _percentiles(None)
    text = _text(_page(summary, tmp_path))
    assert "end to end p50 12 ms · p90 24 ms · p99 36 ms · max 48 ms" in text
    assert "consume (broker → consumer) —" in text
    assert "transactions 123,456" in text and "unknown local states —" in text
    assert "since_ms" not in text and "window every transaction (no --since/--until)" in text
    assert "lost 12,345 10.00 % 0" in text and "phantom 2 < 0.01 % 0" in text  # shares: none rounds to 0


def test_long_topic_names_are_shown_whole(tmp_path: Path) -> None:
    page = _page(_failing(), tmp_path)
    topics = page.split("<caption>per topic</caption>", 1)[1].split("</table>", 1)[0]
    assert f'<td class="topic">{LONG_TOPIC}</td>' in topics and '<td class="topic">topic1</td>' in topics
    assert f">{LONG_TOPIC}</text>" in page.split("per topic</text>", 1)[1]  # the chart's axis


def test_data_is_html_escaped(tmp_path: Path) -> None:
    summary = _summary({"lost": 1}, topics=(HOSTILE,))
    summary["inputs"]["producer_databases"] = [HOSTILE]
    summary["anomaly_samples"]["lost"] = [_sample(0, HOSTILE, transaction_id=HOSTILE, producer_databases=[HOSTILE],
                                                  local_state=HOSTILE)]
    page = _page(summary, tmp_path)
    assert "<script" not in page.lower()
    escaped = html.escape(HOSTILE)
    assert page.count(escaped) >= 6  # id, topic, state, database, run table, per-topic table and chart
    assert HOSTILE in _text(page)


def test_the_page_opens_offline(tmp_path: Path) -> None:
    page = _page(_failing(), tmp_path).lower()
    assert "<svg" in page and "<script" not in page and "<link" not in page and "url(" not in page


def test_a_pass_says_so_plainly(tmp_path: Path) -> None:
    text = _text(_page(_summary(), tmp_path))
    assert ("PASS every gate holds (lost ≤ 0, phantom ≤ 0, duplicate_effect ≤ 0, conflict ≤ 0, unrelayed_stale ≤ 0). "
            "Nothing to do.") in text
    assert "FAIL" not in text and "Next:" not in text
    assert "Anomalous transactions No anomalous transactions." in text


def test_a_fail_names_each_breached_gate_with_count_limit_and_next_step(tmp_path: Path) -> None:
    page = _page(_failing(), tmp_path)
    assert "FAIL: lost 12,345 &gt; 0, phantom 2 &gt; 0, duplicate_effect 1 &gt; 0" in page
    breaches = [_text(item) for item in page.split('<ul class="breaches">', 1)[1].split("</ul>")[0].split("</li>")[:-1]]
    assert len(breaches) == 3
    lost, phantom, effect = breaches
    assert lost.startswith("lost: 12,345 transactions, limit 0 (committed in the producer database")
    assert lost.endswith("Next: check the broker's check-back and the producer's transaction_log for these ids; "
                         "halfmoon-broker tx state ID.")
    assert phantom.startswith("phantom: 2 transactions, limit 0")
    assert "find who committed it at the broker (parked resolve --force?)" in phantom
    assert effect.startswith("duplicate_effect: 1 transaction, limit 0")
    assert effect.endswith("Next: a consumer applied the same change twice: check its idempotency key.")
    # Not breached, so not in the verdict (duplicate_delivery has no gate here).
    assert "fenced" not in page.split('<ul class="breaches">', 1)[1].split("</ul>")[0]


def test_a_conflict_gate_points_at_the_fencing(tmp_path: Path) -> None:
    page = _page(_summary({"conflict": 2}), tmp_path)
    assert "conflict 2 &gt; 0" in page  # what tests/reconcile/test_cross_database.py reads
    assert "Next: producer databases disagree: find which service fenced the other's transaction." in _text(page)


def test_bar_chart_and_bucket_labels_keep_working() -> None:
    assert bucket_labels([0, 5, 1000, 60000]) == ["<5", "<1s", "<60s", "≥60s"]
    level = bar_chart("short", ["a", "b"], {"n": [1.0, 2.0]})
    assert level.startswith("<svg") and ">a</text>" in level and "rotate" not in level
    slanted = bar_chart("long", [LONG_TOPIC] * 20, {"n": [1.0] * 20})
    assert slanted.count(f">{LONG_TOPIC}</text>") == 20 and "rotate(-40" in slanted
    assert _svg_height(slanted) > _svg_height(level)  # room for the slanted labels


def _svg_height(svg: str) -> int:
    found = re.search(r'height="(\d+)"', svg)
    assert found
    return int(found[1])


#: Appended to a copy of the report: records how wide the page lays out.
MEASURE = ("<script>document.body.setAttribute('data-widths', document.documentElement.scrollWidth + ' ' "
           "+ document.documentElement.clientWidth)</script>")


def _screenshot_command(report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Screenshot ``report`` with test_reconcile's helper (asserting it is not blank) and return
    the Chromium command it ran, so the width check runs Chromium with the same flags."""
    commands: list[list[str]] = []
    run = subprocess.run

    def recording(command: list[str], *args: Any, **kwargs: Any) -> Any:
        commands.append(list(command))
        return run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording)
    assert_screenshot_not_blank(report, tmp_path)
    monkeypatch.setattr(subprocess, "run", run)
    return commands[-1]


def _layout_widths(command: list[str], report: Path) -> tuple[int, int]:
    """(scrollWidth, clientWidth) of the report laid out by ``command`` with --dump-dom."""
    measured = report.with_name("measured.html")
    measured.write_text(report.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"),
                        encoding="utf-8")
    dump = [arg for arg in command if not arg.startswith("--screenshot=") and arg != report.as_uri()]
    dom = subprocess.run([*dump, "--dump-dom", measured.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    found = re.search(r'data-widths="(\d+) (\d+)"', dom)
    assert found, f"Chromium did not run the measuring script: {dom[:500]!r}"
    return int(found[1]), int(found[2])


def _crowded_report(tmp_path: Path) -> Path:
    """A failing report with 31 topics and 150-character words that nothing can break."""
    summary = _failing()
    summary["per_topic_counts"] += [{**summary["per_topic_counts"][0], "topic": f"{LONG_TOPIC}.shard-{i:02d}"}
                                    for i in range(30)]
    unbroken = "x" * 150  # no place to break: the cell must wrap it anyway
    summary["anomaly_samples"]["lost"].append(_sample(100, unbroken, transaction_id=unbroken,
                                                      producer_databases=[unbroken]))
    summary["inputs"]["broker_export"] = unbroken
    report = tmp_path / "report.html"
    write_html(summary, report)
    return report


def test_the_report_fits_1280_pixels_in_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _crowded_report(tmp_path)
    command = _screenshot_command(report, tmp_path, monkeypatch)
    assert "--window-size=1280,2000" in command
    scroll_width, client_width = _layout_widths(command, report)
    assert scroll_width <= min(client_width, 1280), (scroll_width, client_width)


def test_the_report_fits_a_phone(tmp_path: Path) -> None:
    """On a 375 px phone (Chromium's mobile emulation through Playwright, which lays a page
    without a viewport meta out 980 px wide) nothing reaches past the screen's edge: wide
    tables and charts scroll sideways in a box of their own that fits."""
    report = _crowded_report(tmp_path)
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in report.read_text()
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("the system's chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport={"width": 375, "height": 800}, is_mobile=True,
                                       has_touch=True).new_page()
            page.goto(report.as_uri())
            page.screenshot(path=str(tmp_path / "report-375.png"), full_page=True)
            width = page.evaluate("document.documentElement.scrollWidth")
            outside = page.evaluate("""() => [...document.querySelectorAll('body *')]
                .filter(e => !e.parentElement.closest('.scroll') && e.getBoundingClientRect().right > 375.5)
                .map(e => e.tagName + '.' + e.className).slice(0, 10)""")
        finally:
            browser.close()
    assert width <= 375 and outside == [], (width, outside)
