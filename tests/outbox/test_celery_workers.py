"""The tests' Celery worker ends every process it starts (issue 22, item 8): killed or
stopped, its beat goes with it, and the run's own check finds a process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inner_pytest import run_pytest
from tests.leftover_processes import leftovers, live_processes

from .celery_workers import CeleryWorker, wait_until

#: A Celery app on a folder queue (no server), with a beat entry so that beat has work.
APP = """
from celery import Celery

app = Celery("beatapp", broker="filesystem://")
app.conf.broker_transport = "outbox.integrations.celery.transport:Transport"  # whole messages only
app.conf.broker_transport_options = {"data_folder_in": "queue", "data_folder_out": "queue"}
app.conf.beat_schedule = {"tick": {"task": "beatapp.tick", "schedule": 1.0}}

@app.task(name="beatapp.tick")
def tick():
    print("tick")
"""


def _mine(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder`` (the worker and its beat)."""
    return [process.pid for process in live_processes() if str(folder) in process.command]


@pytest.fixture
def beat_worker(tmp_path: Path) -> Iterator[CeleryWorker]:
    (tmp_path / "beatapp.py").write_text(APP)
    (tmp_path / "queue").mkdir()
    worker = CeleryWorker(tmp_path / "worker.log", "beatapp", ["celery"], {}, cwd=tmp_path, beat=True)
    try:
        wait_until(lambda: worker.count(r"beatapp\.tick.*succeeded") > 0, 60, f"a beat tick (see {worker.log})")
        assert len(_mine(tmp_path)) >= 2, "the worker forked no beat"
        yield worker
    finally:
        for pid in _mine(tmp_path):  # what a failed test left: not for the next tests to meet
            os.kill(pid, signal.SIGKILL)
        worker.proc.wait()


@pytest.mark.slow
def test_killing_a_worker_ends_its_beat(beat_worker: CeleryWorker, tmp_path: Path) -> None:
    beat_worker.kill()
    wait_until(lambda: not _mine(tmp_path), 10, "the worker's beat to end")


@pytest.mark.slow
def test_stopping_a_worker_ends_its_beat(beat_worker: CeleryWorker, tmp_path: Path) -> None:
    assert beat_worker.stop() == 0
    assert _mine(tmp_path) == []


def test_an_orphaned_process_is_a_leftover_until_it_ends(tmp_path: Path) -> None:
    # A child that starts a grandchild and exits: the grandchild is re-parented away from pytest.
    ready = tmp_path / "started"
    spawn = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import pathlib, time; pathlib.Path({str(ready)!r}).touch(); "
                          "time.sleep(120)"])
    """)
    subprocess.run([sys.executable, "-c", spawn], check=True, timeout=60)
    wait_until(ready.exists, 30, "the grandchild to start")
    [orphan] = [p for p in leftovers(os.getpid()) if str(ready) in p.command]
    assert orphan.ppid != os.getpid()
    os.kill(orphan.pid, signal.SIGKILL)
    wait_until(lambda: all(p.pid != orphan.pid for p in leftovers(os.getpid())), 10, "the orphan to end")


@pytest.mark.slow
def test_a_run_that_leaves_a_process_fails(tmp_path: Path) -> None:
    (tmp_path / "test_leaks.py").write_text(textwrap.dedent("""
        import subprocess, sys

        def test_forgets_its_process():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    """))
    run = run_pytest(tmp_path, "-p", "tests.leftover_processes")
    assert run.returncode == 1 and "1 passed" in run.stdout, run.stdout[-3000:]
    assert "tests left 1 process(es) running" in run.stdout and "time.sleep(120)" in run.stdout
