"""Real ``celery worker`` processes for the tests, each logging to its own file.

A worker runs in a process group of its own, and stopping or killing it ends the whole
group: with ``-B`` the worker forks beat, which outlives a worker killed alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.leftover_processes import group_members

#: "Stops promptly": far below the minutes a hung check held the worker before.
STOP_BOUND_S = 30


class CeleryWorker:
    """``celery -A app worker -Q queues --pool threads`` with ``env`` added to the environment;
    with ``beat``, the worker runs the app's beat schedule too (``-B``)."""

    def __init__(self, log: Path, app: str, queues: list[str], env: dict[str, str], *, threads: int = 2,
                 cwd: Path | None = None, beat: bool = False) -> None:
        self.log = log
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        if cwd is not None:  # the app's module is found there
            environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", ",".join(queues),
                 "--pool", "threads", "-c", str(threads), "--loglevel", "INFO",
                 "--without-mingle", "--without-gossip", "--without-heartbeat",
                 *(["-B", "--schedule", str(log.with_suffix(".beat"))] if beat else [])],
                env=environment, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
            )

    def count(self, pattern: str) -> int:
        """Lines of the worker's log matching the regular expression ``pattern``."""
        return len(re.findall(pattern, self.log.read_text(errors="replace")))

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:  # the whole group has ended
            pass

    def stop(self) -> int:
        """SIGTERM to the worker's group; the worker's exit status (fails the test if the
        worker or a process it started, such as beat, outlives ``STOP_BOUND_S``)."""
        self._signal_group(signal.SIGTERM)
        try:
            status = self.proc.wait(STOP_BOUND_S)
            wait_until(lambda: not group_members(self.proc.pid), STOP_BOUND_S, "the worker's children to end")
            return status
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker ignored SIGTERM for {STOP_BOUND_S}s (see {self.log})")
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the worker's group (its beat too), then reap the worker."""
        self._signal_group(signal.SIGKILL)
        self.proc.wait()


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)
