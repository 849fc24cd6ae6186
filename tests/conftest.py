"""Shared fixtures: service-backed resources that skip locally but are required in CI.

Set ``HALFMOON_REQUIRE_SERVICES=1`` (``.ci/run`` does) to turn a missing PostgreSQL,
Redis or Java into a test failure instead of a skip.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The run fails if a test leaves a process running (tests/leftover_processes.py); a failed
#: test's report shows the end of its brokers' logs (tests/broker_logs.py).
pytest_plugins = ("tests.leftover_processes", "tests.broker_logs")

POSTGRES_ADMIN_URL = os.environ.get(
    "HALFMOON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("HALFMOON_TEST_REDIS", "redis://127.0.0.1:6379/0")


def services_required() -> bool:
    """True in CI, where a missing service is a failure, not a skip."""
    return os.environ.get("HALFMOON_REQUIRE_SERVICES") == "1"


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if services_required():
        pytest.fail(f"required service unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def xdist_worker_index() -> int:
    """This process's pytest-xdist worker number (``gw1`` -> 1); 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def redis_database(first: int) -> int:
    """A Redis database number of this worker's own: ``first`` for worker 0, then one up per worker.

    The suite's databases start at 8 (``redis_url``) and 12 (the Celery tests'), so up to four
    workers keep apart within Redis's 16 (0-15); more would share, which this refuses.
    """
    index = xdist_worker_index()
    if index > 3:
        raise RuntimeError("the Redis-backed fixtures keep at most 4 xdist workers apart (-n 4)")
    return first + index


#: The tests' JVMs (the shared SparkSession, the jobs they start, a standalone cluster's
#: daemons) live for seconds: with C1 alone and the serial collector they spend about half
#: the CPU the server defaults spend on JIT and GC threads (measured on the demo's
#: reconciliation: 38-47 s of CPU, 24-25 s with these), and the suite is CPU-bound.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    """Let the tests' pip installs into fresh venvs skip byte-compiling every installed
    module (``PIP_COMPILE=false``: 4-10 s of CPU per install here; Python compiles what a
    test imports as it imports it).

    Give every JVM the tests start ``SHORT_LIVED_JVM``: as an installation's
    ``spark-defaults.conf`` (which spark-submit and the reconcile job read like any other)
    and ``SPARK_DAEMON_JAVA_OPTS``; a ``SPARK_CONF_DIR`` set already is left as it is.

    Both are set before pytest-xdist starts its workers, so they inherit them."""
    os.environ.setdefault("PIP_COMPILE", "false")
    if "SPARK_CONF_DIR" in os.environ:
        return
    conf_dir = Path(tempfile.mkdtemp(prefix="halfmoon-tests-spark-conf-"))
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.driver.extraJavaOptions    {SHORT_LIVED_JVM}\n"
        f"spark.executor.extraJavaOptions  {SHORT_LIVED_JVM}\n")
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SHORT_LIVED_JVM)
    atexit.register(shutil.rmtree, conf_dir, True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), run the tests of the shared SparkSession on
    one worker: one JVM (those that start Spark in a process of their own go anywhere).
    First among the hooks: xdist's own reads the group marks into the test ids, so a mark
    added after it groups nothing (each worker started a SparkSession of its own)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


def _with_database(url: str, database: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + database


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (SQLAlchemy URL, psycopg 3)."""
    if not _port_answers("127.0.0.1", 5432):
        unavailable("PostgreSQL is not answering on 127.0.0.1:5432")
    import psycopg

    name = f"hm_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(POSTGRES_ADMIN_URL, name).replace(
            "postgresql://", "postgresql+psycopg://", 1
        )
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis URL on a database number this test empties before and after use."""
    if not _port_answers("127.0.0.1", 6379):
        unavailable("Redis is not answering on 127.0.0.1:6379")
    import redis

    url = REDIS_URL.rsplit("/", 1)[0] + f"/{redis_database(8)}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLAlchemy URL of a fresh SQLite file."""
    return f"sqlite:///{tmp_path / 'test.sqlite3'}"


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession shared by the whole run (Spark takes seconds to start)."""
    if shutil.which("java") is None:
        unavailable("Java is not installed; Spark needs Java 17")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from outbox.reconcile.session import postgres_jdbc_jar

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("halfmoon-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if postgres_jdbc_jar().exists():  # HALFMOON_POSTGRES_JDBC_JAR=/missing tests without it
        builder = builder.config("spark.jars", str(postgres_jdbc_jar()))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (the system's, driven by Playwright), one per test module."""
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("the system's chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()
