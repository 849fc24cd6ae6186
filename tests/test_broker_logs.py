"""The broker-log plugin (tests/broker_logs.py), run as pytest runs it: in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[1]


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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("HALFMOON_TEST_SESSION", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.broker_logs", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    sections = [line for line in run.stdout.splitlines() if " broker log " in line]
    assert len(sections) == 1 and "test_fails_with_a_broker0" in sections[0], run.stdout[-3000:]
    assert "broker server listening on 127.0.0.1:" in run.stdout.split(sections[0], 1)[1]
    assert "test_passes_with_a_broker0" not in run.stdout
