"""Jars for the local Kafka broker and for Spark's Kafka source, fetched from Maven Central.

The jars are resolved by Maven from the small poms in ``tests/support/services/poms`` (so transitive versions
are Maven's, not hand-written lists) and copied into
``~/.cache/streaming-sink/jars/<name>-<version>/``. A ``classpath.txt`` manifest is written last,
into a directory that is renamed into place atomically, so an interrupted fetch is redone rather
than half-used. Maven's own download cache is ``~/.m2``; both survive fresh clones.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: Kafka broker run by tests and demos. 4.x: KRaft only (no ZooKeeper jars) and without the
#: protocol versions removed by KIP-896, so it proves the clients in use (kafka-python 3.0.x,
#: Spark's kafka-clients 3.9.1) speak only what current brokers accept; 3.9.1 also works.
KAFKA_VERSION = os.environ.get("STREAMING_SINK_KAFKA_VERSION", "4.1.1")

POM_DIR = Path(__file__).resolve().parent / "poms"
MANIFEST = "classpath.txt"


def cache_root() -> Path:
    """Where fetched jars live; ``$STREAMING_SINK_CACHE`` overrides ``~/.cache/streaming-sink``."""
    base = os.environ.get("STREAMING_SINK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "streaming-sink"
    )
    return Path(base) / "jars"


def jar_dir(name: str, version: str) -> Path:
    """Directory of the jar set ``<name>-<version>`` in the cache (complete once its manifest is there)."""
    return cache_root() / f"{name}-{version}"


class JarFetchError(RuntimeError):
    """Maven could not resolve or copy the jars."""


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    # Two processes (setup.sh and a test, or parallel test workers) may fetch at once.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _recipe_digest(pom: Path, properties: dict[str, str]) -> str:
    # Part of the manifest so that editing a pom (or its properties) refetches the jars.
    digest = hashlib.sha256(pom.read_bytes())
    for key in sorted(properties):
        digest.update(f"\0{key}={properties[key]}".encode())
    return digest.hexdigest()[:16]


def _read_manifest(dest: Path, recipe: str) -> list[Path] | None:
    manifest = dest / MANIFEST
    if not manifest.is_file():
        return None
    lines = manifest.read_text().splitlines()
    if not lines or lines[0] != f"# recipe {recipe}":
        return None
    jars = [dest / line for line in lines[1:] if line.strip()]
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def _maven_settings() -> Path:
    override = os.environ.get("STREAMING_SINK_MAVEN_SETTINGS")
    return Path(override) if override else POM_DIR / "settings.xml"


def _run_maven(pom: Path, out_dir: Path, properties: dict[str, str]) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise JarFetchError("mvn not found: install Maven 3.8+ (Debian: apt-get install maven)")
    argv = [
        mvn,
        "-q",
        "-B",
        "-s",
        str(_maven_settings()),
        "-f",
        str(pom),
        "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
        f"-DoutputDirectory={out_dir}",
        "-DincludeScope=runtime",  # compile + runtime; never provided/test
        "-Dmdep.useRepositoryLayout=true",  # group/artifact/version/ paths: artifactId is exact
        *(f"-D{k}={v}" for k, v in properties.items()),
    ]
    proc = subprocess.run(argv, cwd=str(out_dir), capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip().splitlines()
        tail = "\n".join(output[-30:])
        raise JarFetchError(f"{' '.join(argv)} failed with exit {proc.returncode}:\n{tail}")


def _artifact_id(jar: Path) -> str:
    # Repository layout: .../<artifactId>/<version>/<artifactId>-<version>.jar
    return jar.parent.parent.name


def fetch_jars(
    name: str,
    version: str,
    pom: Path,
    properties: dict[str, str],
    keep: Callable[[Path], bool] = lambda _jar: True,
) -> list[Path]:
    """Return the cached jars for ``<name>-<version>``, fetching them with Maven when missing.

    ``keep`` filters the resolved jars; rejected ones are deleted so the cache directory holds
    exactly the classpath.
    """
    root = cache_root()
    dest = jar_dir(name, version)
    recipe = _recipe_digest(pom, properties)
    cached = _read_manifest(dest, recipe)
    if cached is not None:
        return cached
    with _lock(root / f".{name}-{version}.lock"):
        cached = _read_manifest(dest, recipe)  # another process may have finished while we waited
        if cached is not None:
            return cached
        staging = root / f".{name}-{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        print(f"tests/support/services: fetching {name}-{version} jars with Maven into {dest}", file=sys.stderr)
        _run_maven(pom, staging, properties)
        kept: list[Path] = []
        for jar in sorted(staging.rglob("*.jar")):
            if keep(jar):
                kept.append(jar)
            else:
                jar.unlink()
        for sub in sorted(staging.rglob("*"), reverse=True):  # drop directories emptied above
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
        if not kept:
            raise JarFetchError(f"Maven resolved no jars for {name}-{version} from {pom}")
        listing = "".join(f"{j.relative_to(staging)}\n" for j in kept)
        (staging / MANIFEST).write_text(f"# recipe {recipe}\n{listing}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    result = _read_manifest(dest, recipe)
    assert result is not None
    return result


# --- Kafka broker --------------------------------------------------------------------------------


def kafka_broker_jars(version: str = KAFKA_VERSION) -> list[Path]:
    """All jars needed to run ``kafka.Kafka`` (broker + controller, KRaft) of ``version``."""
    return fetch_jars("kafka", version, POM_DIR / "kafka-broker.xml", {"kafka.version": version})


def kafka_broker_classpath(version: str = KAFKA_VERSION) -> str:
    """``java -cp`` value for the Kafka broker."""
    return os.pathsep.join(str(j) for j in kafka_broker_jars(version))


# --- Kafka Connect and the Debezium PostgreSQL connector -------------------------------------------

#: Debezium release of every Debezium artifact the change-data tests run (a connector's jars must agree).
DEBEZIUM_VERSION = os.environ.get("STREAMING_SINK_DEBEZIUM_VERSION", "3.6.1.Final")


def kafka_connect_jars(version: str = KAFKA_VERSION) -> list[Path]:
    """The classpath of a Kafka Connect worker (``ConnectStandalone``) of ``version``, without connectors."""
    return fetch_jars("kafka-connect", version, POM_DIR / "kafka-connect.xml", {"kafka.version": version})


def _provided_by_connect(jar: Path) -> bool:
    # Kafka's own APIs and SLF4J always load from the worker's classpath, never from a plugin's
    # class loader, so a plugin's copies of them would be dead weight (and another version on disk).
    relative = jar.as_posix()
    return "/org/apache/kafka/" in relative or "/org/slf4j/" in relative


def debezium_postgres_plugin(version: str = DEBEZIUM_VERSION) -> Path:
    """Directory holding the Debezium PostgreSQL connector and its libraries: one Connect plugin."""
    properties = {"debezium.version": version}
    pom = POM_DIR / "debezium-postgres.xml"
    fetch_jars("debezium-postgres", version, pom, properties, keep=lambda jar: not _provided_by_connect(jar))
    return jar_dir("debezium-postgres", version)


# --- Spark Kafka source --------------------------------------------------------------------------

def pyspark_jars_dir() -> Path:
    """The ``jars/`` directory of the installed pyspark (what a local Spark already has)."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise JarFetchError(f"pyspark at {jars.parent} has no jars/ directory")
    return jars


