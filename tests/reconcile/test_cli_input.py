"""``outbox reconcile`` on bad input and without PySpark (issue 22, items 5 and 6).

Each run is a real ``outbox reconcile`` process in which PySpark cannot be imported (a
meta-path blocker, as if the ``spark`` extra were not installed): an input error answered
there was found before Spark could start.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outbox.reconcile.synthetic import generate, write_export, write_sqlite

#: ``outbox`` (argv from the command line) with the spark extra's modules unimportable.
WITHOUT_SPARK = """
import sys

class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pyspark", "py4j", "pyarrow", "pandas"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoSpark())
from outbox.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _outbox(cwd: Path, *args: str, spark: bool = False) -> subprocess.CompletedProcess[str]:
    """``outbox ARGS`` run in ``cwd`` with this checkout on the path; PySpark blocked unless ``spark``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "outbox.cli"] if spark else [sys.executable, "-c", WITHOUT_SPARK]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    """A producer and a consumer SQLite database with the outbox tables, and a broker export."""
    data = generate(5, 0, int(time.time() * 1000))
    producer, consumer = f"sqlite:///{tmp_path / 'producer.sqlite3'}", f"sqlite:///{tmp_path / 'consumer.sqlite3'}"
    write_sqlite(data, producer, consumer)
    write_export(data, tmp_path / "export")
    return {"--producer-db": producer, "--consumer-db": consumer, "--broker-export": str(tmp_path / "export"),
            "--out": str(tmp_path / "out")}


def _args(inputs: dict[str, str], **changes: str) -> list[str]:
    options = {**inputs, **{f"--{key.replace('_', '-')}": value for key, value in changes.items()}}
    return [part for option, value in options.items() for part in (option, value)]


def _one_line_error(run: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("outbox reconcile: error: "), run.stderr[-3000:]
    for text in expected:
        assert text in lines[0], lines[0]


def test_a_producer_database_file_that_does_not_exist_is_one_line_exit_2_and_nothing_is_created(
        tmp_path: Path, inputs: dict[str, str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    run = _outbox(work, "reconcile", *_args(inputs, producer_db="sqlite:///producer.sqlite3"))
    _one_line_error(run, "--producer-db", "no such SQLite file", str(work / "producer.sqlite3"))
    assert list(work.iterdir()) == []
    assert not Path(inputs["--out"]).exists()


@pytest.mark.parametrize(("changes", "expected"), [
    ({"consumer_db": "sqlite:///missing.sqlite3"}, ["--consumer-db", "no such SQLite file"]),
    ({"producer_db": "sqlite://"}, ["in-memory"]),
    ({"producer_db": "not a url"}, ["is not a database URL"]),
    ({"producer_db": "postgresql+psycopg://nobody@127.0.0.1:1/none"}, ["127.0.0.1:1/none: cannot read it: "]),
    ({"consumer_db": "nosuchdialect://host/db"}, ["--consumer-db nosuchdialect://host/db: "]),
    ({"producer_db": "parquet:///no/such/folder"}, ["no such file or directory"]),
    ({"broker_export": "/no/such/export"}, ["is not a directory"]),
    ({"threshold": "nonsense=1"}, ["unknown threshold"]),
    ({"since": "yesterday"}, ["not an ISO time"]),
    ({"conf": "novalue"}, ["--conf takes key=value"]),
    ({"max_carry_days": "-1"}, ["--max-carry-days must not be negative"]),
    ({"state_dir": __file__}, ["--state-dir", "is a file"]),
])
def test_bad_input_is_found_before_spark_starts(tmp_path: Path, inputs: dict[str, str], changes: dict[str, str],
                                                expected: list[str]) -> None:
    _one_line_error(_outbox(tmp_path, "reconcile", *_args(inputs, **changes)), *expected)


def test_a_database_without_the_outbox_table_is_named(tmp_path: Path, inputs: dict[str, str]) -> None:
    with sqlite3.connect(tmp_path / "app.sqlite3") as conn:  # the app's database, not migrated
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.close()
    run = _outbox(tmp_path, "reconcile", *_args(inputs, producer_db=f"sqlite:///{tmp_path / 'app.sqlite3'}"))
    _one_line_error(run, "app.sqlite3 has no outbox_transaction_log table")


@pytest.mark.postgres
def test_a_postgresql_database_without_the_outbox_table_is_named(tmp_path: Path, inputs: dict[str, str],
                                                                  postgres_url: str) -> None:
    run = _outbox(tmp_path, "reconcile", *_args(inputs, producer_db=postgres_url))
    _one_line_error(run, "has no outbox_transaction_log table")


def test_an_out_path_that_is_a_file_is_refused(tmp_path: Path, inputs: dict[str, str]) -> None:
    (tmp_path / "taken").write_text("")
    _one_line_error(_outbox(tmp_path, "reconcile", *_args(inputs, out=str(tmp_path / "taken"))), "is a file")


def test_without_the_spark_extra_help_works_and_a_run_is_one_line_naming_the_extra(
        tmp_path: Path, inputs: dict[str, str]) -> None:
    help_run = _outbox(tmp_path, "reconcile", "--help")
    assert help_run.returncode == 0 and "--producer-db" in help_run.stdout, help_run.stderr[-3000:]
    run = _outbox(tmp_path, "reconcile", *_args(inputs))
    _one_line_error(run, "pip install 'halfmoon[spark]'")
    assert not Path(inputs["--out"]).exists()
