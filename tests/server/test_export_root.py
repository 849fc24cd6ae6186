"""EXPORT_MESSAGES writes only under the server's export root (issue 10, finding 9).

Before, a client could name any directory on the server's machine and have it created.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, BrokerConfig, Message
from broker_embedded.errors import ExportPathError


def _exported(folder: Path) -> int:
    """Messages in a JSON-lines export (0 if there is none)."""
    messages = folder / "messages.jsonl"
    return len(messages.read_text().splitlines()) if messages.exists() else 0


def test_exports_land_under_the_default_root_and_nowhere_else(thread_server, tmp_path: Path) -> None:
    server = thread_server()
    root = server.broker.data_dir / "exports"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").mkdir(parents=True)
    (root / "escape" / "link").symlink_to(outside)
    with BrokerClient(server.url) as client:
        client.send(Message("orders", b"x"))
        assert client.export("nightly", "jsonl")["messages"] == 1
        assert client.export(str(root / "by-absolute-path"), "jsonl")["messages"] == 1
        for refused in (str(tmp_path / "elsewhere" / "deep"), "../../elsewhere", "escape/link", "escape/link/deep",
                        "/"):
            with pytest.raises(ExportPathError, match="outside the export root"):
                client.export(refused, "jsonl")
        assert client.stats().topics, "a refused export leaves the connection usable"
    assert _exported(root / "nightly") == 1 and _exported(root / "by-absolute-path") == 1
    assert not (tmp_path / "elsewhere").exists()
    assert list(outside.iterdir()) == []


def test_a_configured_root_replaces_the_default(thread_server, tmp_path: Path) -> None:
    root = tmp_path / "reconcile-inputs"
    server = thread_server(BrokerConfig(export_root=root))
    with BrokerClient(server.url) as client:
        client.send(Message("orders", b"x"))
        client.export("2026-11-22", "jsonl")
        client.export(str(root), "jsonl")  # the root itself, as the example shop does
        with pytest.raises(ExportPathError):
            client.export(str(server.broker.data_dir / "exports"), "jsonl")
    assert _exported(root / "2026-11-22") == 1 and _exported(root) == 1


def test_the_export_root_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="export_root"):
        BrokerConfig(export_root=Path("exports"))


def test_serve_and_the_cli_export_under_export_root(server_factory, tmp_path: Path) -> None:
    root = tmp_path / "exports"
    server = server_factory("--export-root", str(root))

    def export(out: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "broker_embedded", "export", "--out", out, "--format", "jsonl",
                               "--url", server.url], capture_output=True, text=True, timeout=60)

    with BrokerClient(server.url) as client:
        client.send(Message("orders", b"x"))
    assert json.loads(export("nightly").stdout)["messages"] == 1, "relative to the server's root"
    refused = export(str(tmp_path / "elsewhere"))
    assert refused.returncode == 2 and "ExportPathError" in refused.stderr
    assert _exported(root / "nightly") == 1 and not (tmp_path / "elsewhere").exists()
