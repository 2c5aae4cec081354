"""A transient fault is ridden through, not stopped on (issue 38, item 9): ClickHouse over HTTP (the test front over
the real engine), the real coordinator and writers in this process, one writer attempt per partition as Spark's local
mode runs them (no task retry to fall back on).

* a statement safe to send again (a read) that fails on a transient fault is sent again where it failed, however
  often the commit's statements fail in a row;
* a writer's statement that cannot be sent again blindly (the staging table's CREATE, its answer lost) fails the
  pass, and the sink writes the pass again under fresh labels, the failed pass's leftovers dropped;
* what persists past the bound still stops the batch, leaving nothing behind;
* the packaged job restarts its query from the checkpoint in its own process after a fault the batch could not ride,
  and stops in one line when the fault persists past its bound.

Each ends with the table equal to the source row by row and no staging table left; the repeats are in the metrics.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink import retry
from streaming_sink.metrics import BatchMetrics
from streaming_sink.records import BatchState
from streaming_sink.sink import REWRITES, ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.clickhouse import ClickHouseTarget
from tests.support.batches import InMemoryRunner
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.jobs import ConfigJob

pytestmark = pytest.mark.slow

DB, TABLE, JOB, QUERY = "riding", "orders", "riding-job", "5e4d3c2b-1a09-4f8e-9d7c-6b5a49382716"
ROWS = 6
CREATE_STAGING = rf"^CREATE TABLE `{DB}`\.`ss_\w+` AS"
JOB_DB = "default"  # the packaged job's (tests/support/jobs.py)


def source() -> list[list[pa.RecordBatch]]:
    return [[pa.record_batch({"id": pa.array(range(ROWS), pa.int64()), "name": [f"n{i}" for i in range(ROWS)]})]]


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClickHouseFront]:
    monkeypatch.setattr(retry, "sleep", lambda seconds: None)  # the pauses between repeats: the faults are counted
    with ClickHouseFront(tmp_path / "clickhouse") as running:
        admin = ClickHouseTarget(running.url, database=DB)
        admin.client().command(f"CREATE DATABASE {DB}")
        admin.client().command(f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree ORDER BY id")
        admin.close()
        yield running


def _sink(front: ClickHouseFront) -> tuple[ExactlyOnceSink, BatchMetrics]:
    target = ClickHouseTarget(front.url, database=DB, backoff_s=0.01, backoff_max_s=0.05)
    metrics = BatchMetrics(JOB)
    sink = ExactlyOnceSink(target, MemoryStateStore(), JOB, table=TABLE, runner=InMemoryRunner(), heartbeat_seconds=None,
                           listeners=[metrics])
    sink.start()  # the start-up checks before any fault is armed: the faults are the batch's
    return sink, metrics


def _retries(metrics: BatchMetrics) -> dict[str, float]:
    return {level: float(value) for level, value in re.findall(
        rf'streaming_sink_retries_total{{job_id="{JOB}",level="(\w+)"}} ([0-9.]+)', metrics.render())}


def _rows(sink: ExactlyOnceSink) -> list[tuple[Any, ...]]:
    target = sink.target
    assert isinstance(target, ClickHouseTarget)
    return sorted(tuple(r) for r in target.client().query(f"SELECT id, name FROM {DB}.{TABLE}").result_rows)


def test_a_read_cut_again_and_again_is_sent_again_where_it_failed(front: ClickHouseFront) -> None:
    """Eight failures in a row on the commit's reads (a proxy's 502, which the client does not repeat itself): more
    than the commit's own repeats, each of which starts its statements over. Sent again statement by statement, the
    commit goes through in one batch."""
    sink, metrics = _sink(front)
    front.faults.fail_before.arm(r"^SELECT engine FROM system\.tables", times=4, status=502)  # staging's engine
    front.faults.fail_before.arm(r"SELECT DISTINCT state", times=4, status=502)
    try:
        report = sink.process(source(), 0, QUERY)
    finally:
        sink.close()
    assert front.faults.fail_before.fired == 8 and not front.faults.fail_before.armed
    assert report.action == "written" and report.rows == ROWS
    assert _rows(sink) == [(i, f"n{i}") for i in range(ROWS)]
    assert sink.target.staging_tables() == []  # type: ignore[attr-defined]
    assert _retries(metrics) == {"statement": 8.0, "write": 0.0, "query": 0.0}


@pytest.mark.parametrize("fault", ["drop_after_apply", "drop_before"])
def test_a_staging_table_created_with_its_answer_lost_has_its_pass_written_again(front: ClickHouseFront, fault: str) -> None:
    """The CREATE of a writer's staging table is cut (after the server made the table, or before it did): sending it
    again could not tell the writer's table from a stranger's, so the writer fails; the sink aborts the pass (its
    staging table, made or not, goes) and writes it again under fresh labels, in the same batch."""
    sink, metrics = _sink(front)
    getattr(front.faults, fault).arm(CREATE_STAGING, times=1)
    try:
        report = sink.process(source(), 0, QUERY)
        record = sink.state.get_batch(JOB, QUERY, 0)
    finally:
        sink.close()
    assert getattr(front.faults, fault).fired == 1
    assert report.action == "written" and report.rows == ROWS
    assert _rows(sink) == [(i, f"n{i}") for i in range(ROWS)]
    assert sink.target.staging_tables() == []  # type: ignore[attr-defined]
    assert record is not None and record.state is BatchState.COMMITTED
    assert _retries(metrics)["write"] == 1.0


def test_a_fault_that_persists_stops_the_batch_within_the_bound_leaving_nothing(front: ClickHouseFront) -> None:
    """Every CREATE of a staging table cut: the pass is written as often as `REWRITES` allows, then the batch fails
    with the fault's own error, nothing visible and no staging table left."""
    sink, metrics = _sink(front)
    front.faults.drop_after_apply.arm(CREATE_STAGING, times=100)
    try:
        with pytest.raises(Exception, match="Connection aborted"):  # clickhouse-connect's, as the writer met it
            sink.process(source(), 0, QUERY)
    finally:
        sink.close()
    assert front.faults.drop_after_apply.fired == REWRITES.retries + 1
    assert _rows(sink) == []
    assert sink.target.staging_tables() == []  # type: ignore[attr-defined]
    assert _retries(metrics)["write"] == REWRITES.retries


