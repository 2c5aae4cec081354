"""The StarRocks target and the exactly-once scenario against a real StarRocks (all-in-one container).

Runs where a Docker engine answers; elsewhere the whole module is skipped with the reason. The
emulator is a test double of protocol.md part A; this is where its facts meet the real server:
the FE->BE 307 with credentials re-sent, PREPARED data invisible until commit, "already committed"
on a repeated commit, rollback wording, and a kill -9 at the commit point followed by a restart
that ends exact.

Container: `starrocks/allin1-ubuntu` (override the tag with STARROCKS_VERSION, the image with
STARROCKS_IMAGE) on the host network, so the BE address the FE redirects to (127.0.0.1:8040) is
reachable from this process. SQL (DDL, row reads) goes through the `mysql` client in the image;
the sink itself only speaks HTTP.
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

import pyarrow as pa  # noqa: E402

from streaming_sink.committable import TxnRef  # noqa: E402
from streaming_sink.targets.base import CommitOutcome, TargetError  # noqa: E402
from streaming_sink.targets.starrocks import StarRocksTarget  # noqa: E402
from tests.support.pipeline import DB, TABLES, LocalPipeline  # noqa: E402
from tests.support.real_cluster import FE_URL, STARROCKS_ENV, RealStarRocks  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def starrocks() -> Iterator[RealStarRocks]:
    server = RealStarRocks().start()
    try:
        for table in [*TABLES, "probe"]:
            server.create_table(table)
        yield server
    finally:
        server.stop()


def _rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n,\"{i}\"\\" for i in ids], "amount": [i / 4 for i in ids],
                     "kafka_partition": pa.array([0] * n, pa.int32()), "kafka_offset": pa.array(ids, pa.int64())})


def test_begin_load_prepare_commit_rollback_against_the_real_server(starrocks: RealStarRocks) -> None:
    target = StarRocksTarget(FE_URL, DB, "root", "", prepared_timeout=600, backoff_s=0.2)
    assert target.routable_tables() is None
    labels = [f"real_{time.time_ns()}_{i}" for i in range(2)]
    parts = []
    for label, start in zip(labels, (0, 5)):
        refs: list[TxnRef] = []
        txn = target.begin("probe", lambda chunk, label=label: TxnRef("starrocks", DB, "probe", label, 0, "a"), refs.append)
        txn.write(_rows(start, 3))
        txn.write(_rows(start + 3, 2))
        (part,) = txn.prepare()
        parts.append(part.committable("sum"))
    assert [target.fe.label_state(DB, label)[0] for label in labels] == ["PREPARED", "PREPARED"]
    assert starrocks.rows("probe") == []  # invisible until committed
    assert target.commit(parts[0]) is CommitOutcome.COMMITTED
    assert target.commit(parts[0]) is CommitOutcome.COMMITTED  # "has already committed"
    target.abort(parts[1].ref())
    assert target.fe.label_state(DB, labels[1])[0] == "ABORTED"
    assert target.commit(parts[1]) is CommitOutcome.ABORTED
    with pytest.raises(TargetError, match="but the sink was aborting it"):
        target.abort(parts[0].ref())
    assert starrocks.rows("probe") == sorted((i, f"n,\"{i}\"\\", i / 4, 0, i) for i in range(5))


def test_kill_at_the_commit_point_then_restart_is_exact(starrocks: RealStarRocks, tmp_path: Path, kafka_broker: Any) -> None:
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", adapter=starrocks.adapter(STARROCKS_ENV),
                             messages_per_partition=200, max_offsets_per_trigger=120)
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-prepared-record@2", run=0) == -signal.SIGKILL, pipeline.log_tail(0)
    pipeline.run_to_completion()
    pipeline.verify()
