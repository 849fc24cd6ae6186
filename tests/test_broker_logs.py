"""The broker-log plugin (tests/broker_logs.py), run as pytest runs it: in a pytest of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.inner_pytest import run_pytest


def test_a_failed_test_shows_the_end_of_its_brokers_log_and_a_passed_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "test_with_brokers.py").write_text(textwrap.dedent("""
        from tests.server.conftest import ServerProcess

        def test_fails_with_a_broker(tmp_path):
            broker = ServerProcess(tmp_path / "failing").start()
            try:
                assert broker.port < 0, "what the broker said is in its log"
            finally:
                broker.stop()

        def test_passes_with_a_broker(tmp_path):
            broker = ServerProcess(tmp_path / "passing").start()
            assert broker.stop() == 0
    """))
    run = run_pytest(tmp_path, "-p", "tests.broker_logs", "-p", "no:randomly")
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    sections = [line for line in run.stdout.splitlines() if " broker log " in line]
    assert len(sections) == 1 and "test_fails_with_a_broker0" in sections[0], run.stdout[-3000:]
    assert "broker server listening on 127.0.0.1:" in run.stdout.split(sections[0], 1)[1]
    assert "test_passes_with_a_broker0" not in run.stdout
