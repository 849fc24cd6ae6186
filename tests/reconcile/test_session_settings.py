"""Whose Spark settings win (issue 28, "on a cluster, as documented").

Settings given by ``spark-submit`` (``--master``, ``--conf``) or by the installation's
``spark-defaults.conf`` win over the job's small-machine defaults; ``outbox reconcile
--master/--conf`` win over both. Each case is a real process that builds the session the
way ``outbox reconcile`` does (the CLI's parsed defaults) and prints what Spark got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent

#: Builds the session from the CLI's own parsed options (``--conf`` from argv) and prints
#: the master and the settings the issue's probe printed.
PROBE = """
import json, sys
from outbox.reconcile.cli import build_parser
from outbox.reconcile.session import build_session
args = build_parser().parse_args(["--broker-export", "unused", "--out", "unused", *sys.argv[1:]])
spark = build_session(args.master, dict(item.split("=", 1) for item in args.conf))
conf = spark.sparkContext.getConf()
print(json.dumps({"master": spark.sparkContext.master,
                  "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                  "driver_memory": conf.get("spark.driver.memory"),
                  "max_result_size": conf.get("spark.driver.maxResultSize")}))
spark.stop()
"""


def _run(command: list[str], tmp_path: Path, **env: str) -> dict[str, str]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    checkout = str(Path(__file__).parents[2])
    run = subprocess.run(
        [part if part != "PROBE" else str(probe) for part in command],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")]),
             "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


@pytest.mark.spark
def test_spark_submit_master_and_conf_win_over_the_jobs_defaults(tmp_path: Path) -> None:
    seen = _run([str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[1]",
                 "--conf", "spark.sql.shuffle.partitions=7", "PROBE"], tmp_path, SPARK_HOME=str(SPARK_HOME))
    assert seen["master"] == "local[1]"
    assert seen["shuffle_partitions"] == "7"


@pytest.mark.spark
def test_spark_defaults_conf_wins_over_the_jobs_defaults_and_the_command_line_over_both(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "# the installation's settings\n"
        "spark.master                   local[1]\n"
        "spark.driver.memory            1g\n"
        "spark.sql.shuffle.partitions   5\n"
        "spark.driver.maxResultSize     300m\n")
    seen = _run([sys.executable, "PROBE", "--conf", "spark.sql.shuffle.partitions=9"], tmp_path,
                SPARK_CONF_DIR=str(conf_dir))
    assert seen == {"master": "local[1]", "shuffle_partitions": "9", "driver_memory": "1g",
                    "max_result_size": "300m"}
