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

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.real_cluster import skip_without_docker

skip_without_docker()

from streaming_sink.committable import TxnRef  # noqa: E402
from streaming_sink.targets.base import CommitOutcome, TargetError  # noqa: E402
from streaming_sink.targets.doris import DorisTarget  # noqa: E402
from tests.support.pipeline import DB, TABLES  # noqa: E402
from tests.support.real_cluster import FE_URL, RealDoris  # noqa: E402
from tests.support.targets.doris import DorisPipeline  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


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
    pipeline = DorisPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", adapter=doris.adapter(),
                             messages_per_partition=200, max_offsets_per_trigger=120,
                             spark_conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "20"})
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-prepared-record@2", run=0) == -signal.SIGKILL, pipeline.log_tail(0)
    pipeline.run_to_completion()
    pipeline.verify()
