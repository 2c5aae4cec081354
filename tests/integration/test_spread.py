"""A batch plan honoured by the Spark runner (`spread.py`, issue 26): each table's rows reach at most the plan's
writers, every row lands once, the same batch spreads the same on every run, and a lost part replays exactly.

Real local Spark (`local[2]`), writers in its tasks, against the StarRocks and Doris emulators over HTTP. The sink
does not plan batches yet on this branch, so `PlannedRunner` hands the runner a plan, as the sink will.
"""
from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink.batch_plan import BatchPlan, plan_batch
from streaming_sink.execution import WHOLE_BATCH, SparkWriterRunner
from streaming_sink.labels import wave_partition
from streaming_sink.routing import Router
from streaming_sink.spread import partition_keys, spark_hash_int, wave_rows
from streaming_sink.state import FileStateStore
from streaming_sink.targets.memory import MemoryTarget
from streaming_sink.writer import PartitionResult, WriteContext
from tests.support.targets.starrocks import starrocks_target

pytestmark = [pytest.mark.slow, pytest.mark.spark_conf({"spark.sql.execution.arrow.maxRecordsPerBatch": "50"})]

DB, JOB, QUERY = "db", "job", "q"
COLUMNS = [("id", "INT"), ("name", "VARCHAR(32)")]
TABLES = [f"t{i:02d}" for i in range(50)]
BIG = ("t00", "t01")  # most of the rows: spread over several writers; the other 48 tables get one each


def source_rows() -> list[tuple[int, str, str]]:
    """~50 tables of very different sizes: two big ones and 48 small ones."""
    rows = []
    for index, table in enumerate(TABLES):
        count = 1500 if table in BIG else 5 + index
        rows += [(index * 10_000 + i, f"n{i}", table) for i in range(count)]
    return rows


def frame(spark: Any, rows: list[tuple[int, str, str]], partitions: int = 4) -> Any:
    """The batch over `partitions` Spark partitions, in the order `rows` lists them."""
    return spark.createDataFrame(rows, "id int, name string, __table string").repartition(partitions)


def plan_of(rows: list[tuple[int, str, str]], writers: int = 4, budget: int | None = None) -> BatchPlan:
    return plan_batch(Counter(table for _, _, table in rows), writers, budget, spread=True)


class PlannedRunner(SparkWriterRunner):
    """The Spark runner, given `plan` for every pass (the sink will set `WriteContext.plan` itself). `store` (when
    given) goes to the writers instead of the sink's, so the sink's can be a driver-only crash wrapper."""

    def __init__(self, plan: BatchPlan, store: Any = None) -> None:
        super().__init__()
        self.plan, self.store = plan, store

    def run(self, df: Any, target: Any, router: Router, context: WriteContext, store: Any) -> list[PartitionResult]:
        return super().run(df, target, router, dataclasses.replace(context, plan=self.plan),
                           self.store if self.store is not None else store)


def emulator_with_tables(emulator: Any) -> Any:
    emulator.create_database(DB)
    for table in TABLES:
        emulator.create_table(DB, table, COLUMNS)
    return emulator


def visible(emulator: Any) -> list[tuple[int, str, str]]:
    return sorted((row[0], row[1], table) for table in TABLES for row in emulator.visible_rows(DB, table))


def test_spark_hash_partitioning_places_each_slot_key_in_its_own_partition(spark) -> None:
    from pyspark.sql import functions as F

    hashed = spark.range(0, 3000).select(F.hash(F.col("id").cast("int")).alias("h")).collect()
    assert [row.h for row in hashed] == [spark_hash_int(i) for i in range(3000)]
    for partitions in (1, 7, 64):
        keys = partition_keys(partitions)
        placed = spark.createDataFrame([(k,) for k in keys], "k int").repartition(partitions, "k")
        assert sorted(placed.select("k", F.spark_partition_id().alias("p")).collect()) == sorted(
            (k, p) for p, k in enumerate(keys))


