"""The installed console scripts, run as real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(sys.executable).parent


def run(script: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """``script args`` from the virtualenv's bin directory, output captured."""
    return subprocess.run([str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def one_line(stderr: str) -> str:
    """The single line a failed command writes on stderr (fails when there is more)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]
