"""A sink whose target cannot list its tables (StarRocks, no `tables`, no `expect_tables`) writes a batch uncounted
while the tables it has committed fit the budget; a table it has not seen stops that pass in a Spark task before
anything is begun for it, and the batch is counted, planned and written again (issue 26). Real local Spark, writers
in its tasks, the StarRocks emulator with a budget of 10 transactions a wave (4 writers: two tables fit, three do not).
"""
from __future__ import annotations

from typing import Any

import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink import sink as sink_module
from streaming_sink.execution import SparkWriterRunner
from streaming_sink.routing import Router
from streaming_sink.state import FileStateStore
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

pytestmark = pytest.mark.slow

DB, JOB, QUERY = "db", "unplanned", "q"
TABLES = ["a", "b", "c"]
ROWS, WRITERS = 40, 4
#: the tables of each batch: c first comes in batch 2
BATCHES = [["a", "b"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c"]]
OPEN_STATES = {"PREPARE", "PREPARED", "PRECOMMITTED", "COMMITTED"}


@pytest.fixture
def starrocks(tmp_path):
    with StarRocksEmulator(tmp_path / "sr", max_running_txn_num_per_db=20) as emu:
        emu.create_database(DB)
        for table in TABLES:
            emu.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
        yield emu


class CountingRunner(SparkWriterRunner):
    """The Spark runner, counting the batches it counts (each a Spark job)."""

    counted = 0

    def table_rows(self, df: Any, router: Router) -> dict[str, int]:
        self.counted += 1
        return super().table_rows(df, router)


def frame(spark: Any, batch_id: int) -> Any:
    """Batch `batch_id`: ROWS rows over WRITERS partitions, every partition holding rows of each of its tables."""
    from pyspark.sql import functions as F

    tables = BATCHES[batch_id]
    route = F.element_at(F.array(*[F.lit(t) for t in tables]), (F.col("id") % len(tables) + 1).cast("int"))
    return spark.range(batch_id * 1000, batch_id * 1000 + ROWS, 1, WRITERS).select(
        F.col("id").cast("int").alias("id"), F.lit(f"b{batch_id}").alias("name"), route.alias("__table"))


def expected(table: str, batches: range) -> list[tuple[Any, ...]]:
    return sorted((b * 1000 + n, f"b{b}") for b in batches for n in range(ROWS)
                  if BATCHES[b][(b * 1000 + n) % len(BATCHES[b])] == table)


def sink_of(emu: StarRocksEmulator, tmp_path, runner: SparkWriterRunner) -> ExactlyOnceSink:
    target = StarRocksTarget(emu.fe_url, DB, "root", "", backoff_s=0.0, max_running_txn_num_per_db=20)
    return ExactlyOnceSink(target, FileStateStore(tmp_path / "state"), JOB, table_column="__table", runner=runner,
                           heartbeat_seconds=None)


def assert_exact(emu: StarRocksEmulator, batches: range) -> None:
    for table in TABLES:
        assert sorted(emu.visible_rows(DB, table)) == expected(table, batches), table
    assert not [t for t in emu.transactions(DB) if t["state"] in OPEN_STATES], "a transaction was left open"


def test_a_new_table_stops_the_uncounted_pass_before_its_transactions_and_the_batch_is_counted(
        spark_session, starrocks, tmp_path):
    runner = CountingRunner()
    sink = sink_of(starrocks, tmp_path, runner)
    counts = []
    for batch_id in range(len(BATCHES)):
        sink.process(frame(spark_session, batch_id), batch_id, QUERY)
        counts.append(runner.counted)
    # batch 0: nothing seen, counted; 1: a and b seen, 2 x 4 within 10, uncounted; 2: c stops the uncounted pass in
    # a task, then the batch is counted and planned; 3: three seen tables x 4 writers pass the budget, counted
    assert counts == [1, 1, 2, 3]
    assert_exact(starrocks, range(len(BATCHES)))
    # the uncounted pass of batch 2 stopped before it began anything for c: every transaction c ever had committed
    assert {t["state"] for t in starrocks.transactions(DB) if t["table"] == "c"} == {"VISIBLE"}


class Killed(BaseException):
    """The driver is gone: nothing after the crash point runs."""


def test_a_driver_killed_after_the_counted_pass_of_a_new_table_leaves_the_batch_exact_on_restart(
        spark_session, starrocks, tmp_path, monkeypatch):
    """Killed once batch 2's second pass (after its uncounted one stopped) is prepared and before its record; the next
    driver aborts both passes' leftovers, counts the batch (it has seen nothing) and writes it exactly once."""
    sink = sink_of(starrocks, tmp_path, CountingRunner())
    for batch_id in (0, 1):
        sink.process(frame(spark_session, batch_id), batch_id, QUERY)

    def kill(name: str, batch_id: int) -> None:
        if (name, batch_id) == ("after-writers-prepared", 2):
            raise Killed(name)

    monkeypatch.setattr(sink_module, "crash_point", kill)
    with pytest.raises(Killed):
        sink.process(frame(spark_session, 2), 2, QUERY)
    assert not [t for t in starrocks.transactions(DB) if t["table"] == "c" and t["state"] == "ABORTED"], \
        "the uncounted pass began a transaction for the new table"
    monkeypatch.undo()
    runner = CountingRunner()
    restarted = sink_of(starrocks, tmp_path, runner)
    for batch_id in (2, 3):
        restarted.process(frame(spark_session, batch_id), batch_id, QUERY)
    assert runner.counted == 2
    assert_exact(starrocks, range(len(BATCHES)))


def test_a_batch_without_partitions_is_empty_for_a_driver_that_has_seen_no_table(spark_session, starrocks, tmp_path):
    """A Kafka batch whose offset ranges are all empty has no Spark partition. A driver that had seen no table yet
    (just restarted) planned it for 0 writers and stopped the job (CI, test_change_stream_pipeline after a kill)."""
    empty = spark_session.createDataFrame(spark_session.sparkContext.emptyRDD(), frame(spark_session, 0).schema)
    assert empty.rdd.getNumPartitions() == 0
    sink = sink_of(starrocks, tmp_path, CountingRunner())
    assert sink.process(empty, 0, QUERY).action == "empty"
    sink.process(frame(spark_session, 1), 1, QUERY)
    assert_exact(starrocks, range(1, 2))
