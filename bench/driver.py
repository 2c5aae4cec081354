"""One bench driver: a fresh process and Spark (local[2]) running one mode over the topic until it is drained.

`python -m bench.driver SPEC.json` prints one line `BENCH_RESULT {...}`: when the query started and ended,
the batches Spark reported, and for the sink's modes the phase timings of every batch. The orchestrator
(`python -m bench`) starts one of these per mode so no mode inherits another's warm JVM, caches or chdb engine.

Modes (what each measures):
  noop                Spark's own `noop` sink: the read and parse, the yardstick
  toarrow             foreachBatch that only calls `toArrow()`: the cost of getting a batch into Python
  tasks-arrow         foreachBatch whose Spark tasks only read their Arrow batches in Python workers
                      (`mapInArrow`, a count back): the floor of any Python writer in tasks
  alo-chdb-hand       toArrow() + insert_arrow per table into chdb, what a user would write by hand
  alo-chdb-sink       the sink's own writers and runner into chdb, committed without the journal (bench.baseline)
  eo-chdb-file        ExactlyOnceSink -> chdb, file state store
  eo-chdb-redis       ExactlyOnceSink -> chdb, Redis state store
  alo-null-starrocks  the sink's writers in tasks -> null server (StarRocks protocol), no journal
  eo-null-starrocks   ExactlyOnceSink, writers in tasks -> null server (StarRocks protocol), file store
  eo-null-spread-starrocks  eo-null-starrocks with every batch planned and spread (`streaming_sink/spread.py`), forced:
                      the cost of counting a batch's tables, the shuffle and the sort, on a topic that needs none
  alo-null-doris / eo-null-doris: the same with the Doris protocol (CSV bodies)
  eo-null-doris-arrow eo-null-doris with format "arrow": Arrow IPC bodies, column types from the null server's `_schema`
"""
from __future__ import annotations

import cProfile
import datetime
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TABLES = ("orders", "payments")
DATABASE = "bench"
#: The events' fields (about 200 bytes of JSON each); `table` routes a row and is not written.
SCHEMA = ("id BIGINT, `table` STRING, user_id BIGINT, name STRING, amount DOUBLE, currency STRING, "
          "country STRING, status STRING, created_at STRING, note STRING")
CH_DDL = ("CREATE TABLE IF NOT EXISTS {db}.{table} (id Int64, user_id Int64, name String, amount Float64, currency String, "
          "country String, status String, created_at String, note String) ENGINE = MergeTree ORDER BY id")
MODES = ("noop", "toarrow", "tasks-arrow", "alo-chdb-hand", "alo-chdb-sink", "eo-chdb-file", "eo-chdb-redis",
         "alo-null-starrocks", "eo-null-starrocks", "alo-null-doris", "eo-null-doris", "eo-null-doris-arrow",
         "eo-null-spread-starrocks")


