"""A pytest plugin: the run fails if a test left a process running (issue 22, item 8).

At the start of the session every process the tests start inherits
``HALFMOON_TEST_SESSION=<pytest's pid>``; at its end, the processes still alive that carry
it (orphans re-parented to init included) or descend from pytest are listed. Those still
there after ``GRACE_S`` (a process legitimately shutting down has that long) are printed,
killed, and the run's exit status becomes 1. Helpers that live exactly as long as pytest
(multiprocessing's resource tracker, PySpark's gateway JVM) are pytest's own children and
are not counted. Under pytest-xdist each worker checks its own and the controller reports
what they found. Linux only (``/proc``); elsewhere it does nothing.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MARK = "HALFMOON_TEST_SESSION"
#: Where an xdist worker hands its findings to the controller (``config.workeroutput``).
WORKER_OUTPUT_KEY = "halfmoon_leftover_processes"
GRACE_S = 10.0
PROC = Path("/proc")
#: Children of pytest that end when it does, by a fragment of their command line.
PYTEST_LIFETIME = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "pyspark-shell")


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    command: str


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # ended meanwhile, or another user's
        return None


def _process(pid: int) -> Process | None:
    """A live (not zombie) process from ``/proc``; None when gone."""
    stat = _read(PROC / str(pid) / "stat")
    if stat is None:
        return None
    state, ppid, pgid = stat[stat.rindex(b")") + 2:].split()[:3]
    if state in (b"Z", b"X"):
        return None
    command = (_read(PROC / str(pid) / "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
    return Process(pid, int(ppid), int(pgid), command)


def live_processes() -> list[Process]:
    """Every live process of this machine that ``/proc`` shows."""
    found = (_process(int(entry.name)) for entry in PROC.iterdir() if entry.name.isdigit())
    return [process for process in found if process is not None]


def group_members(pgid: int) -> list[Process]:
    """The live processes of process group ``pgid``."""
    return [process for process in live_processes() if process.pgid == pgid]


def _marked(pid: int, mark: bytes) -> bool:
    environ = _read(PROC / str(pid) / "environ")
    return environ is not None and mark in environ.split(b"\0")


def leftovers(session_pid: int) -> list[Process]:
    """Processes the session started that are still running (see the module docstring)."""
    processes = live_processes()
    children: dict[int, list[Process]] = {}
    for process in processes:
        children.setdefault(process.ppid, []).append(process)
    descendants, stack = [], [session_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            descendants.append(child)
            stack.append(child.pid)
    mark = f"{MARK}={session_pid}".encode()
    found = {p.pid: p for p in descendants}
    found.update((p.pid, p) for p in processes if p.pid != session_pid and _marked(p.pid, mark))
    return [p for p in found.values()
            if not (p.ppid == session_pid and any(part in p.command for part in PYTEST_LIFETIME))]


def pytest_sessionstart(session: pytest.Session) -> None:
    if PROC.is_dir():
        os.environ[MARK] = str(os.getpid())


def _is_xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to pytest-xdist workers (and runs none itself)."""
    return config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput")


def _kill_leftovers() -> list[str]:
    """Wait up to ``GRACE_S`` for this process's leftovers to end, kill the rest, describe them."""
    deadline = time.monotonic() + GRACE_S
    left = leftovers(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers(os.getpid())
    for process in left:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"  pid {p.pid} (parent {p.ppid}, group {p.pgid}): {p.command[:300]}" for p in left]


def _report(session: pytest.Session, found: list[str]) -> None:
    lines = [f"tests left {len(found)} process(es) running (killed now); a test must end every process it starts:",
             *found]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "left-over processes", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: What the workers of an xdist run found, gathered by the controller as each ends.
_from_workers: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: keep what a finished worker found (it runs only with pytest-xdist)."""
    _from_workers.extend(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, []))


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _is_xdist_controller(config):
        if _from_workers:
            _report(session, _from_workers)
        return
    if os.environ.get(MARK) != str(os.getpid()):
        return
    found = _kill_leftovers()
    if not found:
        return
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its exit status is not the run's, so tell the controller
        workeroutput[WORKER_OUTPUT_KEY] = found
    _report(session, found)
