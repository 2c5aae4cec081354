"""The real StarRocks and Doris in Docker (tests/docker), on one base: containers on the host network, SQL through
the mysql client inside the FE's image, the bench tables, rows, running transactions, and the pipeline adapter.

Needs the docker SDK and testcontainers (imported when a cluster is built, so that importing this module starts and
needs nothing). A StarRocks is one all-in-one container; a Doris is one FE and one BE container.
"""
from __future__ import annotations

import os
import time
from typing import Any

from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from tests.support.pipeline import DB, TABLES
from tests.support.targets.base import TargetAdapter

__all__ = ["COLUMNS_DDL", "FE_URL", "RealCluster", "RealClusterAdapter", "RealDoris", "RealStarRocks", "skip_without_docker"]

FE_URL = "http://127.0.0.1:8030"
COLUMNS_DDL = "id BIGINT, name VARCHAR(64), amount DOUBLE, kafka_partition INT, kafka_offset BIGINT"
START_DEADLINE_S = 600

STARROCKS_VERSION = os.environ.get("STARROCKS_VERSION", "4.0.13")  # as docker-compose.yml; needs 3.5.4+ (prepared_timeout)
STARROCKS_IMAGE = os.environ.get("STARROCKS_IMAGE", f"starrocks/allin1-ubuntu:{STARROCKS_VERSION}")
DORIS_VERSION = os.environ.get("DORIS_VERSION", "4.0.8")  # as docker-compose.yml; needs 2.1.8+ (SKIP_CHECK_ULIMIT)
DORIS_FE_IMAGE = os.environ.get("DORIS_FE_IMAGE", f"apache/doris:fe-{DORIS_VERSION}")
DORIS_BE_IMAGE = os.environ.get("DORIS_BE_IMAGE", f"apache/doris:be-{DORIS_VERSION}")


def skip_without_docker() -> None:
    """Skip the calling test module, saying why, unless the docker SDK, testcontainers and a Docker engine are there."""
    import pytest

    docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
    pytest.importorskip("testcontainers.core.container", reason="testcontainers is not installed")
    try:
        docker.from_env().ping()
    except Exception as error:  # any failure to reach the engine means: skip, saying why
        pytest.skip(f"no Docker engine answers ({type(error).__name__}: {error})", allow_module_level=True)


def _container(image: str, **env: str) -> Any:
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image).with_kwargs(network_mode="host")
    for key, value in env.items():
        container = container.with_env(key, value)
    return container


class RealCluster:
    """Containers started in order (stopped in reverse), SQL through the first one's mysql client."""

    product: str  # the target URL's scheme
    display: str
    containers: list[Any]

    def start(self) -> RealCluster:
        for container in self.containers:
            container.start()
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:  # readiness poll of a starting server, not a synchronisation sleep
            try:
                if "true" in self.sql("SHOW BACKENDS", database=None).lower().split():
                    return self
            except RuntimeError:
                pass
            time.sleep(2)
        raise RuntimeError(f"{self.display} did not report an alive BE within {START_DEADLINE_S}s")

    def stop(self) -> None:
        for container in reversed(self.containers):
            try:
                container.stop()
            except Exception as error:  # teardown: report, do not mask the test's own failure
                print(f"stopping {container} failed: {error}")

    def sql(self, statement: str, database: str | None = DB) -> str:
        command = ["mysql", "-h127.0.0.1", "-P9030", "-uroot", "--batch", "--raw", "--skip-column-names"]
        if database:
            command.append(f"-D{database}")
        code, output = self.containers[0].exec(command + ["-e", statement])
        text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else str(output)
        if code != 0:
            raise RuntimeError(f"SQL failed ({code}): {statement}: {text}")
        return text

    def create_table(self, table: str) -> None:
        self.sql(f"CREATE DATABASE IF NOT EXISTS {DB}", database=None)
        self.sql(
            f"CREATE TABLE IF NOT EXISTS {table} ({COLUMNS_DDL}) DUPLICATE KEY(id) "
            'DISTRIBUTED BY HASH(id) BUCKETS 1 PROPERTIES ("replication_num" = "1")'
        )

    def rows(self, table: str) -> list[tuple]:
        text = self.sql(f"SELECT id, name, amount, kafka_partition, kafka_offset FROM {table}")
        out = []
        for line in text.splitlines():
            ident, name, amount, partition, offset = line.split("\t")
            out.append((int(ident), name, float(amount), int(partition), int(offset)))
        return sorted(out)

    def running_transactions(self) -> list[str]:
        db_id = next(line.split("\t")[0] for line in self.sql("SHOW PROC '/dbs'", None).splitlines()
                     if line.split("\t")[1:2] == [DB])
        return [line for line in self.sql(f"SHOW PROC '/transactions/{db_id}/running'", None).splitlines() if line]

    def adapter(self, env: dict[str, str] | None = None) -> RealClusterAdapter:
        """The pipeline's adapter: the job reaches the FE over HTTP, the test reads over SQL."""
        return RealClusterAdapter(self, env or {})


class RealStarRocks(RealCluster):
    """One all-in-one container (FE + BE)."""

    product, display = "starrocks", "StarRocks"

    def __init__(self) -> None:
        self.containers = [_container(STARROCKS_IMAGE)]


class RealDoris(RealCluster):
    """One FE and one BE container."""

    product, display = "doris", "Doris"

    def __init__(self) -> None:
        env = {"FE_SERVERS": "fe1:127.0.0.1:9010"}
        self.containers = [_container(DORIS_FE_IMAGE, **env, FE_ID="1"),
                           _container(DORIS_BE_IMAGE, **env, BE_ADDR="127.0.0.1:9050", SKIP_CHECK_ULIMIT="true")]


class RealClusterAdapter(TargetAdapter):
    """A real cluster as the pipeline reaches it; `create_tables` empties the tables the cluster's fixture made."""

    def __init__(self, cluster: RealCluster, env: dict[str, str]) -> None:
        self.cluster, self._env, self.options = cluster, env, {}

    def target_url(self) -> str:
        return f"{self.cluster.product}://127.0.0.1:8030"

    def target_options(self) -> dict[str, Any]:
        return {"tables": TABLES, "backoff_s": 0.2}

    def env(self) -> dict[str, str]:
        return dict(self._env)

    def create_tables(self, database: str, tables: list[str]) -> None:
        for table in tables:
            self.cluster.sql(f"TRUNCATE TABLE {table}")

    def rows(self, database: str, table: str) -> list[tuple]:
        return self.cluster.rows(table)

    def problems(self, database: str) -> list[str]:
        return [f"running transaction left: {line}" for line in self.cluster.running_transactions()]


#: the credentials the StarRocks all-in-one image's job takes
STARROCKS_ENV = {USER_ENV: "root", PASSWORD_ENV: ""}
