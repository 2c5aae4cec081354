"""Configuration for a local Spark (tests and demos) that can read Kafka.

Spark is started by pyspark in-process (py4j); these settings keep it small (2 cores, modest
memory), on loopback only, and give it the Kafka source jars from :mod:`tests.support.services.jars`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tests.support.services import jars


def spark_env() -> dict[str, str]:
    """Environment a local Spark needs: workers use this interpreter, and only loopback."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def local_spark_conf(extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Spark conf for ``local[2]`` with the Kafka source; ``extra`` overrides any key."""
    conf: dict[str, Any] = {
        "spark.master": "local[2]",
        "spark.jars": jars.spark_kafka_jars_conf(),
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
    }
    conf.update(extra or {})
    return {k: str(v) for k, v in conf.items()}


def local_spark_session(app_name: str = "streaming-sink-local", extra: dict[str, Any] | None = None):
    """Build (or get) a SparkSession with :func:`local_spark_conf`, after setting :func:`spark_env`.

    The environment must be set before the JVM starts, which happens here on first use.
    """
    from pyspark.sql import SparkSession

    os.environ.update(spark_env())
    builder = SparkSession.builder.appName(app_name)
    for key, value in local_spark_conf(extra).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
