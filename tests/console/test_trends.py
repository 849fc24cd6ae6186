"""The Trends page: send and delivery rates per topic and lag per group, drawn as SVG on the
server from counters sampled once per interval into bounded buffers.

The sampler's clock is a variable the tests move, so an interval passes without sleeping.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.http.console import make_console_app
from broker_embedded.http.console.app import CONTENT_SECURITY_POLICY
from broker_embedded.http.console.charts import nice_ceiling
from broker_embedded.http.console.trends import TrendSampler
from broker_embedded.http.metrics import register_broker_metrics

from .conftest import ACCESS_KEY, CONFIG, SECRET_KEY, eventually, serve, sign_in

LAYOUT = Path(__file__).resolve().parents[2] / "broker_embedded" / "http" / "console" / "layout.html"


class Clock:
    """The sampler's clock: it moves when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Chart:
    title: str
    desc: str
    #: The points of each line's path, as (x, y) in the SVG's coordinates.
    lines: dict[str, list[tuple[float, float]]]
    #: The visible text beside the chart.
    text: str


def charts(page: str) -> dict[str, Chart]:
    """Every chart of a Trends page, by its SVG title."""
    found = {}
    for figure in page.split('<figure class="trend">')[1:]:
        figure = figure.split("</figure>")[0]
        title = re.search(r'<title id="trend-\d+-title">(.*?)</title>', figure)
        desc = re.search(r'<desc id="trend-\d+-desc">(.*?)</desc>', figure)
        assert title and desc, figure
        lines = {css: [(float(x), float(y)) for x, y in re.findall(r"[ML]([\d.]+) ([\d.]+)", d)]
                 for css, d in re.findall(r'<path class="line (\w+)" d="([^"]*)"', figure)}
        text = html.unescape(re.sub(r"<[^>]+>", " ", figure.split("</svg>", 1)[1]))
        found[html.unescape(title[1])] = Chart(html.unescape(title[1]), html.unescape(desc[1]), lines,
                                               " ".join(text.split()))
    return found


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, TrendSampler, Clock, httpx.Client]]:
    """A broker with its metrics (as ``serve --http-port`` registers them), its console with
    keys over real HTTP with a sampler on a test clock, and a signed-in client."""
    clock = Clock()
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker:
        register_broker_metrics(CollectorRegistry(), broker)
        sampler = TrendSampler(broker, interval_s=10, samples=6, clock=clock)
        app = make_console_app(broker, access_key=ACCESS_KEY, secret_key=SECRET_KEY, trends=sampler)
        with serve(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            sign_in(client)
            yield broker, sampler, clock, client


def tick(sampler: TrendSampler, clock: Clock, seconds: float = 10) -> None:
    clock.now += seconds
    sampler.sample()


def test_trends_draw_the_rates_sent_and_delivered_and_the_lag_per_interval(
    live: tuple[EmbeddedBroker, TrendSampler, Clock, httpx.Client],
) -> None:
    broker, sampler, clock, client = live
    broker.create_topic("audit", queues=2)
    sampler.sample()  # the first sample: counters known, rates not yet
    for i in range(30):
        broker.send(Message("orders", f"{i}".encode()))
    broker.send_batch([Message("audit", b"a") for _ in range(5)])
    received = broker.receive("billing", "orders", max_messages=20, invisible_duration_s=600)
    assert len(received) == 20
    for message in received[:4]:
        broker.ack("billing", message.receipt_handle)
    tick(sampler, clock)  # 10 s: 30 sent, 20 delivered from orders; billing lags 26
    broker.send_batch([Message("orders", b"more") for _ in range(60)])
    tick(sampler, clock, 20)  # 20 s: 60 sent, none delivered; billing lags 86

    response = client.get("/trends")
    assert response.status_code == 200
    shown = charts(response.text)
    orders = shown["Sends and deliveries per second of topic orders, last 1 min"]
    assert orders.desc == ("Sends: latest 3/s, lowest 3/s, highest 3/s. "
                           "Deliveries: latest 0/s, lowest 0/s, highest 2/s.")
    assert "Sends: latest 3/s, lowest 3/s, highest 3/s" in orders.text
    sends, deliveries = orders.lines["send"], orders.lines["deliver"]
    assert len(sends) == len(deliveries) == 2, "a point per interval after the first sample"
    assert sends[0][1] == sends[1][1], "the same rate, the same height"
    assert deliveries[1][1] > deliveries[0][1], "deliveries fell to 0: the line goes down"
    audit = shown["Sends and deliveries per second of topic audit, last 1 min"]
    assert audit.desc.startswith("Sends: latest 0/s, lowest 0/s, highest 0.5/s.")
    lag = shown["Lag of consumer group billing on topic orders, last 1 min"]
    assert lag.desc == "Lag: latest 86, lowest 26, highest 86."
    assert len(lag.lines["lag"]) == 2
    assert lag.lines["lag"][1][1] < lag.lines["lag"][0][1], "the lag rose: the line goes up"


def test_the_x_axis_is_time_and_the_y_axis_starts_at_zero(
    live: tuple[EmbeddedBroker, TrendSampler, Clock, httpx.Client],
) -> None:
    broker, sampler, clock, client = live
    sampler.sample()
    broker.send_batch([Message("orders", b"x") for _ in range(10)])
    tick(sampler, clock)  # 1/s
    tick(sampler, clock, 30)  # 0/s, three intervals later
    points = charts(client.get("/trends").text)[
        "Sends and deliveries per second of topic orders, last 1 min"].lines["send"]
    (x1, y1), (x2, y2) = points
    assert x2 == 297.0, "the newest sample is at the right edge"
    assert x2 - x1 == pytest.approx(294 * 30 / 60), "half the window (30 of 60 s) apart"
    assert (y1, y2) == (3.0, 97.0), "1/s at the top of a 0 to 1/s scale, 0/s at the bottom"


def test_the_page_keeps_the_strict_content_security_policy(
    live: tuple[EmbeddedBroker, TrendSampler, Clock, httpx.Client],
) -> None:
    broker, sampler, clock, client = live
    broker.send(Message("orders", b"x"))
    sampler.sample()
    tick(sampler, clock)
    response = client.get("/trends")
    policy = response.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in policy and "unsafe" not in policy and "script-src" not in policy
    page = response.text
    assert "<svg" in page
    assert "<script" not in page.lower() and " style=" not in page and not re.search(r"\son\w+=", page)


def test_the_buffers_stay_at_their_caps_however_many_samples_topics_and_groups(tmp_path: Path) -> None:
    clock = Clock()
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker:
        register_broker_metrics(CollectorRegistry(), broker)
        sampler = TrendSampler(broker, interval_s=10, samples=5, max_topics=3, max_groups=2, clock=clock)
        topics = [f"topic-{i:02d}" for i in range(10)]
        for n in range(40):
            broker.send_batch([Message(topic, b"x") for topic in topics[n % 10:]])
            broker.receive(f"group-{n % 5}", topics[n % 10], max_messages=1)
            tick(sampler, clock)
        for sets in (sampler.topics, sampler.groups):
            assert len(sets.series) == sets.limit
            assert all(len(ring) == 5 for rings in sets.series.values() for ring in rings)
        assert len(sampler.times) == 5
        view = sampler.view()
        assert (view.topics_seen, view.groups_seen) == (10, 10)

        with serve(make_console_app(broker, access_key=None, secret_key=None, trends=sampler)) as url:
            page = httpx.get(url + "/trends").text
        assert len(charts(page)) == 3 + 2
        assert "Showing 3 of 10 topics: the console tracks at most 3." in page
        assert "Showing 2 of 10 group and topic pairs: the console tracks at most 2." in page


def test_a_topic_quiet_for_a_whole_window_gives_its_place_to_an_active_one(tmp_path: Path) -> None:
    clock = Clock()
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker:
        for topic in ("a", "b", "c"):
            broker.create_topic(topic)
        sampler = TrendSampler(broker, interval_s=10, samples=4, max_topics=2, clock=clock)
        sampler.sample()
        assert set(sampler.topics.series) == {"a", "b"}, "while there is room: in name order"
        for _ in range(6):
            broker.send(Message("b", b"busy"))
            broker.send(Message("c", b"busy"))
            tick(sampler, clock)
        assert set(sampler.topics.series) == {"b", "c"}, "a was quiet for a window; c is active"


def test_without_metrics_only_sends_are_drawn_and_the_page_says_why(tmp_path: Path) -> None:
    clock = Clock()
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker:
        sampler = TrendSampler(broker, interval_s=10, samples=6, clock=clock)
        sampler.sample()
        broker.send(Message("orders", b"x"))
        tick(sampler, clock)
        with serve(make_console_app(broker, access_key=None, secret_key=None, trends=sampler)) as url:
            page = httpx.get(url + "/trends").text
        chart = charts(page)["Sends per second of topic orders, last 1 min"]
        assert set(chart.lines) == {"send"} and chart.desc == "Sends: latest 0.1/s, lowest 0.1/s, highest 0.1/s."
        assert "this console&#x27;s broker has none, so only sends are drawn" in page


def test_a_console_samples_on_a_thread_of_its_own_until_the_broker_closes(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker:
        broker.send(Message("orders", b"x"))
        app = make_console_app(broker, access_key=None, secret_key=None)
        eventually(lambda: len(app.trends.times) == 1)  # the first sample at once
        assert "orders" in app.trends.topics.series
        app.trends.stop()
        assert app.trends._thread is not None and not app.trends._thread.is_alive()


@pytest.mark.parametrize("bad", [{"interval_s": 0}, {"samples": 1}, {"max_topics": 0}, {"max_groups": True},
                                 {"samples": 2.5}])
def test_bad_sampler_settings_are_refused(tmp_path: Path, bad: dict[str, float]) -> None:
    with EmbeddedBroker(tmp_path / "broker", CONFIG) as broker, pytest.raises(ValueError, match=next(iter(bad))):
        TrendSampler(broker, **bad)  # type: ignore[arg-type]


def _luminance(colour: str) -> float:
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_the_line_colours_contrast_with_the_background() -> None:
    colours = dict(re.findall(r"--(\w+): (#[0-9a-f]{6})", LAYOUT.read_text(encoding="utf-8")))
    background = _luminance(colours["bg"])
    for name in ("send", "deliver", "lag", "muted"):
        ratio = (background + 0.05) / (_luminance(colours[name]) + 0.05)
        assert ratio >= 4.5, f"--{name} has a contrast of {ratio:.1f}:1 on the background"


def test_the_scale_tops_at_a_round_number() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 1.01, 3, 7, 86, 1234)] == [1, 0.5, 1, 2, 5, 10, 100, 2000]
