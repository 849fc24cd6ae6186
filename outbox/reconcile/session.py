"""A SparkSession with defaults sized for a small machine; ``--master`` and ``--conf`` pass through."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")

SMALL_MACHINE_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}


def build_session(master: str = "local[*]", conf: Mapping[str, str] | None = None,
                  app_name: str = "halfmoon-reconcile") -> SparkSession:
    """Get or create the session; adds the Debian PostgreSQL JDBC jar when it is installed."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**SMALL_MACHINE_CONF, **(conf or {})}
    if POSTGRES_JDBC_JAR.exists() and "spark.jars" not in settings:
        settings["spark.jars"] = str(POSTGRES_JDBC_JAR)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