def test_a_spread_batch_of_fifty_tables_holds_at_most_the_planned_transactions_and_lands_exactly(
    spark, starrocks_emulator, tmp_path
) -> None:
    sr = emulator_with_tables(starrocks_emulator(columns=None))
    rows = source_rows()
    plan = plan_of(rows)
    assert all(plan.writers[t] > 1 for t in BIG) and all(plan.writers[t] == 1 for t in TABLES if t not in BIG)
    store = FileStateStore(tmp_path / "state")
    sink = ExactlyOnceSink(starrocks_target(sr, DB), store, JOB, table_column="__table", flush_bytes=4096,
                           runner=PlannedRunner(plan))
    report = sink.process(frame(spark, rows), 0, QUERY)
    assert report.records_in == len(rows)

    committables = store.get_batch(JOB, QUERY, 0).committables
    partitions: dict[str, set[int]] = {}
    for committable in committables:
        partitions.setdefault(committable.table, set()).add(committable.partition)
    assert sorted(partitions) == TABLES
    for table, seen in partitions.items():
        assert len(seen) <= plan.writers[table], (table, seen, plan.writers[table])
    assert all(len(partitions[t]) == plan.writers[t] for t in BIG)  # slots map one to one onto partitions
    assert len({(c.table, c.partition) for c in committables}) <= plan.transactions(0)
    assert visible(sr) == sorted(rows)


def flushes_and_checksums(spark: Any, target: Any, store: Any, rows: Any, plan: BatchPlan, batch: int) -> Any:
    """Each writer partition's checksum and rows, and every flush (table, partition, flush, rows) it made."""
    epoch = store.take_epoch(JOB, "test")
    context = WriteContext(JOB, QUERY, batch, epoch=epoch, write_pass=0, flush_bytes=4096, plan=plan)
    router = Router(None, table_column="__table")
    results = SparkWriterRunner().run(frame(spark, rows), target, router, context, store)
    for result in results:  # the emulator, like Doris, caps running transactions (100): end this run's
        for committable in result.committables:
            target.abort(committable.ref())
    checksums = {r.partition: (r.checksum, r.rows) for r in results}
    flushes = sorted((c.table, c.partition, c.flush, c.flush_rows) for r in results for c in r.committables)
    return checksums, flushes


class TaskMemoryTarget(MemoryTarget):
    """The memory target with its writers in Spark tasks, as a network target's: each task writes into its own copy,
    and only the committables it returns, which name each flush, are read here."""

    @property
    def runs_writers_in_driver(self) -> bool:
        return False

    def __reduce__(self) -> tuple[Any, ...]:  # a task gets an empty copy: nothing is committed in this test
        return TaskMemoryTarget, (None, self.database, self.per_flush)


def test_the_same_batch_spreads_the_same_rows_in_the_same_order_whatever_its_input_partitions(spark, tmp_path) -> None:
    rows = source_rows()
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    plan = plan_of(rows)
    target = TaskMemoryTarget(per_flush=True)  # a transaction per flush, so each names its flush and rows
    store = FileStateStore(tmp_path / "state")
    first = flushes_and_checksums(spark, target, store, rows, plan, batch=0)
    again = flushes_and_checksums(spark, target, store, shuffled, plan, batch=1)
    checksums, flushes = first
    assert len(checksums) == min(plan.transactions(0), plan.partitions)
    assert sum(rows for _, rows in checksums.values()) == len(rows)
    assert all(flush is not None for _, _, flush, _ in flushes)
    assert max(flush for _, _, flush, _ in flushes) > 0  # several flushes per writer: their boundaries are compared
    assert again == first


def test_a_lost_part_of_a_spread_batch_is_replayed_from_the_re_run_and_ends_exact(
    spark, starrocks_emulator, tmp_path
) -> None:
    sr = emulator_with_tables(starrocks_emulator(columns=None))
    rows = source_rows()
    plan = plan_of(rows)
    store = FileStateStore(tmp_path / "state")

    class Crash(BaseException):
        pass

    class CrashAfterCommitPoint:
        """The driver killed right after the PREPARED record is written (the writers use the real store)."""

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(store, name)
            if name != "put_batch":
                return attribute

            def put_batch(job_id: str, epoch: int, record: Any) -> Any:
                result = attribute(job_id, epoch, record)
                if record.state.value == "PREPARED":
                    raise Crash
                return result

            return put_batch

    with pytest.raises(Crash):
        ExactlyOnceSink(starrocks_target(sr, DB), CrashAfterCommitPoint(), JOB, table_column="__table",
                        flush_bytes=4096, runner=PlannedRunner(plan, store)).process(frame(spark, rows), 0, QUERY)
    record = store.get_batch(JOB, QUERY, 0)
    assert record.sent == [] and visible(sr) == []
    # the server loses a part of the big table and a small table's only part: aborted before any commit was sent
    lost = [c for c in record.committables if c.table == BIG[0]][:1] + [
        c for c in record.committables if c.table == "t30"]
    target = starrocks_target(sr, DB)
    for committable in lost:
        target.abort(committable.ref())

    # the re-run batch arrives split otherwise (its Spark partitions numbered and filled differently)
    shuffled = rows[:]
    random.Random(11).shuffle(shuffled)
    report = ExactlyOnceSink(starrocks_target(sr, DB), store, JOB, table_column="__table", flush_bytes=4096,
                             runner=PlannedRunner(plan)).process(frame(spark, shuffled, partitions=3), 0, QUERY)
    assert report.action == "recovered-prepared" and report.replayed == len(lost)
    assert visible(sr) == sorted(rows)


