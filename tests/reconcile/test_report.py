"""The HTML report of ``outbox reconcile``, from hand-made summaries (no Spark)."""

from __future__ import annotations

import re

from outbox.reconcile.report import bar_chart, bucket_labels

LONG_TOPIC = "orders.payment-settled.v2"


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
