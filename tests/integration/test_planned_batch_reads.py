"""A planned batch (counted, spread, in waves) reads its source once: the count reads it and keeps the rows
(`SparkWriterRunner.keep`), every wave reads the copy, and the copy goes when the batch ends, written or failed. A
batch that needs no plan keeps nothing. Real local Spark, writers in its tasks, the StarRocks emulator limited to 10
running transactions so the batch's 6 tables commit in waves; the source counts the rows it computes."""
from __future__ import annotations

from typing import Any

import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink.execution import SparkWriterRunner
from streaming_sink.state import FileStateStore
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

pytestmark = pytest.mark.slow

DB, JOB, QUERY = "db", "reads", "q"
ROWS, TABLES = 600, [f"t{n}" for n in range(6)]


@pytest.fixture
def starrocks(tmp_path):
    with StarRocksEmulator(tmp_path / "sr", max_running_txn_num_per_db=10) as emu:
        emu.create_database(DB)
        for table in TABLES:
            emu.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
        yield emu


def counted_source(spark: Any, tables: list[str]) -> tuple[Any, Any]:
    """The batch, and how many rows its source computed so far (a Python UDF counts them, in Spark's tasks)."""
    from pyspark.sql import functions as F

    computed = spark.sparkContext.accumulator(0)

    def table_of(row_id: int) -> str:
        computed.add(1)
        return tables[row_id % len(tables)]

    route = F.udf(table_of, "string")
    df = spark.range(0, ROWS, 1, 4).select(F.col("id").cast("int").alias("id"), F.lit("n").alias("name"),
                                          route("id").alias("__table"))
    return df, computed


def sink_of(emu: StarRocksEmulator, tmp_path, runner: SparkWriterRunner) -> ExactlyOnceSink:
    target = StarRocksTarget(emu.fe_url, DB, "root", "", backoff_s=0.0, max_running_txn_num_per_db=10)
    return ExactlyOnceSink(target, FileStateStore(tmp_path / "state"), JOB, table_column="__table", runner=runner,
                           heartbeat_seconds=None)


def exact(emu: StarRocksEmulator, tables: list[str]) -> bool:
    expected = sorted((n, "n", tables[n % len(tables)]) for n in range(ROWS))
    return sorted((row[0], row[1], table) for table in TABLES for row in emu.visible_rows(DB, table)) == expected


def test_a_batch_in_waves_reads_its_source_once_and_lets_the_copy_go(spark_session, starrocks, tmp_path):
    from pyspark import StorageLevel

    df, computed = counted_source(spark_session, TABLES)
    report = sink_of(starrocks, tmp_path, SparkWriterRunner()).process(df, 0, QUERY)
    assert report.waves > 1, report
    assert computed.value == ROWS, f"the source computed {computed.value} rows for a batch of {ROWS} in {report.waves} waves"
    assert df.storageLevel == StorageLevel.NONE
    assert exact(starrocks, TABLES)


def test_a_batch_without_a_plan_keeps_nothing(spark_session, starrocks, tmp_path, monkeypatch):
    from pyspark.sql import DataFrame

    kept: list[Any] = []
    monkeypatch.setattr(DataFrame, "persist", lambda self, *args: kept.append(self) or self)
    df, computed = counted_source(spark_session, TABLES[:1])
    sink = sink_of(starrocks, tmp_path, SparkWriterRunner())
    sink.expect_tables(TABLES[:1])  # one table x 4 writers: within the budget, nothing to plan
    report = sink.process(df, 0, QUERY)
    assert (report.waves, kept, computed.value) == (1, [], ROWS)
    assert exact(starrocks, TABLES[:1])


class FailsInWave(SparkWriterRunner):
    """The Spark runner, failing once when it is asked for `wave` (a task lost for good, say); what the batch held then."""

    def __init__(self, wave: int) -> None:
        super().__init__()
        self.wave, self.held_at_failure = wave, None

    def run(self, df: Any, target: Any, router: Any, context: Any, store: Any) -> Any:
        if context.wave == self.wave and self.held_at_failure is None:
            self.held_at_failure = df.storageLevel
            raise RuntimeError("a writer failed for good")
        return super().run(df, target, router, context, store)


def test_a_batch_that_fails_in_a_wave_lets_the_copy_go_and_its_rerun_is_exact(spark_session, starrocks, tmp_path):
    from pyspark import StorageLevel

    runner = FailsInWave(1)
    df, _ = counted_source(spark_session, TABLES)
    with pytest.raises(RuntimeError, match="failed for good"):
        sink_of(starrocks, tmp_path, runner).process(df, 0, QUERY)
    assert runner.held_at_failure == StorageLevel.MEMORY_AND_DISK
    assert df.storageLevel == StorageLevel.NONE
    # Spark runs the batch again (a new driver): wave 0 is recorded and committed, the rest written from the re-run
    rerun, computed = counted_source(spark_session, TABLES)
    report = sink_of(starrocks, tmp_path, SparkWriterRunner()).process(rerun, 0, QUERY)
    assert report.action == "recovered-prepared"
    assert computed.value == ROWS
    assert rerun.storageLevel == StorageLevel.NONE
    assert exact(starrocks, TABLES)
