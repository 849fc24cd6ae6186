"""The HTML report: one self-contained file with inline SVG charts (opens offline).

Everything taken from the summary (topic names, transaction ids, database labels) is
HTML-escaped; a missing value shows as a dash. The page fits a 1280-px window: tables
wrap long words and charts scale down to their container.
"""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

PALETTE = ("#3b6ea5", "#d9822b", "#2f9e6e", "#b8405e", "#7d5ba6", "#8a8a8a")
#: Shown for a missing value (None, an empty list).
DASH = "—"
#: Width of one character of the charts' 11-px axis text, rounded up (sans-serif).
CHAR_W = 6.2
#: Axis labels longer than this are shortened in charts (the tables show them whole).
CHART_LABEL_CHARS = 40
#: The slant of axis labels too long to sit under their bars.
LABEL_ANGLE = 40
#: The latency hops, as the summary names them and as the report says them.
HOPS = {"commit_latency_ms": "commit (producer → broker)", "consume_latency_ms": "consume (broker → consumer)",
        "end_to_end_ms": "end to end", "relay_latency_ms": "relay (local commit → relayed, store mode)"}


class Category(NamedTuple):
    """What an anomaly category means, and what to do when its gate is breached."""

    meaning: str
    next_step: str


#: The anomaly categories, in report order.
CATEGORIES = {
    "conflict": Category(
        "the producer databases disagree (COMMITTED in one, ROLLED_BACK in another), or it was rolled back "
        "while its messages were delivered or consumed",
        "producer databases disagree: find which service fenced the other's transaction"),
    "phantom": Category(
        "committed at the broker, or consumed, but not committed in any producer database",
        "a message was delivered for a change that did not commit: find who committed it at the broker "
        "(parked resolve --force?)"),
    "lost": Category(
        "committed in the producer database but never delivered or consumed after the grace period",
        "check the broker's check-back and the producer's transaction_log for these ids; "
        "halfmoon-broker tx state ID"),
    "unrelayed_stale": Category(
        "committed while the broker was down, its messages stored in the producer database (store mode), "
        "and still waiting there for the relay after the limit (--max-unrelayed-seconds): not lost, not delivered",
        "start a relay for that producer database (outbox relay, or the check-back worker) and check that the "
        "broker answers it; the messages wait in outbox_stored_message"),
    "duplicate_delivery": Category(
        "the broker stored the message more than once, or delivered it more than once to a group",
        "redelivery is allowed; make sure duplicate_effect stays 0 (consumers are idempotent)"),
    "duplicate_effect": Category(
        "a consumer group recorded more consumptions than the transaction has messages",
        "a consumer applied the same change twice: check its idempotency key"),
    "half_pending": Category(
        "the broker still holds the half message: neither committed nor rolled back yet",
        "check that the producer group's checker answers check-backs"),
    "parked": Category(
        "the broker parked the half message after too many unanswered check-backs",
        "once the checker answers: halfmoon-broker parked resolve ID"),
    "clock_skew": Category(
        "a hop took negative time: the broker committed before the producer, or a consumer before the broker",
        "check the clocks (NTP) of the producer, broker and consumer hosts"),
}

#: The columns of the anomalous transactions' tables: where each side saw a transaction.
#: The columns of the classification table.
ANOMALY_COLUMNS = ["category", "transactions", "share", "gate", "meaning"]
SAMPLE_COLUMNS = ["transaction id", "topic", "producer (state, time, databases)", "broker (state, commit, deliveries)",
                  "consumers (count, first, databases)"]

STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;line-height:1.4;margin:24px;color:#222}
h1{margin:0 0 8px} h2{margin:28px 0 8px;font-size:19px} h3{margin:4px 0;font-size:15px;display:inline}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;font-weight:bold}
.pass{background:#2f9e6e} .fail{background:#b8405e}
.breaches{margin:8px 0;padding-left:20px} .breaches li{margin:4px 0}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
table{border-collapse:collapse;margin:8px 0 16px;max-width:100%}
table.wide{width:100%;table-layout:fixed}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px;
overflow-wrap:anywhere}
thead th{background:#f2f2f2;overflow-wrap:normal}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.hot{color:#b8405e;font-weight:bold} td.topic{width:16em} .muted{color:#666;font-size:12px}
caption{text-align:left;font-size:13px;color:#555;padding-bottom:2px}
.id{font-family:ui-monospace,monospace;font-size:12px}
details{margin:8px 0 16px} summary{cursor:pointer}
svg{max-width:100%;height:auto;background:#fafafa;border:1px solid #eee}
.scroll{max-width:100%;overflow-x:auto}
"""


def _cards(table: str, columns: list[str]) -> str:
    """Narrow-screen rules: each row of ``table`` (a selector) a card, each cell named by its
    column, since the header row is hidden."""
    parts = [table, *(f"{table} {part}" for part in ("caption", "tbody", "tr", "th", "td"))]
    labels = "".join(f'{table} td:nth-child({i})::before{{content:"{name}: ";font-weight:bold}}'
                     for i, name in enumerate(columns, 1))
    return (f"{','.join(parts)}{{display:block;width:auto}} {table} colgroup,{table} thead{{display:none}}\n"
            f"{table} tr{{border:1px solid #ccc;border-radius:4px;margin:0 0 8px;padding:4px 0}}\n"
            f"{table} th,{table} td{{border:0;padding:2px 8px;text-align:left;white-space:normal}}\n{labels}\n")


#: On a phone (with the viewport meta): the classification and the listed transactions as
#: cards, the per-topic matrix and the wide charts scrolling inside themselves, never the page.
STYLE += (
    "@media (max-width:640px){\nbody{margin:12px;font-size:15px} h1{font-size:24px} .row{display:block}\n"
    + _cards("table.wide:has(tbody th)", ANOMALY_COLUMNS) + _cards("details table.wide", SAMPLE_COLUMNS)
    + "table:has(td.topic){display:block;overflow-x:auto}\n"
    "td.topic{white-space:nowrap;overflow-wrap:normal}\n"
    "body>div:not(.row){overflow-x:auto} body>div:not(.row)>svg{max-width:none}\n}\n"
)


def _fmt(value: Any) -> str:
    """A value as plain text: a dash when missing, thousands separators for numbers."""
    if value is None or value == []:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(item) for item in value)
    return str(value)


def _esc(value: Any) -> str:
    """A value formatted by ``_fmt`` and HTML-escaped."""
    return html.escape(_fmt(value))


def _name(key: str) -> str:
    """A summary key as words: ``duplicate_effect`` -> ``duplicate effect``."""
    return key.replace("_", " ")


def _share(rate: float | None) -> str:
    """A fraction as a percentage that never rounds a non-zero share to zero."""
    if rate is None:
        return DASH
    if 0 < rate < 0.0001:
        return "< 0.01 %"
    return f"{rate * 100:.2f} %"


def _transactions(count: int) -> str:
    """``1 transaction``, ``12,345 transactions``."""
    return f"{_fmt(count)} transaction{'' if count == 1 else 's'}"


def _ms(value: float | None) -> str:
    """A latency: ``12 ms``, ``1,234 ms``, or a dash."""
    return DASH if value is None else f"{_fmt(value)} ms"


def _percentiles(stats: dict[str, Any] | None) -> str:
    """Latency percentiles as one line, ``p50 12 ms · p99 40 ms · max 52 ms``; a dash if none."""
    known = {k: v for k, v in (stats or {}).items() if v is not None}
    return " · ".join(f"{k} {_ms(v)}" for k, v in known.items()) or DASH


def _time(iso: str | None) -> str:
    """An ISO-8601 UTC time as ``2026-11-24 08:00:01.123`` (the headers say UTC)."""
    if not iso:
        return DASH
    try:
        moment = datetime.fromisoformat(iso).astimezone(UTC)
    except ValueError:
        return iso
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def _lines(*lines: str) -> str:
    """Already-escaped lines in one cell, the first plain and the rest muted; a dash if none."""
    kept = [line for line in lines if line]
    if not kept:
        return DASH
    return kept[0] + "".join(f'<br><span class="muted">{line}</span>' for line in kept[1:])


def _count_cell(value: Any, hot: bool = False) -> str:
    """A right-aligned number cell, highlighted when ``hot`` and non-zero."""
    css = "n hot" if hot and value else "n"
    return f'<td class="{css}">{_esc(value)}</td>'


def _table(caption: str, rows: list[tuple[str, Any]]) -> str:
    """A two-column table of names and plain values (lists one item per line)."""
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_value_cell(v)}</td></tr>" for k, v in rows)
    return f"<table><caption>{html.escape(caption)}</caption>{body}</table>"


def _value_cell(value: Any) -> str:
    """A plain value for a table cell: list items one per line."""
    if isinstance(value, list | tuple) and value:
        return "<br>".join(_esc(item) for item in value)
    return _esc(value)


def _grid(caption: str, headers: list[str], rows: list[str], widths: list[int] | None = None) -> str:
    """A table with a header row; ``rows`` are ready ``<tr>`` strings. ``widths`` (percent)
    fix the column widths so long words wrap instead of widening the page."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    if widths:
        cols = "".join(f'<col style="width:{w}%">' for w in widths)
        return (f'<div class="scroll"><table class="wide"><caption>{html.escape(caption)}</caption>'
                f"<colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
    return (f'<div class="scroll"><table><caption>{html.escape(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _ordered_categories(summary: dict[str, Any]) -> list[str]:
    """The known categories in report order, then any the report has no words for."""
    present = summary.get("anomalies") or {}
    return [*CATEGORIES, *(name for name in present if name not in CATEGORIES)]


def _breach_item(summary: dict[str, Any], name: str, count: int) -> str:
    """One breached gate: count, limit, meaning and next step."""
    category = CATEGORIES.get(name)
    limit = summary["thresholds"].get(name)
    text = f"<b>{_esc(name)}</b>: {html.escape(_transactions(count))}, limit {_esc(limit)}"
    if category:
        text += f" ({html.escape(category.meaning)}). <b>Next:</b> {html.escape(category.next_step)}."
    return f"<li>{text}</li>"


def _verdict(summary: dict[str, Any]) -> str:
    """The verdict: PASS plainly, or FAIL with each breached gate and what to do about it."""
    breached: dict[str, int] = summary.get("breached") or {}
    if summary["passed"]:
        gates = ", ".join(f"{name} ≤ {_fmt(limit)}" for name, limit in summary["thresholds"].items())
        return (f'<p><span class="verdict pass">PASS</span> every gate holds ({html.escape(gates)}). '
                "Nothing to do.</p>")
    headline = "FAIL: " + ", ".join(
        f"{name} {_fmt(count)} > {_fmt(summary['thresholds'].get(name))}" for name, count in breached.items())
    items = "".join(_breach_item(summary, name, count) for name, count in breached.items())
    return (f'<p><span class="verdict fail">{html.escape(headline)}</span></p>'
            f'<ul class="breaches">{items}</ul>')


def _anomaly_table(summary: dict[str, Any]) -> str:
    """One row per anomaly category: count, share, gate and meaning."""
    counts, rates = summary.get("anomalies") or {}, summary.get("rates") or {}
    thresholds, breached = summary["thresholds"], summary.get("breached") or {}
    rows = []
    for name in _ordered_categories(summary):
        meaning = CATEGORIES[name].meaning if name in CATEGORIES else None
        rows.append(f"<tr><th>{_esc(name)}</th>{_count_cell(counts.get(name, 0), hot=name in breached)}"
                    f'<td class="n">{html.escape(_share(rates.get(name)))}</td>'
                    f'<td class="n">{_esc(thresholds.get(name))}</td><td>{_esc(meaning)}</td></tr>')
    return _grid("anomalies (gate: most allowed; a dash is no gate)",
                 ANOMALY_COLUMNS, rows, [14, 10, 8, 6, 62])


def _counts_table(summary: dict[str, Any]) -> str:
    """The counts that are not anomaly categories (transactions, committed, deliveries, ...)."""
    categories = set(_ordered_categories(summary))
    rows = [(_name(k), v) for k, v in summary["counts"].items() if k not in categories]
    return _table("transactions", rows)


def _sanity_table(summary: dict[str, Any]) -> str:
    """The input sanity counts (never fatal)."""
    return _table("input sanity", [(_name(k), v) for k, v in summary["sanity"].items()])


def _producer_side(row: dict[str, Any]) -> str:
    """What the producer databases say about one transaction (and, in store mode, how many
    of its messages they hold and since when one waits for the relay)."""
    stored = ""
    if row.get("stored"):
        waiting = row.get("oldest_unrelayed_time")
        stored = f"stored {_esc(row['stored'])}×" + (f", waiting since {html.escape(_time(waiting))}"
                                                     if waiting else ", relayed")
    return _lines(_esc(row.get("local_state")) if row.get("local_state") else "",
                  html.escape(_time(row["local_time"])) if row.get("local_time") else "", stored,
                  "<br>".join(_esc(db) for db in row.get("producer_databases") or []))


def _broker_side(row: dict[str, Any]) -> str:
    """What the broker says about one transaction."""
    known = bool(row.get("broker_state") or row.get("delivered"))
    return _lines(_esc(row.get("broker_state")) if row.get("broker_state") else "",
                  f"at {html.escape(_time(row['commit_time']))}" if row.get("commit_time") else "",
                  f"delivered {_esc(row.get('delivered') or 0)}×" if known else "")


def _consumer_side(row: dict[str, Any]) -> str:
    """What the consumer databases say about one transaction."""
    return _lines(f"consumed {_esc(row.get('consumed'))}×" if row.get("consumed") else "",
                  f"first {html.escape(_time(row['consumed_time']))}" if row.get("consumed_time") else "",
                  "<br>".join(_esc(db) for db in row.get("consumer_databases") or []))


def _sample_row(row: dict[str, Any]) -> str:
    """One anomalous transaction: id, topic and where each side saw it."""
    cells = (f'<span class="id">{_esc(row.get("transaction_id"))}</span>', _esc(row.get("topic")),
             _producer_side(row), _broker_side(row), _consumer_side(row))
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _samples_block(summary: dict[str, Any], name: str, rows: list[dict[str, Any]]) -> str:
    """The listed transactions of one category, open when its gate is breached."""
    total = (summary.get("anomalies") or {}).get(name, len(rows))
    meaning = CATEGORIES[name].meaning if name in CATEGORIES else ""
    showing = (f"showing {_fmt(len(rows))} of {_fmt(total)}; "
               f"all of them are in anomalies/category={name}/ (Parquet)")
    if rows:
        listed = _grid(showing, SAMPLE_COLUMNS, [_sample_row(row) for row in rows], [18, 16, 26, 16, 24])
    else:
        listed = f"<p>{html.escape(showing)}</p>"
    opened = " open" if name in (summary.get("breached") or {}) else ""
    return (f"<details{opened}><summary><h3>{_esc(name)}</h3> {html.escape(_transactions(total))}"
            f' <span class="muted">{html.escape(meaning)}</span></summary>{listed}</details>')


def _samples_section(summary: dict[str, Any]) -> str:
    """The anomalous transactions of each category (first 100); nothing for older summaries."""
    samples = summary.get("anomaly_samples")
    if samples is None:
        return ""
    counts = summary.get("anomalies") or {}
    blocks = [_samples_block(summary, name, samples.get(name) or [])
              for name in _ordered_categories(summary) if counts.get(name) or samples.get(name)]
    if not blocks:
        return "<h2>Anomalous transactions</h2><p>No anomalous transactions.</p>"
    return ('<h2>Anomalous transactions</h2><p class="muted">Up to 100 of each category, listed by id; '
            "times are UTC; the Parquet files sit next to this report.</p>" + "".join(blocks))


def _topic_table(summary: dict[str, Any]) -> str:
    """Per topic, with its full name: transactions, anomalies, end-to-end latency."""
    latency = {str(t["topic"]): t.get("end_to_end_ms") for t in summary.get("per_topic") or []}
    names = _ordered_categories(summary)
    breached = summary.get("breached") or {}
    rows = []
    for t in summary.get("per_topic_counts") or []:
        cells = "".join(_count_cell(t.get(name), hot=name in breached) for name in names)
        rows.append(f'<tr><td class="topic">{_esc(t["topic"])}</td>{_count_cell(t.get("transactions"))}{cells}'
                    f"<td>{html.escape(_percentiles(latency.get(str(t['topic']))))}</td></tr>")
    return _grid("per topic", ["topic", "transactions", *map(_name, names), "end to end latency"], rows)


def _run_table(summary: dict[str, Any]) -> str:
    """When the run was, what it read, and the window it kept."""
    inputs, window = summary.get("inputs") or {}, summary.get("window") or {}
    return _table("run", [
        ("generated", _epoch(summary.get("generated_at_ms"))),
        ("window", _window(window.get("since_ms"), window.get("until_ms"))),
        ("grace", None if window.get("grace_s") is None else f"{_fmt(window['grace_s'])} s"),
        ("max unrelayed", None if window.get("max_unrelayed_s") is None
         else f"{_fmt(window['max_unrelayed_s'])} s"),
        ("producer databases", inputs.get("producer_databases")),
        ("consumer databases", inputs.get("consumer_databases")),
        ("broker export", inputs.get("broker_export")),
    ])


def _window(since_ms: int | None, until_ms: int | None) -> str:
    """The --since/--until window in words."""
    if since_ms is None and until_ms is None:
        return "every transaction (no --since/--until)"
    bounds = [f"from {_epoch(since_ms)}" if since_ms is not None else "",
              f"until {_epoch(until_ms)}" if until_ms is not None else ""]
    return " ".join(bound for bound in bounds if bound)


def _epoch(ms: int | None) -> str:
    """Epoch milliseconds as a UTC time; a dash when missing."""
    if ms is None:
        return DASH
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _latency_table(summary: dict[str, Any]) -> str:
    """Percentiles of each hop."""
    latency = summary.get("latency_ms") or {}
    return _table("percentiles", [(label, _percentiles(latency.get(hop))) for hop, label in HOPS.items()])


def _charts(summary: dict[str, Any]) -> tuple[str, str, str]:
    """The latency histograms, the per-topic chart and the hourly timeline (SVG)."""
    labels = bucket_labels(summary["histogram_buckets_ms"])
    histograms = "".join(
        bar_chart(f"{HOPS.get(hop, _name(hop))}, ms", labels,
                  {"transactions": [float(v) for v in values]}, width=380)
        for hop, values in summary["histograms"].items()
    )
    topics = summary["per_topic_counts"]
    topic_chart = bar_chart(
        "per topic", [str(t["topic"]) for t in topics],
        {"transactions": [float(t["transactions"]) for t in topics],
         "phantom": [float(t["phantom"] or 0) for t in topics],
         "lost": [float(t["lost"] or 0) for t in topics],
         "duplicate delivery": [float(t["duplicate_delivery"] or 0) for t in topics]}, width=1200,
    )
    timeline = summary["timeline"]
    timeline_chart = bar_chart(
        "timeline (per hour, UTC)", [str(t["hour"])[5:16] for t in timeline],
        {"transactions": [float(t["transactions"]) for t in timeline],
         "anomalies": [float(t["anomalies"] or 0) for t in timeline]}, width=1200,
    )
    return histograms, topic_chart, timeline_chart


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


def _duration(ms: int) -> str:
    return f"{ms // 1000}s" if ms >= 1000 else str(ms)


def bucket_labels(edges: list[int]) -> list[str]:
    """Short labels of histogram buckets (ms below a second): ``<5``, ``<2s``, ..., ``≥60s``."""
    return [f"<{_duration(edges[i + 1])}" if i + 1 < len(edges) else f"≥{_duration(edges[i])}"
            for i in range(len(edges))]


def render(summary: dict[str, Any]) -> str:
    """The report page for a summary (as in summary.json)."""
    histograms, topic_chart, timeline_chart = _charts(summary)
    seconds = summary.get("seconds")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>halfmoon reconciliation</title>
<style>{STYLE}</style></head><body>
<h1>halfmoon reconciliation</h1>
{_verdict(summary)}
<p>{_esc(summary['counts']['transactions'])} transactions, computed in {_esc(seconds)} s.</p>
<h2>Classification</h2>
{_anomaly_table(summary)}
<div class="row">{_counts_table(summary)}{_sanity_table(summary)}{_run_table(summary)}</div>
{_samples_section(summary)}
<h2>Latency (committed transactions)</h2>
{_latency_table(summary)}
<div class="row">{histograms}</div>
<h2>Topics and time</h2>
{_topic_table(summary)}
<div class="scroll chart">{topic_chart}</div>
<div class="scroll chart">{timeline_chart}</div>
</body></html>
"""


def write_html(summary: dict[str, Any], path: Path) -> None:
    """Write the report for a summary (as in summary.json)."""
    path.write_text(render(summary), encoding="utf-8")
