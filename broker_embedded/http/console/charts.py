"""The Trends page: line charts drawn on the server as inline SVG (no script, so the strict
Content Security Policy stands), from what ``trends.TrendSampler`` recorded.

Each chart is a ``<figure>``: an SVG with a ``<title>`` and ``<desc>`` (its text
alternative), and the latest, lowest and highest value of each line in plain text beside
it. The axis labels are HTML, not SVG text, so they stay legible when the SVG stretches
or shrinks to the width of the screen; lines keep their width (``non-scaling-stroke``) and
differ by dash as well as by colour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

from .markup import Markup, duration, join, number, tag
from .pages import Page, View
from .trends import TrendView

#: The SVG's own coordinate space (it is stretched to the chart's box) and its margin.
WIDTH, HEIGHT, PAD = 300, 100, 3


@dataclass(frozen=True)
class Line:
    """One line of a chart: its name, CSS class (colour and dash) and values, oldest first."""

    label: str
    css: str
    values: Sequence[float | None]


def figure(value: float) -> str:
    """``3``, ``0.33``, ``1,234.5``: at most two decimals, none that are zero."""
    text = f"{value:,.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def per_second(value: float) -> str:
    return f"{figure(value)}/s"


def messages(value: float) -> str:
    return figure(value)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def summary(line: Line, unit: Callable[[float], str]) -> str:
    """``Sends: latest 3/s, lowest 0/s, highest 5/s`` (over the values known)."""
    known = [v for v in line.values if v is not None]
    if not known:
        return f"{line.label}: no value yet"
    return f"{line.label}: latest {unit(known[-1])}, lowest {unit(min(known))}, highest {unit(max(known))}"


def _path(values: Sequence[float | None], times: Sequence[float], start: float, window_s: float,
          top: float) -> str:
    """An SVG path through the known values; an unknown one breaks the line, and a lone
    value is a dot (a zero-length segment with round caps)."""
    parts: list[str] = []
    drawing = False
    for value, at in zip(values[-len(times):], times, strict=True):
        x = PAD + (WIDTH - 2 * PAD) * (at - start) / window_s
        if value is None or x < PAD:
            drawing = False
            continue
        y = PAD + (HEIGHT - 2 * PAD) * (1 - value / top)
        parts.append(f"{'L' if drawing else 'M'}{x:.1f} {y:.1f}" + ("" if drawing else "h0"))
        drawing = True
    return " ".join(parts)


def chart(ident: str, caption: object, title: str, lines: Sequence[Line], times: Sequence[float],
          window_s: float, unit: Callable[[float], str], least_top: float = 1.0) -> Markup:
    """A line chart of ``lines`` over the last ``window_s`` seconds of ``times``, on a scale
    from 0 to at least ``least_top``."""
    top = max(nice_ceiling(max((v for line in lines for v in line.values if v is not None), default=0.0)),
              least_top)
    start = (times[-1] if times else 0.0) - window_s
    texts = [summary(line, unit) for line in lines]
    grid = join(tag("line", class_="grid", x1=0, x2=WIDTH, y1=y, y2=y, vector_effect="non-scaling-stroke")
                for y in (PAD, HEIGHT / 2, HEIGHT - PAD))
    paths = join(tag("path", class_=f"line {line.css}", d=_path(line.values, times, start, window_s, top),
                     vector_effect="non-scaling-stroke") for line in lines)
    svg = tag("svg", tag("title", title, id=f"{ident}-title") + tag("desc", ". ".join(texts) + ".",
                                                                       id=f"{ident}-desc") + grid + paths,
              viewBox=f"0 0 {WIDTH} {HEIGHT}", preserveAspectRatio="none", role="img", focusable="false",
              aria_labelledby=f"{ident}-title", aria_describedby=f"{ident}-desc")
    y_axis = tag("div", join(tag("span", unit(v)) for v in (top, top / 2, 0)), class_="y-axis", aria_hidden="true")
    x_axis = tag("div", tag("span", f"{duration(window_s)} ago") + tag("span", "now"), class_="x-axis",
                 aria_hidden="true")
    values = tag("ul", join(tag("li", _swatch(line.css) + text) for line, text in zip(lines, texts, strict=True)),
                 class_="values")
    return tag("figure", tag("figcaption", caption) + tag("div", y_axis + svg + x_axis, class_="plot") + values,
               class_="trend")


def _swatch(css: str) -> Markup:
    """A short stretch of a line's stroke, as its key."""
    return tag("svg", tag("line", class_=f"line {css}", x1=1, x2=23, y1=4, y2=4), viewBox="0 0 24 8",
               class_="swatch", aria_hidden="true", focusable="false")


def _capped(shown: int, seen: int, limit: int, what: str) -> Markup:
    if seen <= shown:
        return Markup("")
    return tag("p", f"Showing {number(shown)} of {number(seen)} {what}: the console tracks at most {number(limit)}. "
                    f"One that stays quiet for a whole window gives its place to an active one.", class_="note")


def trends(view: View, data: TrendView) -> Page:
    """The Trends page: sends and deliveries per topic and lag per group over the window."""
    window_s = data.interval_s * data.samples
    ids = (f"trend-{n}" for n in count(1))
    intro = tag("p", f"The broker's own counters over the last {duration(window_s)}, sampled every "
                     f"{duration(data.interval_s)}; the newest sample is on the right. A rate is known from the "
                     "second sample on.", class_="note")
    topic_charts = []
    for topic, (sends, deliveries) in sorted(data.topics.items()):
        lines = [Line("Sends", "send", sends)]
        if data.deliveries_counted:
            lines.append(Line("Deliveries", "deliver", deliveries))
        what = "Sends and deliveries" if data.deliveries_counted else "Sends"
        topic_charts.append(chart(next(ids), Markup("Topic ") + tag("strong", topic),
                                  f"{what} per second of topic {topic}, last {duration(window_s)}",
                                  lines, data.times, window_s, per_second))
    no_deliveries = Markup("") if data.deliveries_counted else tag(
        "p", "Delivery rates come from the broker's metrics (halfmoon-broker serve --http-port registers them); "
             "this console's broker has none, so only sends are drawn.", class_="note")
    group_charts = [
        chart(next(ids), Markup("Group ") + tag("strong", group) + " on topic " + tag("strong", topic),
              f"Lag of consumer group {group} on topic {topic}, last {duration(window_s)}",
              [Line("Lag", "lag", lag)], data.times, window_s, messages, least_top=2)
        for (group, topic), lag in sorted(data.groups.items())
    ]
    content = (intro + tag("h2", "Sends and deliveries per topic") + no_deliveries
               + _grid(topic_charts, "No topics yet: a topic appears here at the first sample after it is created.")
               + _capped(len(topic_charts), data.topics_seen, data.max_topics, "topics")
               + tag("h2", "Lag per consumer group") + tag("p", "Lag: messages of the topic the group has not "
                                                               "acknowledged yet.", class_="note")
               + _grid(group_charts, "No consumer group has received yet.")
               + _capped(len(group_charts), data.groups_seen, data.max_groups, "group and topic pairs"))
    return Page("Trends", content, section="/trends")


def _grid(charts: list[Markup], empty: str) -> Markup:
    return tag("div", join(charts), class_="trends") if charts else tag("p", empty, class_="empty")