def _epoch(timestamp: str) -> float:
    """A StreamingQueryProgress timestamp (`2026-01-02T03:04:05.678Z`) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _target(spec: dict[str, Any]) -> Any:
    mode = spec["mode"]
    if "chdb" in mode:
        from streaming_sink.targets.clickhouse import ClickHouseTarget

        return ClickHouseTarget(f"chdb://{spec['chdb_path']}", database=DATABASE)
    if mode.endswith("starrocks"):
        from streaming_sink.targets.starrocks import StarRocksTarget

        return StarRocksTarget(spec["null_url"], database=DATABASE, user="bench", password="", tables=list(TABLES))
    from streaming_sink.targets.doris import DorisTarget

    fmt = "arrow" if mode.endswith("-arrow") else "csv"
    return DorisTarget(spec["null_url"], database=DATABASE, user="bench", password="", tables=list(TABLES), format=fmt)


def _create_chdb_tables(target: Any) -> None:
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    for table in TABLES:
        client.command(CH_DDL.format(db=DATABASE, table=table))


def _hand_written(target: Any) -> Callable[[Any, int], None]:
    """At-least-once as a user writes it: the batch into Python as Arrow, one insert per table."""
    import pyarrow.compute as pc

    client = target.client()

    def write(df: Any, batch_id: int) -> None:
        data = df.toArrow()
        if data.num_rows == 0:
            return
        routes = data.column("table")
        rest = data.drop_columns(["table"])
        for table in pc.unique(routes).to_pylist():
            client.insert_arrow(table, rest.filter(pc.equal(routes, table)), database=DATABASE)

    return write


def _tasks_read_arrow(df: Any, batch_id: int) -> None:
    """Each task hands its partition to a Python worker as Arrow batches, which only counts them: Spark's part of
    writers in tasks (scheduling, the Kafka read and parse, the JVM -> Python handoff) with no writer at all."""
    import pyarrow as pa

    def count(batches: Iterator[Any]) -> Iterator[Any]:
        yield pa.RecordBatch.from_pylist([{"rows": sum(batch.num_rows for batch in batches)}])

    df.mapInArrow(count, "rows long").collect()


def _profile_tasks(directory: str) -> None:
    """Wrap the sink's task function so each task dumps a cProfile of its writer (read by the orchestrator)."""
    from streaming_sink import execution

    original = execution.task_writer

    def profiled_task_writer(*args: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
        inner = original(*args)

        def write_partition(batches: Iterator[Any]) -> Iterator[Any]:
            profile = cProfile.Profile()
            profile.enable()
            try:
                results = list(inner(batches))
            finally:
                profile.disable()
                profile.dump_stats(os.path.join(directory, f"task-{os.getpid()}-{uuid.uuid4().hex[:8]}.prof"))
            yield from results

        return write_partition

    execution.task_writer = profiled_task_writer


def _batch_function(spec: dict[str, Any], reports: list[dict[str, Any]]) -> Callable[[Any, int], None] | None:
    """The foreachBatch callable of the mode (None: the noop sink)."""
    mode = spec["mode"]
    if mode == "noop":
        return None
    if mode == "toarrow":
        return lambda df, batch_id: df.toArrow() and None
    if mode == "tasks-arrow":
        return _tasks_read_arrow
    target = _target(spec)
    if "chdb" in mode:
        _create_chdb_tables(target)
    if mode == "alo-chdb-hand":
        return _hand_written(target)
    if mode.startswith("alo-"):
        from bench.baseline import AtLeastOnceWriter

        return AtLeastOnceWriter(target, "table", reports.append)
    from streaming_sink import ExactlyOnceSink
    from streaming_sink.state import open_store

    def report(batch: Any) -> None:
        reports.append({"batch_id": batch.batch_id, "action": batch.action, "rows": batch.rows,
                        "transactions": batch.transactions, **(batch.timings or {})})

    runner = _spread_every_batch() if "spread" in mode else None
    return ExactlyOnceSink(target, open_store(spec["state_url"]), job_id=f"bench-{Path(spec['checkpoint']).name}",
                           table_column="table",
                           checkpoint_location=spec["checkpoint"], listeners=[report], runner=runner)


def _spread_every_batch() -> Any:
    """The Spark runner with every batch planned and spread, as the sink plans a batch that needs it: its rows counted
    per table (`table_rows`, one Spark job), `plan_batch` over the batch's writers, no budget."""
    import dataclasses

    from streaming_sink.batch_plan import plan_batch
    from streaming_sink.execution import SparkWriterRunner

    class SpreadEveryBatch(SparkWriterRunner):
        def run(self, df: Any, target: Any, router: Any, context: Any, store: Any) -> Any:
            plan = plan_batch(self.table_rows(df, router), self.writer_count(df, target), None, spread=True)
            return super().run(df, target, router, dataclasses.replace(context, plan=plan), store)

    return SpreadEveryBatch()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from tests.support.services.spark import local_spark_session

    spark = local_spark_session(f"bench-{spec['mode']}", {"spark.sql.streaming.numRecentProgressUpdates": "1000"})
    spark.sparkContext.setLogLevel("ERROR")
    reports: list[dict[str, Any]] = []
    function = _batch_function(spec, reports)
    profile = cProfile.Profile() if spec.get("profile_dir") else None
    if profile is not None and function is not None:
        _profile_tasks(spec["profile_dir"])
        inner = function

        def function(df: Any, batch_id: int) -> None:
            profile.enable()
            try:
                inner(df, batch_id)
            finally:
                profile.disable()

    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", spec["bootstrap"]).option("subscribe", spec["topic"])
              .option("startingOffsets", spec.get("starting_offsets", "earliest"))
              .option("maxOffsetsPerTrigger", str(spec["max_offsets"])).option("failOnDataLoss", "true").load())
    events = source.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e")).select("e.*")
    writer = events.writeStream.option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True)
    writer = writer.format("noop") if function is None else writer.foreachBatch(function)
    started = time.time()
    query = writer.start()
    query.awaitTermination()
    ended = time.time()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    if profile is not None:
        profile.dump_stats(os.path.join(spec["profile_dir"], "driver.prof"))
    first = progress[0] if progress else None
    result = {
        "mode": spec["mode"],
        "started": started,
        "ended": ended,
        "seconds": ended - started,
        "rows": sum(int(p["numInputRows"]) for p in progress),
        "batches": len(progress),
        "first_batch_done": _epoch(first["timestamp"]) + first["durationMs"]["triggerExecution"] / 1000 if first else None,
        "add_batch_s": sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000,
        "trigger_s": sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000,
        "phases": reports,
        "driver_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    spark.stop()
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = run(spec)
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
