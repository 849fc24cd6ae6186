"""The broker's HTTP port: a real ``halfmoon-broker serve --http-port`` scraped over HTTP,
the numbers checked against what the test did; health and readiness; mounted WSGI apps."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker_embedded import BrokerClient, BrokerConfig, EmbeddedBroker, Message, Resolution
from broker_embedded.http.metrics import register_broker_metrics
from broker_embedded.http.port import HttpPort
from broker_embedded.http.readiness import Readiness
from broker_embedded.message import CheckRequest
from tests.ports import free_port

from .conftest import ServerProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(url: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    """Status, body and headers of one HTTP request (error statuses included)."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def scrape(base: str) -> Samples:
    """Every sample of ``base``/metrics, by name and labels."""
    status, text, _ = get(base + "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def dead_letter_one(data_dir: Path) -> None:
    """A message of group ``dlq-group`` dead-lettered in ``data_dir`` (one delivery allowed)."""
    config = BrokerConfig(max_delivery_attempts=1, retry_backoff_s=(0.0,))
    with EmbeddedBroker(data_dir, config) as broker:
        broker.send(Message("poison", b"poison"))
        assert broker.receive("dlq-group", "poison", invisible_duration_s=0.05)
        time.sleep(0.1)
        assert broker.receive("dlq-group", "poison") == []
        assert broker.dlq_depth() == {"dlq-group": 1}


def test_a_served_broker_exports_what_it_did(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    dead_letter_one(data_dir)
    http_port = free_port()
    server = ServerProcess(data_dir, "--http-port", str(http_port), "--transaction-timeout", "0.3",
                           "--check-interval", "0.3", "--check-max", "1").start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, "readiness")
        assert get(base + "/healthz")[:2] == (200, "ok\n")
        assert get(base + "/readyz")[:2] == (200, "ready\n")
        with BrokerClient(server.url) as client, BrokerClient(server.url) as checker:
            run_the_workload(client, checker)
            samples = scrape(base)
            assert value(samples, "halfmoon_broker_connections") >= 2
        assert_counted(samples)
        assert_state(samples)
        assert_http_rules(base)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(base + "/healthz", timeout=5)
    finally:
        server.stop()


def run_the_workload(client: BrokerClient, checker: BrokerClient) -> None:
    """Sends, deliveries (one left in flight, one redelivered), and transactions: one
    committed, one rolled back, one committed by its check-back, one parked (its checker
    answers UNKNOWN, and check_max is 1)."""
    for body in (b"a" * 10, b"b" * 20, b"c" * 30):
        client.send(Message("orders", body))
    received = client.receive("shop", "orders", max_messages=3, invisible_duration_s=60)
    assert len(received) == 3
    for item in received[:2]:
        client.ack("shop", item.receipt_handle)
    client.send(Message("redo", b"d" * 4))
    assert client.receive("retry", "redo", invisible_duration_s=0.2)[0].delivery_attempt == 1
    again = client.receive("retry", "redo", wait_s=10)  # after 0.2 s + the first back-off, 1 s
    assert again[0].delivery_attempt == 2
    client.ack("retry", again[0].receipt_handle)

    def answer(resolution: Resolution) -> Callable[[CheckRequest], None]:
        def on_check(request: CheckRequest) -> None:
            checker.end_transaction(request.transaction_id, resolution,
                                    producer_group=request.producer_group, from_check=True)
        return on_check

    checker.register_producer("checked-group", answer(Resolution.COMMIT))
    checker.register_producer("parking-group", answer(Resolution.UNKNOWN))
    client.send_half(Message("payments", b"p" * 100), producer_group="tx-group", transaction_id="tx-commit")
    client.end_transaction("tx-commit", Resolution.COMMIT, producer_group="tx-group")
    client.send_half(Message("payments", b"r" * 7), producer_group="tx-group", transaction_id="tx-rollback")
    client.end_transaction("tx-rollback", Resolution.ROLLBACK, producer_group="tx-group")
    client.send_half(Message("payments", b"k" * 50), producer_group="checked-group", transaction_id="tx-checked")
    client.send_half(Message("payments", b"x" * 5), producer_group="parking-group", transaction_id="tx-parked")
    wait_for(lambda: [p.transaction_id for p in client.list_parked()] == ["tx-parked"], "the parked transaction")
    wait_for(lambda: client.stats().pending_half == 0, "the checked transaction's commit")


def assert_counted(samples: Samples) -> None:
    """What the hooks counted while the server ran."""
    assert value(samples, "halfmoon_broker_messages_in_total", topic="orders") == 3
    assert value(samples, "halfmoon_broker_message_in_bytes_total", topic="orders") == 60
    # committed transactional messages come in when committed; rolled back and parked ones never
    assert value(samples, "halfmoon_broker_messages_in_total", topic="payments") == 2
    assert value(samples, "halfmoon_broker_message_in_bytes_total", topic="payments") == 150
    assert value(samples, "halfmoon_broker_messages_out_total", topic="orders", group="shop") == 3
    assert value(samples, "halfmoon_broker_message_out_bytes_total", topic="orders", group="shop") == 60
    assert value(samples, "halfmoon_broker_redeliveries_total", topic="orders", group="shop") == 0
    assert value(samples, "halfmoon_broker_messages_out_total", topic="redo", group="retry") == 2
    assert value(samples, "halfmoon_broker_message_out_bytes_total", topic="redo", group="retry") == 8
    assert value(samples, "halfmoon_broker_redeliveries_total", topic="redo", group="retry") == 1
    # 4 sends, 4 half messages, 3 ENDs (commit, rollback, the check's commit) and the UNKNOWN answers
    assert value(samples, "halfmoon_broker_send_duration_seconds_count") >= 10
    assert value(samples, "halfmoon_broker_send_duration_seconds_bucket", le="+Inf") == \
        value(samples, "halfmoon_broker_send_duration_seconds_count")
    assert value(samples, "halfmoon_broker_send_duration_seconds_sum") > 0
    assert value(samples, "halfmoon_broker_fsync_duration_seconds_count") >= 1
    assert value(samples, "halfmoon_broker_check_outcomes_total", outcome="commit") == 1
    assert value(samples, "halfmoon_broker_check_outcomes_total", outcome="unknown") >= 1
    assert value(samples, "halfmoon_broker_check_outcomes_total", outcome="rollback") == 0
    answered = sum(value(samples, "halfmoon_broker_check_outcomes_total", outcome=o)
                   for o in ("commit", "rollback", "unknown"))
    assert value(samples, "halfmoon_broker_checks_sent_total") == answered


def assert_state(samples: Samples) -> None:
    """What the collector read from the broker's state at the scrape."""
    assert value(samples, "halfmoon_broker_transactions_ended_total", outcome="commit") == 2
    assert value(samples, "halfmoon_broker_transactions_ended_total", outcome="rollback") == 1
    assert value(samples, "halfmoon_broker_transactions_pending") == 0
    assert value(samples, "halfmoon_broker_transactions_parked") == 1
    assert value(samples, "halfmoon_broker_transaction_oldest_pending_age_seconds") == 0
    assert value(samples, "halfmoon_broker_transaction_check_horizon_seconds") == pytest.approx(0.6)
    assert value(samples, "halfmoon_broker_consumer_lag_messages", group="shop", topic="orders") == 1
    assert value(samples, "halfmoon_broker_consumer_in_flight_messages", group="shop", topic="orders") == 1
    assert value(samples, "halfmoon_broker_consumer_lag_messages", group="retry", topic="redo") == 0
    assert value(samples, "halfmoon_broker_dlq_messages", group="dlq-group") == 1
    assert value(samples, "halfmoon_broker_topic_messages", topic="orders") == 3
    assert value(samples, "halfmoon_broker_topic_messages", topic="poison") == 1  # stored before the start
    assert value(samples, "halfmoon_broker_topic_messages", topic="payments") == 2
    assert value(samples, "halfmoon_broker_commitlog_bytes") > 0
    assert value(samples, "halfmoon_broker_disk_size_bytes") >= value(samples, "halfmoon_broker_disk_free_bytes") > 0


def assert_http_rules(base: str) -> None:
    status, body, headers = get(base + "/metrics", "HEAD")
    assert (status, body) == (200, "") and headers["Content-Type"].startswith("text/plain")
    for path in ("/metrics", "/healthz", "/readyz"):
        status, _, headers = get(base + path, "POST")
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert get(base + "/nothing-here")[0] == 404
    status, page, _ = get(base + "/")  # serve mounts the console at /
    assert status == 200 and "<title>" in page and "Topics" in page


def test_readiness_follows_the_broker_from_recovery_to_close(tmp_path: Path) -> None:
    readiness = Readiness()
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), readiness.reason)
    port.start()
    try:
        assert get(port.url + "/readyz")[:2] == (503, "not ready: the store is being opened and recovered\n")
        assert get(port.url + "/healthz")[0] == 200
        broker = EmbeddedBroker(tmp_path / "broker")
        readiness.broker = broker
        assert get(port.url + "/readyz")[:2] == (503, "not ready: the TCP port is not listening\n")
        readiness.listening = True
        assert get(port.url + "/readyz")[:2] == (200, "ready\n")
        broker.close()
        assert get(port.url + "/readyz")[:2] == (503, "not ready: the broker is closed\n")
    finally:
        port.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(port.url + "/healthz", timeout=5)


