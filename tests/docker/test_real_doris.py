"""The Doris target and the exactly-once scenario against a real Apache Doris (FE + BE containers).

Runs where a Docker engine answers; elsewhere the whole module is skipped with the reason. The
emulator is a test double of protocol.md part B; this is where its facts meet the real server:
pre-commit invisibility, commit/abort wording, label reuse, and a kill -9 at the commit point
followed by a restart that ends exact.

Containers: the official `apache/doris` FE and BE images (override with DORIS_FE_IMAGE /
DORIS_BE_IMAGE), on the host network as Doris's quick start runs them, so the FE's 307 points at
a BE address this process can reach. SQL (DDL, row reads) goes through the `mysql` client inside
the FE image, which its start-up scripts use too; the sink itself only speaks HTTP.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
testcontainers_core = pytest.importorskip("testcontainers.core.container", reason="testcontainers is not installed")


def _docker_unavailable() -> str | None:
    try:
        docker.from_env().ping()
    except Exception as error:  # any failure to reach the engine means: skip, saying why
        return f"no Docker engine answers ({type(error).__name__}: {error})"
    return None


_REASON = _docker_unavailable()
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

from devstack.pipeline import DB, TABLES  # noqa: E402
from streaming_sink.committable import TxnRef  # noqa: E402
from streaming_sink.targets.base import CommitOutcome, TargetError  # noqa: E402
from streaming_sink.targets.doris import DorisTarget  # noqa: E402
from tests.integration.test_exactly_once_doris import DorisPipeline  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

VERSION = os.environ.get("DORIS_VERSION", "4.0.8")  # as docker-compose.yml; needs 2.1.8+ (SKIP_CHECK_ULIMIT)
FE_IMAGE = os.environ.get("DORIS_FE_IMAGE", f"apache/doris:fe-{VERSION}")
BE_IMAGE = os.environ.get("DORIS_BE_IMAGE", f"apache/doris:be-{VERSION}")
FE_URL = "http://127.0.0.1:8030"
COLUMNS_DDL = "id BIGINT, name VARCHAR(64), amount DOUBLE, kafka_partition INT, kafka_offset BIGINT"
START_DEADLINE_S = 600


class RealDoris:
    """One FE and one BE container, and SQL through the FE image's mysql client."""

    def __init__(self) -> None:
        from testcontainers.core.container import DockerContainer

        env = {"FE_SERVERS": "fe1:127.0.0.1:9010"}
        self.fe = DockerContainer(FE_IMAGE).with_kwargs(network_mode="host")
        for key, value in {**env, "FE_ID": "1"}.items():
            self.fe = self.fe.with_env(key, value)
        self.be = DockerContainer(BE_IMAGE).with_kwargs(network_mode="host")
        for key, value in {**env, "BE_ADDR": "127.0.0.1:9050", "SKIP_CHECK_ULIMIT": "true"}.items():
            self.be = self.be.with_env(key, value)

    def start(self) -> "RealDoris":
        self.fe.start()
        self.be.start()
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:  # readiness poll of a starting cluster, not a synchronisation sleep
            try:
                if "true" in self.sql("SHOW BACKENDS", database=None).lower().split():
                    return self
            except RuntimeError:
                pass
            time.sleep(2)
        raise RuntimeError(f"Doris did not report an alive BE within {START_DEADLINE_S}s")

    def stop(self) -> None:
        for container in (self.be, self.fe):
            try:
                container.stop()
            except Exception as error:  # teardown: report, do not mask the test's own failure
                print(f"stopping {container} failed: {error}")

    def sql(self, statement: str, database: str | None = DB) -> str:
        command = ["mysql", "-h127.0.0.1", "-P9030", "-uroot", "--batch", "--raw", "--skip-column-names"]
        if database:
            command.append(f"-D{database}")
        code, output = self.fe.exec(command + ["-e", statement])
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


@pytest.fixture(scope="module")
def doris() -> Iterator[RealDoris]:
    cluster = RealDoris().start()
    try:
        for table in [*TABLES, "probe"]:
            cluster.create_table(table)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def target() -> DorisTarget:
    return DorisTarget(FE_URL, DB, "root", "", backoff_s=0.2)


def _rows(start: int, n: int):
    import pyarrow as pa

    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n,\"{i}\"" for i in ids], "amount": [i / 4 for i in ids],
                     "kafka_partition": pa.array([0] * n, pa.int32()), "kafka_offset": pa.array(ids, pa.int64())})


def test_precommit_commit_abort_against_the_real_server(doris: RealDoris, target: DorisTarget) -> None:
    assert target.routable_tables() is None
    refs: list[TxnRef] = []
    txn = target.begin("probe", lambda chunk: TxnRef("doris", DB, "probe", f"real_{time.time_ns()}_c{chunk}", 0, "a"),
                       refs.append)
    txn.write(_rows(0, 5))
    txn.write(_rows(5, 5))
    parts = txn.prepare()
    assert [target.fe.label_state(DB, r.label)[0] for r in refs] == ["PRECOMMITTED", "PRECOMMITTED"]
    assert doris.rows("probe") == []  # invisible until committed
    committable = parts[0].committable("sum")
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED  # "is already visible/committed"
    target.abort(refs[1])  # by label on 2.1+
    assert target.fe.label_state(DB, refs[1].label)[0] == "ABORTED"
    assert target.commit(parts[1].committable("sum")) is CommitOutcome.ABORTED  # "is already aborted"
    with pytest.raises(TargetError, match="already committed"):
        target.abort(refs[0])
    expected = [(i, f"n,\"{i}\"", i / 4, 0, i) for i in range(5)]
    assert doris.rows("probe") == expected


def test_kill_at_the_commit_point_then_restart_is_exact(doris: RealDoris, tmp_path: Path, kafka_broker: Any) -> None:
    class RealAdapter:
        def target_url(self) -> str:
            return "doris://127.0.0.1:8030"

        def target_options(self) -> dict[str, Any]:
            return {"tables": TABLES, "backoff_s": 0.2}

        def env(self) -> dict[str, str]:
            return {}

        def create_tables(self, database: str, tables: list[str]) -> None:
            for table in tables:
                doris.sql(f"TRUNCATE TABLE {table}")

        def rows(self, database: str, table: str) -> list[tuple]:
            return doris.rows(table)

        def problems(self, database: str) -> list[str]:
            return [f"running transaction left: {line}" for line in doris.running_transactions()]

    pipeline = DorisPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", adapter=RealAdapter(),
                             messages_per_partition=200, max_offsets_per_trigger=120,
                             spark_conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "20"})
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-prepared-record@2", run=0) == -signal.SIGKILL, pipeline.log_tail(0)
    pipeline.run_to_completion()
    pipeline.verify()
