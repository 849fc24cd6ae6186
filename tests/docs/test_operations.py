"""The alert rules and the Grafana dashboard in docs/ use only metrics the broker exports,
and docs/operations.md documents every one it exports (compared with a real scrape)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.http.metrics import register_broker_metrics
from broker_embedded.http.port import HttpPort

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC = re.compile(r"\bhalfmoon_broker_\w+")
#: The sample names each metric type adds to its family's name.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every metric family a served broker's /metrics lists, and its type."""
    registry = CollectorRegistry()
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as broker:
        register_broker_metrics(registry, broker, lambda: 0)
        broker.send(Message("orders", b"x"))
        port = HttpPort("127.0.0.1", 0, registry, lambda: None)
        port.start()
        try:
            with urllib.request.urlopen(port.url + "/metrics", timeout=10) as response:
                text = response.read().decode()
        finally:
            port.stop()
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def sample_names(families: dict[str, str]) -> set[str]:
    """The names of the samples of ``families``: what a query can name."""
    return {name + suffix for name, kind in families.items() for suffix in SUFFIXES[kind]}


def documented_name(name: str, kind: str) -> str:
    """How operations.md names a family: a counter with ``_total``, others as they are."""
    return name + "_total" if kind == "counter" else name


def alert_expressions() -> list[str]:
    """The ``expr`` of every rule in prometheus-alerts.yml (each is on one line there)."""
    text = (DOCS / "prometheus-alerts.yml").read_text()
    assert text.startswith("#") and "\ngroups:\n" in text
    alerts = re.findall(r"^\s+- alert: (\w+)$", text, re.M)
    expressions = re.findall(r"^\s+expr: (.+)$", text, re.M)
    assert len(alerts) == len(expressions) >= 6 and len(set(alerts)) == len(alerts)
    return expressions


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    expressions += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    assert len(expressions) > 10
    return expressions


def test_alert_rules_and_the_dashboard_use_only_exported_metrics(families: dict[str, str]) -> None:
    exported = sample_names(families)
    assert len(families) >= 25
    for name, expressions in (("alert rules", alert_expressions()), ("dashboard", dashboard_expressions())):
        used = {metric for expr in expressions for metric in METRIC.findall(expr)}
        assert used, name
        assert used <= exported, f"the {name} use metrics the broker does not export: {used - exported}"


def test_the_alerts_cover_what_operations_md_promises() -> None:
    expressions = " ".join(alert_expressions())
    for metric in ("transactions_parked", "transaction_oldest_pending_age_seconds", "check_unanswered_seconds",
                   "consumer_lag_messages", "dlq_messages", "disk_free_bytes"):
        assert f"halfmoon_broker_{metric}" in expressions, metric


def test_operations_md_documents_every_exported_metric(families: dict[str, str]) -> None:
    documented = set(METRIC.findall((DOCS / "operations.md").read_text()))
    expected = {documented_name(name, kind) for name, kind in families.items()}
    assert expected <= documented, f"undocumented: {expected - documented}"
    assert documented <= expected | sample_names(families), f"not exported: {documented - expected}"


def test_the_outbox_alerts_use_only_metrics_the_outbox_exports() -> None:
    from prometheus_client import generate_latest

    from outbox import instrumentation
    from outbox.metrics import OutboxMetrics

    registry = CollectorRegistry()
    metrics = OutboxMetrics(registry)
    metrics.listen()
    try:
        instrumentation.announce(instrumentation.STORED_BACKLOG, producer_group="shop", unrelayed=1, oldest_age_s=2.0)
        text = generate_latest(registry).decode()
    finally:
        metrics.remove()
    exported = sample_names({family.name: family.type for family in text_string_to_metric_families(text)})
    used = {metric for expr in alert_expressions() for metric in re.findall(r"\bhalfmoon_outbox_\w+", expr)}
    assert used and used <= exported, used - exported
    assert "halfmoon_outbox_stored_oldest_age_seconds 2.0" in text.replace('{producer_group="shop"}', "")
