"""Who may read a served broker's HTTP port (issue 21, finding 6). With keys, every console
page and ``/metrics`` need a sign-in (``/metrics`` also takes its own bearer token, for
Prometheus) and only ``/healthz`` and ``/readyz`` answer anyone; the HTTP port stays on
loopback when ``--host`` is public; without keys it refuses a non-loopback address unless
told ``--http-insecure``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from broker_embedded import EmbeddedBroker, Message
from tests.console.conftest import sign_in
from tests.ports import free_port

from .conftest import ServerProcess
from .test_http_port import wait_for

ACCESS_KEY, SECRET_KEY = "http-access", "http-secret-0123456789"
TOKEN = "metrics-token-0123456789abcdef"
SECRETS = ("secret-body-42", "secret-key-7", "card-4111", "tx-secret-1", "secret-group")


def stored_secrets(data_dir: Path) -> str:
    """A message and an open transaction whose contents must not leak; the message's id."""
    with EmbeddedBroker(data_dir) as broker:
        sent = broker.send(Message("orders", b"secret-body-42", keys=("secret-key-7",),
                                   properties={"card": "card-4111"}))
        broker.send_half(Message("orders", b"half", transaction_timeout_s=3600),
                         producer_group="secret-group", transaction_id="tx-secret-1")
        return sent.message_id


def test_with_keys_nothing_but_health_answers_before_a_sign_in(tmp_path: Path) -> None:
    message_id = stored_secrets(tmp_path / "broker")
    http_port = free_port()
    server = ServerProcess(tmp_path / "broker", "--host", "0.0.0.0", "--http-port", str(http_port),
                           "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY,
                           "--metrics-token", TOKEN).start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_for(lambda: httpx.get(base + "/readyz").status_code == 200, "readiness")
        assert f"HTTP port on {base} " in server.log.read_text(), "the HTTP port followed the public --host"
        pages = ["/", "/groups", "/transactions", "/dead-letters", "/dead-letters?group=g", f"/search?id={message_id}",
                 "/search?topic=orders&key=secret-key-7", "/transactions/force?id=tx-secret-1&resolution=commit",
                 "/no-such-page"]
        with httpx.Client(base_url=base) as stranger:
            for path in pages:
                answer = stranger.get(path)
                assert answer.status_code == 303 and answer.headers["location"] == "/sign-in", path
                assert not any(secret in answer.text for secret in SECRETS), path
            assert stranger.get("/healthz").status_code == 200
            assert stranger.get("/readyz").status_code == 200
            refused = stranger.get("/metrics")
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
            assert "halfmoon_broker" not in refused.text
            assert stranger.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
            assert stranger.get("/metrics", headers={"authorization": TOKEN}).status_code == 401
            scraped = stranger.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
            assert scraped.status_code == 200 and "halfmoon_broker_topic_messages" in scraped.text
        with httpx.Client(base_url=base) as operator:
            sign_in(operator, ACCESS_KEY, SECRET_KEY)
            assert "secret-body-42" in operator.get("/search", params={"id": message_id}).text
            assert "tx-secret-1" in operator.get("/transactions").text
            assert operator.get("/metrics").status_code == 200
    finally:
        assert server.stop() == 0


def serve_briefly(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker_embedded", "serve", "--data-dir", str(tmp_path / "b"),
                           "--port", str(free_port()), "--http-port", str(free_port()), *options],
                          capture_output=True, text=True, timeout=30)


def test_without_keys_a_public_http_address_needs_the_explicit_opt_in(tmp_path: Path) -> None:
    refused = serve_briefly(tmp_path, "--http-host", "0.0.0.0")
    assert refused.returncode == 2
    assert "--http-insecure" in refused.stderr and "without keys" in refused.stderr
    http_port = free_port()
    server = ServerProcess(tmp_path / "broker", "--http-host", "0.0.0.0", "--http-port", str(http_port),
                           "--http-insecure").start()
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{http_port}/").status_code == 200, "the open console")
        assert "WARNING" in server.log.read_text() and "anyone who reaches it" in server.log.read_text()
    finally:
        assert server.stop() == 0
