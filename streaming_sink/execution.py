"""Where the writers of a micro-batch run: in Spark tasks (`mapInArrow`) or in the driver.

Network targets write from the tasks, one transaction per (table, task attempt), so the load is
as parallel as the batch. Embedded targets (chdb: one process per path) write from the driver,
one partition at a time, fed by `toLocalIterator` over Arrow IPC blobs: the driver holds at most
one partition, and rows never become Python objects.

A writer partition is identified by its content, not by Spark's partition number: a re-run batch
can number its input partitions differently (the Kafka source orders topic-partitions by how it
learned the offsets: from the broker on the first run, from the offset log on a re-run). So a
replay first digests every partition and writes each under the number of the prepared partition
with the same checksum (`_replay_identity`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import pyarrow as pa

from state import StateStore

from .errors import InvariantBreach
from .routing import Router
from .targets.base import Target
from .writer import ContentChecksum, PartitionResult, PartitionWriter, WriteContext

if TYPE_CHECKING:
    from pyspark import TaskContext
    from pyspark.sql import DataFrame

Identity = dict[int, int]  # Spark partition number -> writer partition number


class SparkWriterRunner:
    """The sink's default runner: a micro-batch's DataFrame written by Spark tasks or by the driver."""

    def run(
        self, df: "DataFrame", target: Target, router: Router, context: WriteContext, store: StateStore
    ) -> list[PartitionResult]:
        identity = _replay_identity(df, context, store) if context.replay is not None else None
        if target.runs_writers_in_driver:
            return _write_in_driver(df, target, router, context, store, identity)
        return _write_in_tasks(df, target, router, context, store, identity)


def _task_context() -> "TaskContext":
    """The running task's context. The functions that ask run only in Spark tasks, which always have one."""
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is None:
        raise InvariantBreach("no Spark TaskContext: the sink's task functions run only in Spark tasks")
    return task


def _writer_partition(identity: Identity | None, spark_partition: int) -> int:
    """Without a replay, Spark's number. In a replay, the prepared partition with the same content;
    a partition whose content matches none gets a negative number, so it can neither be taken
    for a prepared one nor pass the sink's checksum check (which then fails loudly)."""
    if identity is None:
        return spark_partition
    return identity.get(spark_partition, -1 - spark_partition)


_CHECKSUM_SCHEMA = pa.schema([("partition", pa.int32()), ("checksum", pa.string())])


def _replay_identity(df: "DataFrame", context: WriteContext, store: StateStore) -> Identity | None:
    """Match the re-run batch's partitions to the prepared ones by content checksum (one extra read)."""
    record = store.get_batch(context.job_id, context.query_id, context.batch_id)
    if record is None or not record.checksums:
        return None

    def digest(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        checksum = ContentChecksum()
        for batch in batches:
            checksum.update(batch)
        yield pa.RecordBatch.from_pylist(
            [{"partition": _task_context().partitionId(), "checksum": checksum.hexdigest()}], schema=_CHECKSUM_SCHEMA
        )

    current = {row["partition"]: row["checksum"] for row in df.mapInArrow(digest, "partition int, checksum string").collect()}
    unclaimed: dict[str, list[int]] = {}
    for prepared_partition, checksum in sorted(record.checksums.items(), key=lambda item: int(item[0])):
        unclaimed.setdefault(checksum, []).append(int(prepared_partition))
    identity: Identity = {}
    for spark_partition in sorted(current):
        candidates = unclaimed.get(current[spark_partition])
        if candidates:
            identity[spark_partition] = candidates.pop(0)
    return identity


def _write_in_tasks(
    df: "DataFrame", target: Target, router: Router, context: WriteContext, store: StateStore, identity: Identity | None
) -> list[PartitionResult]:
    rows = df.mapInArrow(task_writer(target, router, context, store, identity), "result string").collect()
    return _one_per_partition(PartitionResult.from_json(row["result"]) for row in rows)


def task_writer(
    target: Target, router: Router, context: WriteContext, store: StateStore, identity: Identity | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each Spark task runs: one PartitionWriter over the task's Arrow batches.

    The store travels pickled (a Redis store with its private, unredacted URL) and reconnects in the task.
    """

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_context()
        try:
            partition = _writer_partition(identity, task.partitionId())
            # taskAttemptId is unique in the application; attemptNumber repeats across stage attempts (R7)
            writer = PartitionWriter(context, target, router, store, partition, task.taskAttemptId())
            result = writer.add_all(batches)
        finally:
            store.close()
            target.close()
        yield pa.RecordBatch.from_pylist([{"result": result.to_json()}])

    return write_partition


_BLOB_SCHEMA = pa.schema([("partition", pa.int32()), ("ipc", pa.binary())])


def _write_in_driver(
    df: "DataFrame", target: Target, router: Router, context: WriteContext, store: StateStore, identity: Identity | None
) -> list[PartitionResult]:
    def to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _task_context().partitionId()
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
            if writer is None or row["partition"] != current:  # the first row always opens a writer (no partition is -1)
                if writer is not None:
                    results.append(writer.finish())
                current = row["partition"]
                writer = PartitionWriter(context, target, router, store, _writer_partition(identity, current))
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


def _one_per_partition(results: Iterable[PartitionResult]) -> list[PartitionResult]:
    """Spark returns one successful attempt per partition; keep exactly one even if it did not."""
    chosen: dict[int, PartitionResult] = {}
    for result in results:
        chosen.setdefault(result.partition, result)
    return [chosen[p] for p in sorted(chosen)]
