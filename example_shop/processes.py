"""Supervision of the demo's real processes: start, wait until ready, kill, restart, clean up."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("example_shop.processes")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_answers(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    """Poll ``condition`` until it holds; ``TimeoutError`` naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@dataclass
class ManagedProcess:
    """One child process of the demo, restartable with the same command and environment."""

    name: str
    argv: Sequence[str]
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    ready: Callable[[], bool] | None = None
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start the process (appending to its log) and wait until it is ready."""
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                list(self.argv), stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )
        log.info("started %s (pid %d)", self.name, self.popen.pid)
        ready = self.ready
        if ready is not None:
            wait_until(lambda: self._alive_or_raise() and ready(), ready_timeout_s,
                       f"{self.name} to be ready (log: {self.log_path})")

    def _alive_or_raise(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.popen.returncode}; see {self.log_path}"
            )
        return True

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group: the crash the demo injects."""
        if self.alive:
            assert self.popen is not None
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            log.info("killed %s with SIGKILL", self.name)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if not self.alive:
            return
        assert self.popen is not None
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> None:
        """Kill if alive, then start again."""
        self.kill()
        self.restarts += 1
        self.start()

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait for the process to exit on its own; its exit code, or None if still running."""
        assert self.popen is not None
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


class Supervisor:
    """Owns every demo process and stops them all on exit, error or Ctrl-C."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: dict[str, ManagedProcess] = {}

    def add(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
            ready: Callable[[], bool] | None = None) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.log_dir, env or {}, ready)
        self.processes[name] = proc
        return proc

    def __getitem__(self, name: str) -> ManagedProcess:
        return self.processes[name]

    def stop_all(self) -> None:
        for proc in reversed(list(self.processes.values())):
            proc.stop()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def python_module(module: str, *args: str) -> list[str]:
    """argv running ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
