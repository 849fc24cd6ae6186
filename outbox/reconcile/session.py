"""A SparkSession with defaults sized for a small machine; ``--master`` and ``--conf`` pass through.

The PostgreSQL JDBC driver is the jar named by ``HALFMOON_POSTGRES_JDBC_JAR`` (default
Debian's ``/usr/share/java/postgresql.jar``), added to ``spark.jars`` when it exists.

The driver's JVM logs errors only (``log4j2.properties`` beside this module, given to the
JVM as it starts through ``spark.driver.extraJavaOptions``; a configuration file of yours
given there wins), so Spark's start-up warnings do not bury the job's progress lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

#: The setting naming the PostgreSQL JDBC jar, and its default (``libpostgresql-jdbc-java``).
JDBC_JAR_SETTING = "HALFMOON_POSTGRES_JDBC_JAR"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
POSTGRES_DRIVER_CLASS = "org.postgresql.Driver"
#: How to give Spark the driver, for messages that say it is missing.
HOW_TO_ADD_JDBC_DRIVER = (
    f"install it (apt-get install libpostgresql-jdbc-java puts it in {DEFAULT_JDBC_JAR}), "
    f"or set {JDBC_JAR_SETTING}=/path/to/postgresql.jar, or pass --conf spark.jars=/path/to/postgresql.jar "
    "(spark-submit: --jars)"
)

SMALL_MACHINE_CONF = {
    # the one shuffle of the job (on the transaction id); adaptive execution merges the
    # partitions of small inputs, so a few thousand rows do not pay for 32 tasks
    "spark.sql.shuffle.partitions": "32",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}
#: The driver JVM's logging configuration: errors only, on stderr.
QUIET_JVM_LOGGING = Path(__file__).with_name("log4j2.properties")


def postgres_jdbc_jar() -> Path:
    """Where the PostgreSQL JDBC jar is expected (``HALFMOON_POSTGRES_JDBC_JAR`` or Debian's)."""
    return Path(os.environ.get(JDBC_JAR_SETTING) or DEFAULT_JDBC_JAR)


def has_postgres_driver(spark: SparkSession) -> bool:
    """Whether the session's JVM can load the PostgreSQL JDBC driver (however it was added)."""
    return bool(spark._jvm.org.apache.spark.util.Utils.classIsLoadable(POSTGRES_DRIVER_CLASS))  # type: ignore[union-attr]


def python_workers_here(spark: SparkSession) -> None:
    """In local mode, run Python workers on this interpreter (it has halfmoon and its
    dependencies) unless ``PYSPARK_PYTHON`` names one: Spark's default is whatever
    ``python3`` is on the PATH. Clusters keep their own setting."""
    if (spark.sparkContext.master or "").startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        spark.sparkContext.pythonExec = sys.executable


def build_session(master: str = "local[*]", conf: Mapping[str, str] | None = None,
                  app_name: str = "halfmoon-reconcile") -> SparkSession:
    """Get or create the session; adds the PostgreSQL JDBC jar when it is installed."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**SMALL_MACHINE_CONF, **(conf or {})}
    jar = postgres_jdbc_jar()
    if jar.exists() and "spark.jars" not in settings:
        settings["spark.jars"] = str(jar)
    if QUIET_JVM_LOGGING.exists():
        java_options = settings.get("spark.driver.extraJavaOptions", "")  # later -D options win
        settings["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={QUIET_JVM_LOGGING.as_uri()} {java_options}".strip())
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
