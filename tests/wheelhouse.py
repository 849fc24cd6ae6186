"""The project's wheel, built once per test run, for tests that install it as a user does."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a clean copy of the checkout leaves out (local state, builds, venvs).
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                     ".*_cache", "work", "demo-work", "reports", "spark-warehouse")


@functools.cache
def built_wheel() -> Path:
    """halfmoon's wheel, built from a clean copy of the checkout (no stale build/ leaks in),
    with no build warning (e.g. setuptools deprecations)."""
    folder = Path(tempfile.mkdtemp(prefix="halfmoon-wheel-"))
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(folder / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "Warning" not in built.stderr, built.stderr
    (path,) = (folder / "dist").glob("halfmoon-*.whl")
    return path
