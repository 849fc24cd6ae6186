"""The job's SparkSession: settings given to Spark win, small-machine defaults fill the rest.

Whose setting wins, first to last: ``build_session``'s ``master`` and ``conf`` (``outbox
reconcile --master/--conf``); settings made before the job starts (``spark-submit``'s
``--master``, ``--conf``, ``--name``, ``--jars``, or the installation's
``spark-defaults.conf`` in ``SPARK_CONF_DIR`` or ``SPARK_HOME/conf``); the job's defaults
(``SMALL_MACHINE_CONF``: ``local[*]``, 32 shuffle partitions, ...).

The PostgreSQL JDBC driver is the jar named by ``HALFMOON_POSTGRES_JDBC_JAR`` (default
Debian's ``/usr/share/java/postgresql.jar``), added to ``spark.jars`` when it exists and no
jars were given.

When the job starts the driver's JVM itself, that JVM logs errors only (``log4j2.properties``
beside this module, given through ``spark.driver.extraJavaOptions``; a configuration file of
yours given there wins), so Spark's start-up warnings do not bury the job's progress lines.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.find_spark_home import _find_spark_home
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

#: The job's defaults, for settings nobody gave (see the module).
SMALL_MACHINE_CONF = {
    "spark.master": "local[*]",
    "spark.app.name": "halfmoon-reconcile",
    # the one shuffle of the job (on the transaction id); adaptive execution merges the
    # partitions of small inputs, so a few thousand rows do not pay for 32 tasks
    "spark.sql.shuffle.partitions": "32",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}
#: Defaults that only count when the job starts the driver's JVM (under spark-submit it runs).
DRIVER_LAUNCH_CONF = {"spark.driver.memory": "2g"}
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


#: One line of a Java properties file: the key, then whitespace, ``=`` or ``:``, then the value.
_PROPERTY = re.compile(r"(?P<key>[^#!\s=:][^\s=:]*)[ \t\f]*[=:]?[ \t\f]*(?P<value>.*)")


def spark_defaults_file() -> dict[str, str]:
    """The ``spark.*`` settings of the installation's ``spark-defaults.conf`` (in
    ``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``): what a driver JVM started here loads."""
    path = Path(os.environ.get("SPARK_CONF_DIR") or Path(_find_spark_home()) / "conf") / "spark-defaults.conf"
    if not path.is_file():
        return {}
    settings = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PROPERTY.fullmatch(line.strip())
        if match and match["key"].startswith("spark."):
            settings[match["key"]] = match["value"].strip()
    return settings


def _running_settings() -> dict[str, str]:
    """The settings of the driver JVM that already runs: the active context's, or (under
    spark-submit, before any context) those spark-submit gave the JVM."""
    active = SparkContext._active_spark_context
    if active is not None:
        return dict(active.getConf().getAll())
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return dict(SparkConf().getAll())


def build_session(master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """Get or create the session: ``master`` and ``conf`` win, then settings given before
    (spark-submit's, ``spark-defaults.conf``, a running context's), then the job's defaults;
    adds the PostgreSQL JDBC jar when it is installed and no jars were given."""
    launching = SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    given = spark_defaults_file() if launching else _running_settings()
    defaults = {**SMALL_MACHINE_CONF, **(DRIVER_LAUNCH_CONF if launching else {})}
    jar = postgres_jdbc_jar()
    if jar.exists():
        defaults["spark.jars"] = str(jar)
    settings = {key: value for key, value in defaults.items() if key not in given}
    settings.update(conf or {})
    if master:
        settings["spark.master"] = master
    if launching:
        if QUIET_JVM_LOGGING.exists():
            java_options = settings.get("spark.driver.extraJavaOptions", given.get("spark.driver.extraJavaOptions", ""))
            settings["spark.driver.extraJavaOptions"] = (  # later -D options win
                f"-Dlog4j2.configurationFile={QUIET_JVM_LOGGING.as_uri()} {java_options}".strip())
        if settings.get("spark.master", given.get("spark.master", "")).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a cluster's executors must reach the driver
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
