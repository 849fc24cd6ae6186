"""The reconciliation report on a phone (375 px, headless Chromium through Playwright): the
page never scrolls sideways, the classification and the listed transactions are cards whose
cells name their column, and the wide charts keep their size, scrolling inside themselves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from outbox.reconcile.report import write_html
from tests.reconcile.test_report import LONG_TOPIC, _failing

SCREENSHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS")
                   or Path(__file__).resolve().parents[2] / "test-output" / "console")
VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'


def test_the_report_reads_on_a_375_px_phone(browser: Any, tmp_path: Path) -> None:
    summary = _failing()
    summary["per_topic_counts"] += [{**summary["per_topic_counts"][0], "topic": f"{LONG_TOPIC}.shard-{i:02d}"}
                                    for i in range(30)]
    report = tmp_path / "report.html"
    write_html(summary, report)
    page_html = report.read_text(encoding="utf-8")
    if 'name="viewport"' not in page_html:  # a phone lays out at its width only with the viewport meta
        report.write_text(page_html.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + VIEWPORT),
                          encoding="utf-8")
    context = browser.new_context(viewport={"width": 375, "height": 800})
    page = context.new_page()
    try:
        page.goto(report.as_uri())
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        cards = page.evaluate("""() => [...document.querySelectorAll('table.wide tbody tr')].slice(0, 3).map(row => ({
            display: getComputedStyle(row).display, width: row.getBoundingClientRect().width,
            labels: [...row.querySelectorAll('td')].map(td => getComputedStyle(td, '::before').content)}))""")
        assert cards[0] == {"display": "block", "width": cards[0]["width"],
                            "labels": ['"transactions: "', '"share: "', '"gate: "', '"meaning: "']}
        assert all(card["width"] >= 300 for card in cards), cards
        listed = page.evaluate("""() => getComputedStyle(document.querySelector('details table.wide td'),
                                                          '::before').content""")
        assert listed == '"transaction id: "'
        charts = page.evaluate("""() => [...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width)""")
        assert [round(w) for w in charts[-2:]] == [1202, 1202], "the wide charts keep their size and scroll"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "reconcile-report-narrow.png"), full_page=False)
    finally:
        context.close()