# -- the packaged job: its query restarted in the same process --------------------------------------------------------

LEDGER_COMMITTED = rf"^INSERT INTO `{JOB_DB}`\.`_streaming_sink_ledger`.*'committed'"


def _job(tmp_path: Path, kafka_broker: Any, front: ClickHouseFront, query_restarts: int) -> ConfigJob:
    """The packaged job (`streaming-sink run`, a child process, Spark local with task retries) into ClickHouse over
    HTTP through the front, which runs in this process and takes its faults from the test."""
    job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, f"riding-{tmp_path.name[-12:]}", messages_per_partition=200,
                    max_offsets_per_trigger=300,
                    target={"url": front.target_url, "database": JOB_DB, "create_tables": True})
    with job.config_path.open("a") as config:
        config.write(f"\n[sink]\nquery_restarts = {query_restarts}\n")
    job.produce(kafka_broker)
    return job


def _read(front: ClickHouseFront) -> Callable[[str, str], list[tuple[Any, ...]]]:
    def read(table: str, columns: str) -> list[tuple[Any, ...]]:
        target = ClickHouseTarget(front.url, database=JOB_DB)
        try:
            return [tuple(r) for r in target.client().query(f"SELECT {columns} FROM {JOB_DB}.{table}").result_rows]
        finally:
            target.close()

    return read


@pytest.mark.extended  # heavy (Kafka, Spark, two job runs): its siblings in CI are this file's in-process tests
def test_the_packaged_job_stops_in_one_line_on_a_fault_that_persists_and_rides_one_that_passes(
        tmp_path, kafka_broker, front):
    """The ledger's `committed` rows cut, more often than a commit repeats itself, so the batch's commit fails and the
    query with it. Cut every time: the job restarts its query once (`query_restarts = 1`), then stops with exit code 3
    and one line naming the fault and the runbook section. Run again while the fault still comes and goes (60 more
    cuts): the job restarts its query from its checkpoint in the same process, commits the prepared batch and goes
    on to the end, exit 0, every table equal to the source, the restarts in its log and in its count of repeats."""
    job = _job(tmp_path, kafka_broker, front, query_restarts=1)
    front.faults.drop_before.arm(LEDGER_COMMITTED, times=100_000)
    try:
        assert job.run(0) == 3, job.log_tail(0, lines=60)
    finally:
        front.faults.reset()
    last = job.log_tail(0, lines=1)
    assert "failed on a transient fault (connection lost) 2 time(s) in a row" in last, last
    assert "sink.query_restarts = 1" in last and "A transient fault persisted" in last, last
    log = (job.logs / "driver-0.log").read_text()
    assert len(re.findall(r"restarting the streaming query from its checkpoint", log)) == 1

    job.config_path.write_text(job.config_path.read_text().replace("query_restarts = 1", "query_restarts = 5"))
    front.faults.drop_before.arm(LEDGER_COMMITTED, times=60)
    try:
        assert job.run(1) == 0, job.log_tail(1, lines=60)
    finally:
        front.faults.release()
    assert front.faults.drop_before.fired == 60 and not front.faults.drop_before.armed
    job.verify(_read(front))
    assert sink_staging(front) == []
    log = (job.logs / "driver-1.log").read_text()
    restarts = re.findall(r"restarting the streaming query from its checkpoint \((\d+) of at most 5 in a row\)", log)
    assert restarts and restarts[0] == "1", "the query should have been restarted in the process"
    counted = re.search(r"repeats after transient faults in this run: statement (\d+), write (\d+), query (\d+)", log)
    assert counted is not None and int(counted.group(3)) == len(restarts) and int(counted.group(1)) >= 6


def sink_staging(front: ClickHouseFront) -> list[str]:
    target = ClickHouseTarget(front.url, database=JOB_DB)
    try:
        return target.staging_tables()
    finally:
        target.close()
