"""A pytest of its own on a folder of test files: how the suite tests its own plugins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.leftover_processes import MARK

ROOT = Path(__file__).parents[1]


def run_pytest(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """pytest on the test files in ``folder`` with ``options`` (the plugins to load), in a
    process of its own, with this checkout importable and outside this run's session (the
    processes it starts are its own session's to end)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(MARK, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options,
                           "--rootdir", str(folder), str(folder)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=folder)
