"""``demo --keep`` (issue 22, item 11): after its checks the demo keeps the services up,
prints the broker's console address, serves it, and stops everything on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from example_shop.processes import port_answers


@pytest.mark.slow
def test_keep_serves_the_console_until_sigterm(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "example_shop", "demo", "--orders", "20", "--scenario", "insufficient-balance",
         "--no-report", "--keep", "--work-dir", str(tmp_path / "shop")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert demo.stdout is not None
    try:
        seen = []
        for line in demo.stdout:  # the test's timeout bounds this wait
            seen.append(line)
            if "Ctrl-C or SIGTERM stops every service" in line:
                break
        out = "".join(seen)
        assert "RESULT: OK" in out, out[-3000:]
        console = re.search(r"kept running \(--keep\): console (http://127\.0\.0\.1:(\d+)/) ", out)
        broker = re.search(r"broker tcp://127\.0\.0\.1:(\d+) ", out)
        assert console and broker, out[-3000:]
        page = httpx.get(console[1], timeout=10)
        assert page.status_code == 200 and "order.paid" in page.text
        demo.send_signal(signal.SIGTERM)
        rest = demo.stdout.read()
        assert demo.wait(60) == 0, rest[-3000:]
        assert "stopping the services" in rest
        assert not port_answers(int(console[2])) and not port_answers(int(broker[1]))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        demo.stdout.close()
