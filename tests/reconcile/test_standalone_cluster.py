"""The job on a standalone Spark cluster, as docs/reconcile.md says to run it (issue 28).

A master and two workers are started from the pip-installed pyspark with ``spark-class``
(pip's pyspark ships no ``sbin/start-master.sh``) on 127.0.0.1. The documented
``spark-submit --master spark://...`` line and ``outbox reconcile --master spark://...``
must both run there (the master's JSON page lists each as a finished application) and
count what a local run (the tests' shared session) counts. Every process started here is stopped, also on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyspark
import pytest

import outbox.reconcile
from outbox.reconcile.job import ReconcileInputs, ReconcileOptions, reconcile
from outbox.reconcile.session import postgres_jdbc_jar
from outbox.reconcile.synthetic import generate, write_export, write_sqlite
from tests.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent
#: The spark-submit entry file, found as the docs find it.
ENTRY = Path(outbox.reconcile.__file__).parent / "__main__.py"
#: Long enough that the synthetic in-flight transaction stays in flight across three runs.
GRACE_MS = 3_600_000


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as page:
        return dict(json.load(page))


def _finished_applications(ui_port: int, count: int) -> list[dict[str, Any]] | None:
    """The applications the master lists as finished, once there are ``count``."""
    finished = [app for app in _master_state(ui_port)["completedapps"] if app["state"] == "FINISHED"]
    return finished if len(finished) >= count else None


def _wait_for(what: str, check: Any, timeout_s: float = 120) -> Any:
    """``check()``'s first true answer (errors count as not yet), polled until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = check()
        except OSError:
            answer = None
        if answer:
            return answer
        time.sleep(0.5)
    raise TimeoutError(f"no {what} after {timeout_s} s")


@contextmanager
def _daemon(command: list[str], env: dict[str, str], log: Path) -> Iterator[None]:
    """A ``spark-class`` daemon (it execs the JVM), terminated (killed if it lingers) on exit."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def _standalone_cluster(env: dict[str, str], folder: Path, workers: int) -> Iterator[tuple[str, int]]:
    """A master and ``workers`` workers (1 core, 1 GB each): the master's URL and UI port."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    with ExitStack() as stack:
        stack.enter_context(_daemon(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui_port)], env, folder / "master.log"))
        url = f"spark://127.0.0.1:{port}"
        _wait_for("master UI", lambda: _master_state(ui_port))
        for index in range(workers):
            stack.enter_context(_daemon(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                 "--work-dir", str(folder / f"work-{index}")], env, folder / f"worker-{index}.log"))
        _wait_for(f"{workers} alive workers", lambda: _master_state(ui_port)["aliveworkers"] == workers)
        yield url, ui_port


def _counts(command: list[str], args: list[str], out: Path, env: dict[str, str]) -> dict[str, int]:
    """Run the job (exit 1: the synthetic anomalies breach the thresholds); its counts."""
    run = subprocess.run([*command, *args, "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-3000:]
    return dict(json.loads((out / "summary.json").read_text())["counts"])


@pytest.mark.slow
@pytest.mark.spark
def test_documented_spark_submit_and_outbox_reconcile_run_on_a_standalone_cluster(spark: Any, tmp_path: Path) -> None:
    checkout = str(Path(__file__).parents[2])
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_DAEMON_MEMORY": "256m", "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")])}
    data = generate(100, 2, int(time.time() * 1000), grace_ms=GRACE_MS)
    producer, consumer = f"sqlite:///{tmp_path / 'p.sqlite3'}", f"sqlite:///{tmp_path / 'c.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export")
    args = ["--producer-db", producer, "--consumer-db", consumer, "--broker-export", str(tmp_path / "export"),
            "--grace-seconds", str(GRACE_MS // 1000)]
    executor = ["--conf", "spark.executor.memory=512m"]
    jars = ["--jars", str(postgres_jdbc_jar())] if postgres_jdbc_jar().exists() else []

    # the local run, on the tests' shared session (a JVM of its own would add half a minute)
    local = reconcile(spark, ReconcileInputs([producer], [consumer], str(tmp_path / "export")),
                      ReconcileOptions(str(tmp_path / "local"), grace_s=GRACE_MS / 1000)).summary["counts"]
    assert {name: local[name] for name in data.expected} == data.expected
    with _standalone_cluster(env, tmp_path, workers=2) as (url, ui_port):
        submitted = _counts([str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--name", "halfmoon-reconcile",
                             *jars, *executor, str(ENTRY)], args, tmp_path / "submitted", env)
        direct = _counts([sys.executable, "-m", "outbox.reconcile", "--master", url, *executor], args,
                         tmp_path / "direct", env)
        finished = _wait_for("two finished applications", lambda: _finished_applications(ui_port, 2), timeout_s=30)
    assert submitted == local
    assert direct == local
    assert sorted(app["name"] for app in finished) == ["halfmoon-reconcile", "halfmoon-reconcile"]
    assert all(app["cores"] == 2 for app in finished), finished  # one executor on each worker
