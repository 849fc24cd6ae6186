"""The HTML report: one self-contained file with inline SVG charts (opens offline)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, NamedTuple

PALETTE = ("#3b6ea5", "#d9822b", "#2f9e6e", "#b8405e", "#7d5ba6", "#8a8a8a")
#: Width of one character of the charts' 11-px axis text, rounded up (sans-serif).
CHAR_W = 6.2
#: Axis labels longer than this are shortened in charts (the bars' tooltips keep them whole).
CHART_LABEL_CHARS = 40
#: The slant of axis labels too long to sit under their bars.
LABEL_ANGLE = 40


class _Axis(NamedTuple):
    """How the category labels of a chart are drawn: every ``step``-th, slanted or not,
    and the height of the band they take below the plot."""

    step: int
    slanted: bool
    band: float


def _short(label: str) -> str:
    """A chart label cut to ``CHART_LABEL_CHARS``, with an ellipsis when cut."""
    return label if len(label) <= CHART_LABEL_CHARS else label[:CHART_LABEL_CHARS - 1] + "…"


def _axis(labels: list[str], group_w: float) -> _Axis:
    """Labels that fit under their bars stay level; longer ones are slanted and shown whole."""
    step = 1 if len(labels) <= 24 else len(labels) // 12
    longest = max((len(_short(label)) for label in labels), default=0) * CHAR_W
    if longest <= group_w * step - 4:
        return _Axis(step, False, 18)
    return _Axis(step, True, 18 + longest * math.sin(math.radians(LABEL_ANGLE)))


def _axis_label(label: str, x: float, y: float, slanted: bool) -> str:
    """One category label under the plot at ``x``."""
    text = html.escape(_short(label))
    if not slanted:
        return f'<text x="{x:.1f}" y="{y}" font-size="11" text-anchor="middle">{text}</text>'
    return (f'<text x="{x:.1f}" y="{y}" font-size="11" text-anchor="end" '
            f'transform="rotate(-{LABEL_ANGLE} {x:.1f} {y})">{text}</text>')


def _legend(names: list[str], x: float, y: float) -> str:
    """A colour key of the series, left to right."""
    parts, at = [], x
    for j, name in enumerate(names):
        parts.append(f'<rect x="{at:.1f}" y="{y - 10}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>'
                     f'<text x="{at + 14:.1f}" y="{y}" font-size="11">{html.escape(name)}</text>')
        at += 24 + len(name) * CHAR_W
    return "".join(parts)


def _left_margin(labels: list[str], peak_text: str, group_w: float, axis: _Axis) -> float:
    """Room left of the plot for the peak value and for the first slanted label."""
    room = 8 + len(peak_text) * CHAR_W
    if axis.slanted and labels:
        first = len(_short(labels[0])) * CHAR_W * math.cos(math.radians(LABEL_ANGLE))
        room = max(room, first - group_w / 2 + 4)
    return max(room, 40)


def bar_chart(title: str, labels: list[str], series: dict[str, list[float]], width: int = 560,
              height: int = 220) -> str:
    """A grouped bar chart as an SVG element that scales down to its container.

    ``height`` fits level labels; labels too long for their bars are slanted, shown whole up
    to ``CHART_LABEL_CHARS``, and make the chart taller.
    """
    top, plot_h = 28, height - 68
    peak = max([v for values in series.values() for v in values] + [1])
    peak_text = f"{peak:,.0f}" if float(peak).is_integer() else f"{peak:,.2f}"
    rough_group_w = (width - 58) / max(len(labels), 1)  # before the left margin is known
    axis = _axis(labels, rough_group_w)
    left = _left_margin(labels, peak_text, rough_group_w, axis)
    plot_w = width - left - 10
    group_w = plot_w / max(len(labels), 1)
    bar_w = max(group_w / (len(series) + 1), 1)
    total_h = top + plot_h + axis.band + 22
    base = top + plot_h
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h:.0f}" '
             f'viewBox="0 0 {width} {total_h:.0f}" role="img">',
             f'<text x="8" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left:.1f}" y1="{base}" x2="{left + plot_w:.1f}" y2="{base}" stroke="#444"/>',
             f'<text x="{left - 4:.1f}" y="{top + 10}" font-size="11" text-anchor="end">{peak_text}</text>',
             f'<text x="{left - 4:.1f}" y="{base}" font-size="11" text-anchor="end">0</text>']
    for i, label in enumerate(labels):
        for j, (name, values) in enumerate(series.items()):
            h = plot_h * values[i] / peak
            x = left + i * group_w + j * bar_w + bar_w / 2
            parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[j % len(PALETTE)]}"><title>{html.escape(name)} {html.escape(label)}: '
                         f'{values[i]:,g}</title></rect>')
        if i % axis.step == 0:
            parts.append(_axis_label(label, left + i * group_w + group_w / 2, base + 14, axis.slanted))
    parts.append(_legend(list(series), left, total_h - 6))
    parts.append("</svg>")
    return "".join(parts)


def _table(caption: str, rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table><caption>{html.escape(caption)}</caption>{body}</table>"


def _duration(ms: int) -> str:
    return f"{ms // 1000}s" if ms >= 1000 else str(ms)


def bucket_labels(edges: list[int]) -> list[str]:
    """Short labels of histogram buckets (ms below a second): ``<5``, ``<2s``, ..., ``≥60s``."""
    return [f"<{_duration(edges[i + 1])}" if i + 1 < len(edges) else f"≥{_duration(edges[i])}"
            for i in range(len(edges))]


def write_html(summary: dict[str, Any], path: Path) -> None:
    """Write the report for a summary (as in summary.json)."""
    counts = summary["counts"]
    passed = summary["passed"]
    edges = summary["histogram_buckets_ms"]
    labels = bucket_labels(edges)
    histograms = "".join(
        bar_chart(f"latency: {hop.replace('_ms', '').replace('_', ' ')} (ms; s where marked)", labels,
                  {"transactions": [float(v) for v in values]})
        for hop, values in summary["histograms"].items()
    )
    topics = summary["per_topic_counts"]
    topic_chart = bar_chart(
        "per topic", [str(t["topic"]) for t in topics],
        {"transactions": [float(t["transactions"]) for t in topics],
         "phantom": [float(t["phantom"] or 0) for t in topics],
         "lost": [float(t["lost"] or 0) for t in topics],
         "duplicate delivery": [float(t["duplicate_delivery"] or 0) for t in topics]},
    )
    timeline = summary["timeline"]
    timeline_chart = bar_chart(
        "timeline (per hour)", [str(t["hour"])[5:16] for t in timeline],
        {"transactions": [float(t["transactions"]) for t in timeline],
         "anomalies": [float(t["anomalies"] or 0) for t in timeline]}, width=1120,
    )
    latency = summary.get("latency_ms") or {}
    latency_rows = [
        (hop, ", ".join(f"{k} {v}" for k, v in (latency.get(hop) or {}).items()))
        for hop in ("commit_latency_ms", "consume_latency_ms", "end_to_end_ms")
    ]
    verdict = "PASS" if passed else "FAIL: " + ", ".join(
        f"{name} {count} > {summary['thresholds'][name]}" for name, count in summary["breached"].items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>halfmoon reconciliation</title>
<style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}}
h1{{margin-bottom:4px}} .verdict{{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;
background:{'#2f9e6e' if passed else '#b8405e'}}}
table{{border-collapse:collapse;margin:8px 24px 16px 0;display:inline-table;vertical-align:top}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}}
caption{{text-align:left;font-size:12px;color:#666;padding-bottom:2px}}
svg{{margin:8px 16px 8px 0;background:#fafafa;border:1px solid #eee;max-width:100%;height:auto}}
</style></head><body>
<h1>halfmoon reconciliation</h1>
<p><span class="verdict">{html.escape(verdict)}</span> {counts['transactions']} transactions,
computed in {summary['seconds']} s</p>
<h2>Classification</h2>
{_table("transactions", [(k, v) for k, v in counts.items()])}
{_table("thresholds (most allowed)", list(summary['thresholds'].items()))}
{_table("input sanity", list(summary['sanity'].items()))}
<h2>Latency (ms, committed transactions)</h2>
{_table("percentiles", latency_rows)}
<div>{histograms}</div>
<h2>Topics and time</h2>
<div>{topic_chart}</div>
<div>{timeline_chart}</div>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