def _shipped_by_pyspark(jars_dir: Path) -> Callable[[Path], bool]:
    names = [p.name for p in jars_dir.glob("*.jar")]

    def shipped(jar: Path) -> bool:
        # pyspark's file names are <artifactId>-<version>.jar; an artifactId is "shipped" when
        # some file starts with it followed by "-<digit>". Its version is the one Spark was built
        # and tested with, so ours must not shadow it on the classpath.
        prefix = _artifact_id(jar) + "-"
        return any(n.startswith(prefix) and n[len(prefix) : len(prefix) + 1].isdigit() for n in names)

    return shipped


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """Jars Spark needs for ``format("kafka")`` that the installed pyspark does not ship.

    Spark (spark-sql, spark-core, ...) is ``provided`` in Spark's own poms, so Maven does not
    copy it; jars that pyspark already has (scala-library, slf4j, lz4, snappy, spark-tags, ...)
    are dropped to avoid two versions of one library on the classpath.
    """
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    scala = os.environ.get("STREAMING_SINK_SCALA_BINARY", "2.13")
    shipped = _shipped_by_pyspark(pyspark_jars_dir())
    properties = {"spark.version": spark_version, "scala.binary.version": scala}

    return fetch_jars(
        "spark-kafka",
        f"{spark_version}_{scala}",
        POM_DIR / "spark-kafka.xml",
        properties,
        keep=lambda jar: not shipped(jar),
    )


def spark_kafka_jars_conf(spark_version: str | None = None) -> str:
    """Comma-joined jar paths, the value for ``spark.jars``."""
    return ",".join(str(j) for j in spark_kafka_jars(spark_version))


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.services.jars [--tests]``: fetch the broker's and Spark's jar sets, and with
    ``--tests`` the change-data tests' too, Kafka Connect and Debezium (used by scripts/setup.sh)."""
    broker = kafka_broker_jars()
    spark = spark_kafka_jars()
    print(f"kafka broker {KAFKA_VERSION}: {len(broker)} jars under {cache_root()}")
    if "--tests" in (argv or []):
        connect = kafka_connect_jars()
        plugin = debezium_postgres_plugin()
        print(f"kafka connect {KAFKA_VERSION}: {len(connect)} jars; debezium postgres plugin: {plugin}")
    print("spark kafka source: " + " ".join(j.name for j in spark))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
