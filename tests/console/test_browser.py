"""The console in headless Chromium (the system's, driven by Playwright): every page is
drawn, fits 1280 px and a phone's width, and works from the keyboard alone.

Screenshots of each page go to ``$CONSOLE_SCREENSHOTS`` (default ``test-output/console/``
under the checkout), for a person to look at after a CI run.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from broker_embedded import EmbeddedBroker, Message, TransactionState
from broker_embedded.http.console import make_console_app
from broker_embedded.http.console.trends import TrendSampler
from broker_embedded.http.metrics import register_broker_metrics

from .conftest import ACCESS_KEY, CONFIG, SECRET_KEY, Shop, dead_letter, park, serve

SCREENSHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "test-output" / "console")
PAGES = {
    "overview": "/",
    "trends": "/trends",
    "groups": "/groups",
    "transactions": "/transactions",
    "dead-letters": "/dead-letters?group=mailer",
    "search": "/search?id={script_id}",
    "force": "/transactions/force?id={parked_tx}&resolution=commit",
    "sign-in": "/sign-in",
}
WIDTHS = {"wide": 1280, "narrow": 375}

#: The page's focusable elements in document order, the way Tab walks them.
FOCUSABLE = "a[href], button, input:not([type=hidden]), select, textarea, [tabindex='0']"

UNLABELLED_FIELDS = """[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
    .filter(e => e.labels.length === 0).map(e => e.outerHTML)"""
LANDMARKS = "['header', 'nav', 'main', 'h1'].map(s => document.querySelectorAll(s).length)"


@pytest.fixture
def page(browser: Any, console_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=console_url, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()


def ink(page: Any, png: bytes) -> tuple[int, float]:
    """Distinct colours in a screenshot, and the share of pixels that are not white."""
    page.goto("about:blank")
    return tuple(page.evaluate("""async (src) => {
        const img = new Image(); img.src = src; await img.decode();
        const canvas = document.createElement('canvas'); canvas.width = img.width; canvas.height = img.height;
        const context = canvas.getContext('2d'); context.drawImage(img, 0, 0);
        const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
        const colours = new Set(); let inked = 0, seen = 0;
        for (let i = 0; i < data.length; i += 4 * 5) {
            const colour = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
            colours.add(colour); seen++; if (colour !== 0xffffff) inked++;
        }
        return [colours.size, inked / seen];
    }""", "data:image/png;base64," + base64.b64encode(png).decode()))


def sign_in_by_keyboard(page: Any) -> None:
    page.goto("/")  # the console has keys: every page leads to the sign-in form first
    assert page.evaluate("location.pathname") == "/sign-in"
    tab_to(page, lambda f: f["id"] == "access-key")
    page.keyboard.type(ACCESS_KEY)
    page.keyboard.press("Tab")
    page.keyboard.type(SECRET_KEY)
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Signed in: actions are available.")


def sticking_out(page: Any) -> list[str]:
    """The elements reaching past the window's right edge."""
    return page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth)
        .map(e => e.tagName + '.' + e.className).slice(0, 10)""")


def focused(page: Any) -> dict[str, Any]:
    """The focused element: its place among the focusable ones, text, id, form's id field and outline."""
    return page.evaluate("""(selector) => {
        const e = document.activeElement, style = getComputedStyle(e);
        const idField = e.form ? e.form.querySelector('input[name=id]') : null;
        return {index: [...document.querySelectorAll(selector)].indexOf(e), text: e.textContent.trim(),
                id: e.id, tag: e.tagName, target: idField ? idField.value : null,
                outline: style.outlineStyle, outlineWidth: parseFloat(style.outlineWidth)};
    }""", FOCUSABLE)


def tab_to(page: Any, wanted: Any, limit: int = 300) -> dict[str, Any]:
    for _ in range(limit):
        page.keyboard.press("Tab")
        now = focused(page)
        if wanted(now):
            return now
    raise AssertionError("Tab never reached the element")


def test_every_page_is_drawn_and_fits(page: Any, shop: Shop) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    sign_in_by_keyboard(page)  # the pages with their actions
    shots: dict[str, bytes] = {}
    for width_name, width in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in PAGES.items():
            if name == "sign-in":
                continue
            page.goto(path.format(script_id=shop.script_id, parked_tx=shop.parked_tx))
            assert page.evaluate(UNLABELLED_FIELDS) == [], f"{name} has form fields without a label"
            assert page.evaluate(LANDMARKS) == [1, 1, 1, 1], f"{name} has one header, nav, main and h1"
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} overflows {width} px by {overflow} px: {sticking_out(page)}"
            shots[f"{name}-{width_name}"] = page.screenshot(full_page=True)
    page.context.clear_cookies()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(PAGES["sign-in"])
    assert page.evaluate(UNLABELLED_FIELDS) == []
    shots["sign-in-wide"] = page.screenshot(full_page=True)
    for name, png in shots.items():
        (SCREENSHOTS / f"{name}.png").write_bytes(png)
        colours, inked = ink(page, png)
        assert colours > 8 and inked > 0.02, f"{name} looks blank ({colours} colours, {inked:.1%} inked)"


LONG_TOPIC = "com.example.shop.orders.created-events-v2"


