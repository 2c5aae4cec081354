"""The packaged job's SparkSession: Spark's Kafka source on the classpath wherever Spark runs, the
worker Python for local masters, and a refusal of Kafka source versions known to break restarts.

Spark's Kafka source is a separate artifact that a plain pyspark install lacks. Unless the user
names it (`spark.jars` or `spark.jars.packages` in `[spark.conf]`, or `--packages` to
spark-submit), the job asks Spark to fetch the one built for the running Spark, the way Spark's
own guide deploys it.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigurationError, SparkStartError

KAFKA_SOURCE_ARTIFACT = "spark-sql-kafka-0-10"
#: Kafka source versions whose micro-batch stream throws a NullPointerException from
#: KafkaMicroBatchStream.metrics when a query restarts before its first batch of the run has
#: fetched the latest offsets (SPARK-55271; regression of SPARK-54027, fixed in 4.1.3 and 4.2.0).
KNOWN_BAD_KAFKA_SOURCE = {
    version: "restarted queries fail with a NullPointerException in KafkaMicroBatchStream.metrics (SPARK-55271)"
    for version in ("4.1.0", "4.1.1", "4.1.2")
}


def scala_binary_version() -> str:
    """The Scala line of the installed Spark, read from the name of its spark-core jar."""
    import pyspark

    for jar in (Path(pyspark.__file__).resolve().parent / "jars").glob("spark-core_*.jar"):
        match = re.match(r"spark-core_(\d+\.\d+)-", jar.name)
        if match:
            return match.group(1)
    return "2.13"  # every Spark 4 release is built for Scala 2.13 only


def kafka_source_package(spark_version: str, scala: str) -> str:
    """Maven coordinates of the Kafka source built for this Spark."""
    return f"org.apache.spark:{KAFKA_SOURCE_ARTIFACT}_{scala}:{spark_version}"


#: A zone-less timestamp in a message is read as UTC, as the targets store instants, unless [spark.conf] names a zone:
#: Spark's default, the JVM's zone, shifts every such value by the machine's offset.
SESSION_TIME_ZONE = "UTC"


def session_conf(user_conf: dict[str, str], spark_version: str, scala: str) -> dict[str, str]:
    """The user's Spark conf plus the Kafka source and the session's time zone, unless the user already names them."""
    conf = {"spark.sql.session.timeZone": SESSION_TIME_ZONE, **user_conf}
    named = ",".join(conf.get(key, "") for key in ("spark.jars", "spark.jars.packages"))
    if KAFKA_SOURCE_ARTIFACT not in named:
        packages = [p for p in conf.get("spark.jars.packages", "").split(",") if p.strip()]
        conf["spark.jars.packages"] = ",".join([*packages, kafka_source_package(spark_version, scala)])
    return conf


def worker_python(conf: dict[str, str], environ: dict[str, str]) -> str | None:
    """The Python the workers must run, or None to leave the deployment's choice alone.

    A driver started without spark-submit takes the workers' Python from PYSPARK_PYTHON only;
    unset, local workers would run whatever `python3` is on PATH, without this package.
    """
    if "spark.pyspark.python" in conf:
        return conf["spark.pyspark.python"]
    if environ.get("PYSPARK_PYTHON"):
        return None
    master = conf.get("spark.master", environ.get("MASTER", "local[*]"))
    return sys.executable if master.startswith("local") else None


def build_session(app_name: str, user_conf: dict[str, str], master: str | None = None) -> Any:
    """A SparkSession that can read Kafka, or a ConfigurationError that says what to add."""
    import pyspark
    from pyspark.sql import SparkSession

    conf = session_conf(user_conf, pyspark.__version__, scala_binary_version())
    if master is not None:
        conf["spark.master"] = master
    python = worker_python(conf, dict(os.environ))
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python  # read once, when the SparkContext starts
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as error:  # PySparkRuntimeError: the JVM exited before it gave PySpark its port
        if "JAVA_GATEWAY_EXITED" not in str(error):
            raise
        raise SparkStartError(start_failure(conf, pyspark.__version__, dict(os.environ))) from None
    check_kafka_source(spark)
    return spark


def start_failure(conf: dict[str, str], spark_version: str, environ: dict[str, str]) -> str:
    """Why Spark's JVM most likely exited before it started, and what to check, in one line."""
    java = Path(environ["JAVA_HOME"]) / "bin" / "java" if environ.get("JAVA_HOME") else shutil.which("java")
    if java is None or not Path(java).exists():
        return "no Java found (neither JAVA_HOME nor java on PATH); install Java 17 or 21"
    packages = [p for p in conf.get("spark.jars.packages", "").split(",") if p.strip()]
    if not packages:
        return "its JVM exited at once (Spark's lines above say why); check JAVA_HOME and [spark.conf]"
    minor = ".".join(spark_version.split(".")[:2])
    return (f"it could not fetch {', '.join(packages)} (Spark's lines above say why): check that this machine reaches "
            "Maven Central, or name your mirror in [spark.conf] \"spark.jars.repositories\" (or "
            "\"spark.jars.ivySettings\"), or give in [spark.conf] \"spark.jars.packages\" a Kafka source version "
            f"that resolves: any {KAFKA_SOURCE_ARTIFACT} {minor}.x is accepted for Spark {spark_version}")


def kafka_source_version(spark: Any) -> str | None:
    """The version of the Kafka source Spark resolves `format("kafka")` to; None if it has none."""
    jvm = spark._jvm
    try:
        provider = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "kafka", spark._jsparkSession.sessionState().conf())
    except Exception:  # Py4JJavaError: DATA_SOURCE_NOT_FOUND
        return None
    version = provider.getPackage().getImplementationVersion()
    return str(version) if version else "unknown"


def check_kafka_source(spark: Any) -> None:
    """Refuse a Spark without the Kafka source, or with one that is known to lose restarts."""
    scala = scala_binary_version()
    version = kafka_source_version(spark)
    wanted = kafka_source_package(spark.version, scala)
    if version is None:
        raise ConfigurationError(
            "Spark has no Kafka source (format \"kafka\"): add it with spark-submit --packages "
            f"{wanted}, or in [spark.conf] \"spark.jars.packages\" = \"{wanted}\"")
    if version in KNOWN_BAD_KAFKA_SOURCE:
        raise ConfigurationError(
            f"the Kafka source {KAFKA_SOURCE_ARTIFACT} {version} is known to be broken: "
            f"{KNOWN_BAD_KAFKA_SOURCE[version]}; use Spark and its Kafka source 4.1.3, 4.2.0 or later")
    if version != "unknown" and version.split(".")[:2] != spark.version.split(".")[:2]:
        raise ConfigurationError(
            f"the Kafka source {KAFKA_SOURCE_ARTIFACT} {version} was built for another Spark than the running "
            f"{spark.version}; use {wanted}")
