"""Where the writers of a micro-batch run: in Spark tasks (`mapInArrow`) or in the driver.

Network targets write from the tasks, one transaction per (table, task attempt), so the load is
as parallel as the batch. Embedded targets (chdb: one process per path) write from the driver,
one partition at a time, fed by `toLocalIterator` over Arrow IPC blobs: the driver holds at most
one partition, and rows never become Python objects.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from state import StateStore, open_store

from .routing import Router
from .targets.base import Target
from .writer import PartitionResult, PartitionWriter, WriteContext


def run_writers(
    df: DataFrame, target: Target, router: Router, context: WriteContext, store: StateStore
) -> list[PartitionResult]:
    if target.runs_writers_in_driver:
        return _write_in_driver(df, target, router, context, store)
    return _write_in_tasks(df, target, router, context, store.url)


def _write_in_tasks(df: DataFrame, target: Target, router: Router, context: WriteContext, store_url: str) -> list[PartitionResult]:
    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        store = open_store(store_url)
        try:
            writer = PartitionWriter(context, target, router, store, task.partitionId(), task.attemptNumber())
            result = writer.add_all(batches)
        finally:
            store.close()
            target.close()
        yield pa.RecordBatch.from_pylist([{"result": result.to_json()}])

    rows = df.mapInArrow(write_partition, "result string").collect()
    return _one_per_partition(PartitionResult.from_json(row["result"]) for row in rows)


_BLOB_SCHEMA = pa.schema([("partition", pa.int32()), ("ipc", pa.binary())])


def _write_in_driver(df: DataFrame, target: Target, router: Router, context: WriteContext, store: StateStore) -> list[PartitionResult]:
    def to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        for batch in batches:
            if batch.num_rows:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as stream:
                    stream.write_batch(batch)
                yield pa.RecordBatch.from_pylist(
                    [{"partition": partition, "ipc": sink.getvalue().to_pybytes()}], schema=_BLOB_SCHEMA
                )

    results: list[PartitionResult] = []
    writer: PartitionWriter | None = None
    current = -1
    blobs = df.mapInArrow(to_ipc, "partition int, ipc binary").toLocalIterator(prefetchPartitions=False)
    try:
        for row in blobs:
            if row["partition"] != current:
                if writer is not None:
                    results.append(writer.finish())
                current = row["partition"]
                writer = PartitionWriter(context, target, router, store, current)
            with pa.ipc.open_stream(row["ipc"]) as reader:
                for batch in reader:
                    writer.add(batch)
        if writer is not None:
            results.append(writer.finish())
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return results


def _one_per_partition(results) -> list[PartitionResult]:
    """Spark returns one successful attempt per partition; keep exactly one even if it did not."""
    chosen: dict[int, PartitionResult] = {}
    for result in results:
        chosen.setdefault(result.partition, result)
    return [chosen[p] for p in sorted(chosen)]