def test_without_a_plan_or_with_one_unspread_wave_the_writers_get_the_batch_untouched(spark) -> None:
    df = frame(spark, [row for row in source_rows() if row[2] in ("t00", "t01", "t02")])
    one_wave = BatchPlan({"t00": 4}, (("t00",),), spread=False)
    router = Router(None, table_column="__table")
    assert wave_rows(df, router, one_wave, 0) is df
    two_waves = BatchPlan({"t00": 4, "t01": 4}, (("t00",), ("t01",)), spread=False)
    second = wave_rows(df, router, two_waves, 1)
    assert second.rdd.getNumPartitions() == df.rdd.getNumPartitions()  # filtered in place, no shuffle
    # a table no wave names goes to the last wave, as the writers' rule says: never dropped by a filter
    assert {row["__table"] for row in wave_rows(df, router, two_waves, 0).collect()} == {"t00"}
    assert {row["__table"] for row in second.collect()} == {"t01", "t02"}


@pytest.mark.extended  # CI: spread batches in local Spark (above) and writers in a standalone cluster's tasks (test_spark_cluster.py)
def test_spread_writers_in_tasks_on_two_executors_of_a_standalone_cluster_end_exact(
    starrocks_emulator, redis_server, tmp_path
) -> None:
    from tests.support.pipeline import REPO
    from tests.support.services.ports import free_port
    from tests.support.services.spark_cluster import WORKER_HOSTS, standalone_cluster

    sr = emulator_with_tables(starrocks_emulator(columns=None))
    rows = source_rows()
    plan = plan_of(rows)
    with standalone_cluster(tmp_path / "cluster") as master:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"master": master, "ui_port": free_port(), "fe_url": sr.fe_url,
                                    "password": sr.password, "redis_url": redis_server.url}))
        done = subprocess.run([sys.executable, "-m", "tests.integration.spread_on_cluster", str(spec)], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SPREAD_RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("SPREAD_RESULT "))
    assert result["records_in"] == len(rows)
    partitions: dict[str, set[int]] = {}
    for committable in result["committables"]:
        partitions.setdefault(committable["table"], set()).add(committable["partition"])
    assert all(len(seen) <= plan.writers[table] for table, seen in partitions.items())
    assert {c["host"] for c in result["committables"]} == set(WORKER_HOSTS)  # writers ran on both executors
    assert visible(sr) == sorted(rows)


def test_writers_in_the_driver_get_only_their_wave_and_are_not_spread(spark) -> None:
    from streaming_sink.state import MemoryStateStore
    from streaming_sink.targets.memory import MemoryTarget

    rows = [row for row in source_rows() if row[2] in ("t00", "t01", "t02")]
    plan = BatchPlan({"t00": 2, "t01": 2, "t02": 1}, (("t00",), ("t01", "t02")), spread=True)
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "test")
    context = WriteContext(JOB, QUERY, 0, epoch=epoch, write_pass=0, flush_bytes=4096, plan=plan, wave=1)
    results = SparkWriterRunner().run(frame(spark, rows), MemoryTarget(), Router(None, table_column="__table"),
                                      context, store)
    # one writer in the driver, whatever the plan's spread: WHOLE_BATCH, numbered for its wave
    assert [r.partition for r in results] == [wave_partition(1, WHOLE_BATCH)]
    assert results[0].rows == sum(1 for row in rows if row[2] in ("t01", "t02"))
    assert {c.table for c in results[0].committables} == {"t01", "t02"}


def test_a_spread_hashes_every_column_type_and_keeps_every_row_once(spark) -> None:
    from tests.integration.test_driver_fetch import typed_frame

    df = typed_frame(spark, 3000, partitions=3)  # maps, structs, arrays, binary, decimals, dates, nulls
    plan = plan_batch({"orders": 1500, "payments": 1500}, 3, None, spread=True)
    spread = wave_rows(df, Router(None, table_column="__table"), plan, 0)
    assert spread.columns == df.columns
    assert spread.rdd.getNumPartitions() == min(plan.transactions(0), plan.partitions)
    assert sorted(map(repr, spread.collect())) == sorted(map(repr, df.collect()))