@pytest.fixture(scope="module")
def trends_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A read-only console whose sampler saw an hour of traffic (its clock moves 30 s a
    sample): orders rise and fall and billing keeps up; payments' mailer falls behind."""
    clock = [0.0]
    with EmbeddedBroker(tmp_path_factory.mktemp("trends") / "broker", CONFIG) as broker:
        register_broker_metrics(CollectorRegistry(), broker)
        sampler = TrendSampler(broker, clock=lambda: clock[0])
        for n in range(sampler.topics.samples):
            sampler.sample()
            clock[0] += sampler.interval_s
            orders = round(30 + 25 * math.sin(n / 12))
            broker.send_batch([Message("orders", b"o") for _ in range(orders)]
                              + [Message("payments", b"p") for _ in range(n % 7)]
                              + [Message(LONG_TOPIC, b"e") for _ in range(n // 40)])
            for group, topic, most in (("billing", "orders", orders), ("mailer", "payments", 2)):
                for message in broker.receive(group, topic, max_messages=most):
                    broker.ack(group, message.receipt_handle)
        sampler.sample()
        with serve(make_console_app(broker, access_key=None, secret_key=None, trends=sampler)) as url:
            yield url


def test_the_trends_page_is_drawn_and_readable_at_1280_and_375_px(browser: Any, trends_url: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(base_url=trends_url)
    page = context.new_page()
    try:
        for width_name, width in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": 900})
            page.goto("/trends")
            assert page.evaluate("document.documentElement.scrollWidth") <= width, sticking_out(page)
            charts = page.evaluate("""() => [...document.querySelectorAll('figure.trend svg[role=img]')].map(s => {
                const box = s.getBoundingClientRect();
                return {name: s.querySelector('title').textContent, width: box.width, height: box.height,
                        paths: s.querySelectorAll('path').length};
            })""")
            assert len(charts) == 5, charts  # 3 topics, 2 groups
            assert all(c["width"] >= 200 and c["height"] >= 100 and c["paths"] >= 1 for c in charts), charts
            smallest = page.evaluate("""() => Math.min(...[...document.querySelectorAll(
                '.plot span, .values li, figcaption')].map(e => parseFloat(getComputedStyle(e).fontSize)))""")
            assert smallest >= 12, f"axis and value text is {smallest} px at {width} px"
            png = page.screenshot(full_page=True)
            (SCREENSHOTS / f"trends-chart-{width_name}.png").write_bytes(png)
            colours, inked = ink(page, png)
            assert colours > 8 and inked > 0.02, f"the trends look blank ({colours} colours, {inked:.1%} inked)"
    finally:
        context.close()


def test_tab_walks_skip_link_navigation_search_and_every_action_in_order(
    page: Any, broker: EmbeddedBroker, shop: Shop,
) -> None:
    park(broker, "tx-browser-order")
    sign_in_by_keyboard(page)
    page.goto("/transactions")
    count = page.evaluate("(s) => document.querySelectorAll(s).length", FOCUSABLE)
    walk = []
    for _ in range(count):
        page.keyboard.press("Tab")
        walk.append(focused(page))
    assert [f["index"] for f in walk] == list(range(count)), "Tab visits every focusable element in document order"
    texts = [f["text"] or f["id"] for f in walk]
    assert texts[:11] == ["Skip to content", "Overview", "Trends", "Consumer groups", "Transactions",
                          "Dead letters", "Search", "Reconciliation", "header-search", "Find", "Sign out"]
    actions = [(f["text"], f["target"]) for f in walk if f["target"]]
    for tx in (shop.parked_tx, "tx-browser-order"):
        assert [a for a in actions if a[1] == tx] == [("Recheck", tx), ("Resolve (ask checker)", tx)]
    assert {"Force commit…", "Force rollback…"} <= set(texts)
    for f in walk:
        assert f["outline"] != "none" and f["outlineWidth"] >= 2, f"no visible focus on {f}"


def test_the_skip_link_moves_focus_to_the_content(page: Any) -> None:
    page.goto("/")
    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"


def test_recheck_a_parked_transaction_with_the_keyboard_alone(page: Any, broker: EmbeddedBroker) -> None:
    park(broker, "tx-browser-recheck")
    sign_in_by_keyboard(page)
    page.goto("/transactions")
    tab_to(page, lambda f: f["text"] == "Recheck" and f["target"] == "tx-browser-recheck")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Transaction tx-browser-recheck is under check again")
    assert broker.transaction_state("tx-browser-recheck") in (TransactionState.PENDING, TransactionState.PARKED)
    assert page.evaluate("location.pathname") == "/transactions"


def test_resend_a_dead_letter_with_the_keyboard_alone(page: Any, broker: EmbeddedBroker) -> None:
    message_id = dead_letter(broker, "browser-group", b'{"refund": 3}')
    sign_in_by_keyboard(page)
    page.goto("/dead-letters?group=browser-group")
    tab_to(page, lambda f: f["text"] == "Resend" and f["target"] == message_id)
    page.keyboard.press("Enter")
    page.wait_for_selector(f"text=Message {message_id} was sent to group browser-group again.")
    assert any(m.message.message_id == message_id for m in broker.receive("browser-group", "payments", wait_s=5))
