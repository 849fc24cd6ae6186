"""The same job on a local standalone Spark cluster (master + worker from ``spark-class``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from outbox.reconcile.synthetic import generate, write_export, write_sqlite

SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing on port {port}")


@pytest.mark.slow
@pytest.mark.spark
def test_job_runs_unchanged_on_a_standalone_master_and_worker(tmp_path: Path) -> None:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    master_port, worker_port = _free_port(), _free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    logs = (tmp_path / "cluster.log").open("wb")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(master_port), "--webui-port", str(_free_port())],
                              env=env, stdout=logs, stderr=subprocess.STDOUT)
    worker = None
    try:
        _wait_port(master_port)
        url = f"spark://127.0.0.1:{master_port}"
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                   "--port", str(worker_port), "--webui-port", str(_free_port()),
                                   "--cores", "1", "--memory", "1g"],
                                  env=env, stdout=logs, stderr=subprocess.STDOUT)
        _wait_port(worker_port)
        data = generate(100, 2, int(time.time() * 1000))
        producer, consumer = f"sqlite:///{tmp_path / 'p.sqlite3'}", f"sqlite:///{tmp_path / 'c.sqlite3'}"
        write_sqlite(data, producer, consumer)
        write_export(data, tmp_path / "export")
        run = subprocess.run(
            [sys.executable, "-m", "outbox.reconcile", "--producer-db", producer, "--consumer-db", consumer,
             "--broker-export", str(tmp_path / "export"), "--out", str(tmp_path / "out"), "--master", url,
             "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=1g"],
            env=env, capture_output=True, text=True, timeout=600,
        )
        assert run.returncode == 1, run.stderr[-3000:]  # the injected anomalies breach the thresholds
        counts = json.loads((tmp_path / "out" / "summary.json").read_text())["counts"]
        for name, expected in data.expected.items():
            assert counts[name] == expected, name
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        logs.close()
