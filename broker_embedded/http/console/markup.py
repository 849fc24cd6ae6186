"""Safe HTML building without a template engine: text is escaped unless it is ``Markup``."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from string import Template


class Markup(str):
    """HTML that is already safe to insert as it is; ``+`` escapes a plain string."""

    def __add__(self, other: object) -> Markup:
        return Markup(str.__add__(self, esc(other)))

    def __radd__(self, other: object) -> Markup:
        return Markup(str.__add__(esc(other), self))


def esc(value: object) -> Markup:
    """``value`` as HTML: ``Markup`` as it is, anything else as escaped text."""
    return value if isinstance(value, Markup) else Markup(html.escape(str(value), quote=True))


def join(parts: Iterable[object], separator: str = "") -> Markup:
    return Markup(separator.join(esc(p) for p in parts))


_VOID = frozenset({"input", "br", "hr", "meta", "link", "img"})


def tag(name: str, content: object = "", /, **attributes: object) -> Markup:
    """``<name attr="...">content</name>``; ``class_`` stands for ``class``, ``aria_x`` for
    ``aria-x``; an attribute of None or False is left out, True writes it bare."""
    attrs = []
    for key, value in attributes.items():
        if value is None or value is False:
            continue
        key = key.rstrip("_").replace("_", "-")
        attrs.append(f" {key}" if value is True else f' {key}="{esc(value)}"')
    if name in _VOID:
        return Markup(f"<{name}{''.join(attrs)}>")
    return Markup(f"<{name}{''.join(attrs)}>{esc(content)}</{name}>")


def fill(template: Template, **values: object) -> Markup:
    """``template`` with each ``$name`` replaced by ``values[name]``, escaped unless Markup."""
    return Markup(template.substitute({k: esc(v) for k, v in values.items()}))


def table(caption: str, headers: Sequence[str], rows: Sequence[Sequence[object]], empty: object,
          numeric: Sequence[int] = ()) -> Markup:
    """A captioned table in a scrollable region (a wide table scrolls, not the page; on a
    narrow screen each row becomes a card whose cells name their column); ``empty`` (a sentence that says what to do) when there are no rows.
    ``numeric``: the indexes of columns aligned right."""
    if not rows:
        return tag("section", tag("h3", caption) + tag("p", empty, class_="empty"), class_="empty-state")
    head = join(tag("th", h, scope="col", class_="num" if i in numeric else None) for i, h in enumerate(headers))
    body = join(
        tag("tr", join(
            tag("th" if i == 0 else "td", cell, scope="row" if i == 0 else None,
                class_="num" if i in numeric else None, data_label=headers[i])
            for i, cell in enumerate(row)
        ))
        for row in rows
    )
    return tag("div", tag("table", tag("caption", caption) + tag("thead", tag("tr", head)) + tag("tbody", body)),
               class_="scroll", tabindex="0", role="region", aria_label=caption)


def number(n: int) -> str:
    """``12,345``."""
    return f"{n:,}"


def size(n: int) -> str:
    """A byte count a person reads at a glance: ``512 B``, ``3.4 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n:,} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 5 min``, ``4 d 3 h``."""
    s = max(int(seconds), 0)
    for unit, next_unit, span, next_span in (("d", "h", 86_400, 3_600), ("h", "min", 3_600, 60),
                                               ("min", "s", 60, 1)):
        if s >= span:
            rest = (s % span) // next_span
            return f"{s // span} {unit}" + (f" {rest} {next_unit}" if rest else "")
    return f"{s} s"


def age(epoch_ms: int) -> str:
    """How long ago ``epoch_ms`` was, in words."""
    return duration(time.time() - epoch_ms / 1000)


def timestamp(epoch_ms: int) -> Markup:
    """A UTC time in a ``<time>`` element, with its age."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_ms / 1000))
    return tag("time", f"{when} ({age(epoch_ms)} ago)", datetime=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                               time.gmtime(epoch_ms / 1000)))


#: How much of a body the search page shows.
PREVIEW_CHARS = 2000
PREVIEW_BYTES_HEX = 256


def body_preview(body: bytes) -> Markup:
    """A message body as text (escaped, truncated) when it is UTF-8 text, else as hex."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\n\r\t" for c in text[:PREVIEW_CHARS]):
        shown = text[:PREVIEW_CHARS]
        note = f"text, {size(len(body))}" + (f", first {number(len(shown))} characters shown"
                                               if len(shown) < len(text) else "")
        return tag("p", note, class_="note") + tag("pre", shown, class_="body")
    shown_bytes = body[:PREVIEW_BYTES_HEX]
    note = f"binary, {size(len(body))}" + (f", first {len(shown_bytes)} bytes shown as hex"
                                            if len(shown_bytes) < len(body) else ", shown as hex")
    return tag("p", note, class_="note") + tag("pre", shown_bytes.hex(" ", 1), class_="body")
