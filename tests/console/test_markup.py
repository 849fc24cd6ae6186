"""The console's formatting: numbers, sizes and ages a person reads at a glance, and HTML
that escapes whatever is not already markup."""

from __future__ import annotations

import pytest

from broker_embedded.http.console.markup import Markup, body_preview, duration, number, size, tag


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (59.9, "59 s"), (60, "1 min"), (200, "3 min 20 s"), (3600, "1 h"), (7500, "2 h 5 min"),
    (86_400 * 4 + 3 * 3600 + 59, "4 d 3 h"), (-5, "0 s"),
])
def test_durations_read_as_words(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_numbers_and_sizes() -> None:
    assert number(1234567) == "1,234,567"
    assert [size(n) for n in (0, 1023, 1024, 5 * 1024**3)] == ["0 B", "1,023 B", "1.0 KiB", "5.0 GiB"]


def test_plain_text_is_escaped_markup_is_not() -> None:
    assert tag("td", "<b>") == "<td>&lt;b&gt;</td>"
    assert tag("td", Markup("<b>x</b>")) == "<td><b>x</b></td>"
    assert Markup("<p>") + "<script>" == "<p>&lt;script&gt;"
    assert "<script>" + Markup("<p>") == "&lt;script&gt;<p>"
    assert tag("input", name='a"b', required=True, hidden=False) == '<input name="a&quot;b" required>'
    assert tag("th", "x", scope="col", class_="num", aria_label="y") == '<th scope="col" class="num" aria-label="y">x</th>'


def test_body_previews_text_truncated_and_binary_as_hex() -> None:
    assert "text, 5 B" in body_preview(b"hello") and "<pre class=\"body\">hello</pre>" in body_preview(b"hello")
    long = body_preview(b"a" * 5000)
    assert "first 2,000 characters shown" in long and "a" * 2001 not in long
    binary = body_preview(b"\x00\xff" * 300)
    assert "binary, 600 B, first 256 bytes shown as hex" in binary and "00 ff 00 ff" in binary
    assert "shown as hex" in body_preview(b"\x1b[31m")  # control characters are not shown as text
