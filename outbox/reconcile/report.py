"""The HTML report: one self-contained file with inline SVG charts (opens offline)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

PALETTE = ("#3b6ea5", "#d9822b", "#2f9e6e", "#b8405e", "#7d5ba6", "#8a8a8a")


def bar_chart(title: str, labels: list[str], series: dict[str, list[float]], width: int = 560,
              height: int = 220) -> str:
    """A grouped bar chart as an SVG element."""
    left, bottom, top = 48, 40, 28
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max([v for values in series.values() for v in values] + [1])
    group_w = plot_w / max(len(labels), 1)
    bar_w = max(group_w / (len(series) + 1), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#444"/>',
             f'<text x="4" y="{top + 10}" font-size="10">{peak:g}</text>']
    for i, label in enumerate(labels):
        for j, (name, values) in enumerate(series.items()):
            value = values[i]
            h = plot_h * value / peak
            x = left + i * group_w + j * bar_w + bar_w / 2
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[j % len(PALETTE)]}"><title>{html.escape(name)} {html.escape(label)}: '
                         f'{value:g}</title></rect>')
        if len(labels) <= 24 or i % max(len(labels) // 12, 1) == 0:
            parts.append(f'<text x="{left + i * group_w + group_w / 2:.1f}" y="{top + plot_h + 14}" font-size="9" '
                         f'text-anchor="middle">{html.escape(label[:12])}</text>')
    for j, name in enumerate(series):
        parts.append(f'<rect x="{left + 110 * j}" y="{height - 14}" width="10" height="10" '
                     f'fill="{PALETTE[j % len(PALETTE)]}"/><text x="{left + 110 * j + 14}" y="{height - 5}" '
                     f'font-size="10">{html.escape(name)}</text>')
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
svg{{margin:8px 16px 8px 0;background:#fafafa;border:1px solid #eee}}
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