def _app(name: str) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """A WSGI app answering with its name and the SCRIPT_NAME/PATH_INFO split it saw."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{name} {environ['SCRIPT_NAME']!r} {environ['PATH_INFO']!r}".encode()]

    return app


def test_mounted_apps_get_their_prefix_and_never_the_built_in_paths(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    with EmbeddedBroker(tmp_path / "broker") as broker:
        register_broker_metrics(registry, broker)
        port = HttpPort("127.0.0.1", 0, registry, lambda: None, mounts={"/": _app("console")})
        port.start()
        try:
            port.mount("/api/", _app("api"))
            assert get(port.url + "/")[1] == "console '' '/'"
            assert get(port.url + "/topics/orders")[1] == "console '' '/topics/orders'"
            assert get(port.url + "/api")[1] == "api '/api' ''"
            assert get(port.url + "/api/x")[1] == "api '/api' '/x'"
            assert get(port.url + "/apix")[1] == "console '' '/apix'"
            status, text, _ = get(port.url + "/metrics")
            assert status == 200 and "halfmoon_broker_transactions_pending 0.0" in text
            assert get(port.url + "/readyz")[1] == "ready\n"
        finally:
            port.stop()
    with pytest.raises(ValueError, match="starts with '/'"):
        port.mount("api", _app("api"))


def _peer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """A WSGI app answering with the client address and scheme it was given."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ['REMOTE_ADDR']} {environ['wsgi.url_scheme']}".encode()]


@pytest.mark.parametrize(("proxy", "seen"), [("127.0.0.1", "203.0.113.9 https"), ("127.0.0.2", "127.0.0.1 http")])
def test_forwarded_headers_are_believed_from_the_trusted_proxy_only(proxy: str, seen: str) -> None:
    port = HttpPort("127.0.0.1", 0, CollectorRegistry(), lambda: None, {"/": _peer}, trusted_proxy=proxy)
    port.start()
    try:
        request = urllib.request.Request(port.url + "/", headers={"X-Forwarded-For": "203.0.113.9",
                                                                 "X-Forwarded-Proto": "https"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.read().decode() == seen
    finally:
        port.stop()


def test_a_port_in_use_stops_serve_with_an_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = subprocess.run(
            [sys.executable, "-m", "broker_embedded", "serve", "--data-dir", str(tmp_path / "broker"),
             "--port", str(free_port()), "--http-port", str(taken.getsockname()[1])],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.startswith("error: OSError: ")
