"""Where the writers of a micro-batch run: in Spark tasks (`mapInArrow`) or in the driver.

Network targets write from the tasks, one transaction per (table, task attempt), so the load is
as parallel as the batch. Embedded targets (chdb: one process per path) write from the driver. By
default (`driver_fetch="stream"`) Spark computes every partition at once, on every core, and sends
each partition's Arrow batches to the driver as its task finishes (Spark's own Arrow collect): the
driver writes one partition while Spark computes the others,
the data crosses from the JVM to Python once, and the driver's Python side holds one Arrow batch
plus the writer's `flush_bytes`. The driver's JVM keeps the results the Python side has not read
yet: up to the whole micro-batch when the writes are slower than Spark (Spark's
`spark.driver.maxResultSize` bounds it, and fails the batch beyond). `driver_fetch="partitions"`
bounds the JVM to two partitions instead: one Spark job per partition over Arrow IPC blobs
(`toLocalIterator`, the next partition computed while the driver writes this one), at about half
the speed. Rows never become Python objects either way.

In the driver, one writer takes every partition of the batch (writer partition `WHOLE_BATCH`): one
transaction per table and batch, not one per table and Spark partition, so an embedded ClickHouse
batch of two tables makes two staging tables and two commits whatever the number of partitions.
Its checksum digests each Arrow batch and combines the digests sorted (`ContentChecksum`), so neither
the order in which partitions finish nor their numbers change it, and a replay needs no matching: the
re-run's one writer must produce the prepared checksum, or the sink stops. The batches come untagged:
a column naming each row's partition would cost Spark a copy of every row (33 ms of 191 a read of
50,000 of the bench's events, `python -m bench.driver_read`). A batch prepared by a version that digested
each partition instead is replayed with the tag, as it was written (`_digested_per_partition`).

A task's writer partition is identified by its content, not by Spark's partition number: a re-run
batch can number its input partitions differently (the Kafka source orders topic-partitions by how
it learned the offsets: from the broker on the first run, from the offset log on a re-run). So a
replay first digests every partition and writes each under the number of the prepared partition
with the same checksum (`_replay_identity`). The same holds in the driver for a batch prepared one
writer per partition (by a version before the whole-batch writer), replayed that way.

A batch with a plan (`WriteContext.plan`, `batch_plan.py`) that spreads or has several waves is first reduced to
the rows of the pass's wave, spread over the plan's writers in a fixed order (`spread.py`); the writers, and a
replay's digests, read that DataFrame. Without one, the batch's DataFrame goes to the writers as it is.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from .errors import ConfigurationError, InvariantBreach, StreamingSinkError
from .replay import PartitionIdentity, writer_partition
from .retry import count_repeats, repeats
from .routing import Router
from .spread import shapes_rows, wave_rows
from .state import StateStore
from .targets.base import Target
from .writer import ContentChecksum, PartitionResult, PartitionWriter, WriteContext, digested_per_batch

if TYPE_CHECKING:
    from pyspark import TaskContext
    from pyspark.sql import DataFrame

DRIVER_FETCHES = ("stream", "partitions")
#: The writer partition of the driver's one writer (in its labels and the batch record's checksums).
WHOLE_BATCH = 0


class SparkWriterRunner:
    """The sink's default runner: a micro-batch's DataFrame written by Spark tasks or by the driver.

    `driver_fetch` (writers in the driver only): "stream", every partition computed at once and streamed to
    the driver as Arrow; "partitions", one partition at a time with the next one prefetched (see the module).
    """

    def __init__(self, driver_fetch: str = "stream") -> None:
        if driver_fetch not in DRIVER_FETCHES:
            raise ConfigurationError(f"driver_fetch {driver_fetch!r}: one of {', '.join(DRIVER_FETCHES)}")
        self.driver_fetch = driver_fetch
        self._kept: list[DataFrame] = []  # what `keep` persisted for the running batch

    def run(
        self, df: DataFrame, target: Target, router: Router, context: WriteContext, store: StateStore
    ) -> list[PartitionResult]:
        if context.plan is not None and shapes_rows(context.plan):
            # the writers, and a replay's digests below, all read the wave's rows, spread and ordered
            df = wave_rows(df, router, context.plan, context.wave, spread=not target.runs_writers_in_driver)
        if target.runs_writers_in_driver:
            stream = self.driver_fetch == "stream" and _can_stream(df)
            if _prepared_per_partition(context):
                # the replay matches partitions by checksums digested from the very batches the writers see
                identity = _replay_identity(df, context, _stream_digests if stream else _task_digests)
                return _write_per_partition(_arrow_stream(df) if stream else _ipc_partitions(df), target, router,
                                            context, store, identity)
            tagged = _digested_per_partition(context)
            batches = _arrow_stream(df, tagged) if stream else _ipc_partitions(df, tagged)
            return _write_in_driver(batches, target, router, context, store)
        identity = _replay_identity(df, context, _task_digests)
        return _write_in_tasks(df, target, router, context, store, identity)

    def writer_count(self, df: DataFrame, target: Target) -> int:
        """How many writers the batch has without a plan: its partitions (in tasks), or one (in the driver)."""
        return 1 if target.runs_writers_in_driver else df.rdd.getNumPartitions()

    def table_rows(self, df: DataFrame, router: Router) -> dict[str, int]:
        """Rows per table in the batch (one Spark job): what its plan is made from (`batch_plan.py`). The batch is
        kept first (`keep`): this count reads the source, and the plan's waves read the copy."""
        self.keep(df)
        if router.table_column is None:
            return {str(router.table): df.count()}
        return {str(row[0]): int(row[1]) for row in df.groupBy(router.table_column).count().collect()}


    def keep(self, df: DataFrame) -> None:
        """Keep the batch's rows for the passes that follow (a planned batch reads its source once, not once per wave).
        Persisted in memory and on disk rather than `localCheckpoint`ed: a block an executor took with it when it died
        is computed again from the source (the same offsets: the same rows), where a local checkpoint's would fail
        the batch."""
        from pyspark import StorageLevel

        if not df.is_cached:
            df.persist(StorageLevel.MEMORY_AND_DISK)
            self._kept.append(df)

    def release(self) -> None:
        """Drop what `keep` kept (the batch is over, written or failed), whatever the sink made of the batch it was
        given before it was kept; nothing for a batch never kept."""
        while self._kept:
            self._kept.pop().unpersist()


def _task_context() -> TaskContext:
    """The running task's context. The functions that ask run only in Spark tasks, which always have one."""
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is None:
        raise InvariantBreach("no Spark TaskContext: the sink's task functions run only in Spark tasks")
    return task


_CHECKSUM_SCHEMA = pa.schema([("partition", pa.int32()), ("checksum", pa.string())])

Digests = Callable[["DataFrame"], dict[int, str]]  # Spark partition -> content checksum of the re-run batch


def _task_digests(df: DataFrame) -> dict[int, str]:
    """Each partition's checksum, computed in its task over the Arrow batches a task writer sees."""

    def digest(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        checksum = ContentChecksum()
        for batch in batches:
            checksum.update(batch)
        yield pa.RecordBatch.from_pylist(
            [{"partition": _task_context().partitionId(), "checksum": checksum.hexdigest()}], schema=_CHECKSUM_SCHEMA
        )

    return {row["partition"]: row["checksum"] for row in df.mapInArrow(digest, "partition int, checksum string").collect()}


def _stream_digests(df: DataFrame) -> dict[int, str]:
    """Each partition's checksum over the batches the driver's writers see when they are streamed."""
    checksums: dict[int, ContentChecksum] = {}
    for partition, batch in _arrow_stream(df):
        checksums.setdefault(_tag(partition), ContentChecksum()).update(batch)
    return {partition: checksum.hexdigest() for partition, checksum in checksums.items()}


def _replay_identity(df: DataFrame, context: WriteContext, digests: Digests) -> PartitionIdentity | None:
    """In a replay, match the re-run batch's partitions to the prepared ones by content checksum (one extra read)."""
    if context.replay is None or not context.replay.prepared_checksums:
        return None
    return context.replay.identity(digests(df))


def _write_in_tasks(
    df: DataFrame, target: Target, router: Router, context: WriteContext, store: StateStore, identity: PartitionIdentity | None
) -> list[PartitionResult]:
    from pyspark.errors import PythonException

    try:
        rows = df.mapInArrow(task_writer(target, router, context, store, identity), "result string, repeats long").collect()
    except PythonException as failure:
        own = sink_error_of(failure)
        if own is None:
            raise
        raise own from failure
    count_repeats("statement", sum(row["repeats"] for row in rows))  # the tasks' repeats, in the driver's metrics
    return _one_per_partition(PartitionResult.from_json(row["result"]) for row in rows)


# The line of a task's traceback that names one of the sink's own errors: "<module>.<Class>: <message>".
_SINK_ERROR_LINE = re.compile(r"^(streaming_sink(?:\.\w+)+)\.(\w+): (.*)$", re.MULTILINE)


def sink_error_of(failure: Exception) -> StreamingSinkError | None:
    """The sink's own error that ended a Spark task, as its own type with its message, so callers catch it by
    type whichever side wrote (Spark hands a task's error to the driver as text; the message is the line that names
    the error, the traceback stays in the `failure` it is raised from); None for any other error."""
    text = str(failure)
    found = None
    for found in _SINK_ERROR_LINE.finditer(text):  # noqa: B007 - the last match: the error the task died of
        pass
    if found is None:
        return None
    module, name, message = found.groups()
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(kind, type) and issubclass(kind, StreamingSinkError)):
        return None
    # Built from the message alone, whatever the constructor takes (FencedError takes three arguments): the
    # attributes the text does not carry read as their class-level unknowns (e.g. `maybe_applied` True).
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error


_RESULT_SCHEMA = pa.schema([("result", pa.string()), ("repeats", pa.int64())])


def task_writer(
    target: Target, router: Router, context: WriteContext, store: StateStore, identity: PartitionIdentity | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each Spark task runs: one PartitionWriter over the task's Arrow batches; its result carries the
    statements the task sent again (retry.py), which the driver adds to its own count.

    The store travels pickled (a Redis store with its private, unredacted URL) and reconnects in the task.
    """

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_context()
        before = repeats()["statement"]  # a Python worker runs one task at a time: what it repeats from here is ours
        try:
            partition = writer_partition(identity, task.partitionId())
            # taskAttemptId is unique in the application; attemptNumber repeats across stage attempts (R7)
            writer = PartitionWriter(context, target, router, store, partition, task.taskAttemptId())
            result = writer.add_all(batches)
        finally:
            store.close()
            target.close()
        yield pa.RecordBatch.from_pylist([{"result": result.to_json(), "repeats": repeats()["statement"] - before}],
                                         schema=_RESULT_SCHEMA)

    return write_partition


_BLOB_SCHEMA = pa.schema([("partition", pa.int32()), ("ipc", pa.binary())])

#: The column `_arrow_stream` adds to tag each batch with its Spark partition (dropped before any writer sees it).
PARTITION_COLUMN = "__streaming_sink_spark_partition"


def _can_stream(df: DataFrame) -> bool:
    """Spark's Arrow collect is reachable (a classic session, not Spark Connect) and the tag column is free."""
    return hasattr(getattr(df, "_jdf", None), "collectAsArrowToPython") and PARTITION_COLUMN not in df.columns


#: (Spark partition, Arrow batch) pairs as the driver reads a batch; the partition None when read untagged
Fetched = Iterable[tuple[int | None, pa.RecordBatch]]


def _tag(partition: int | None) -> int:
    """The partition of a batch read tagged: the writers per partition and their replay digests need it."""
    if partition is None:
        raise InvariantBreach("a batch read without its Spark partition reached a writer per partition")
    return partition


def _arrow_stream(df: DataFrame, tagged: bool = True) -> Iterator[tuple[int | None, pa.RecordBatch]]:
    """Every non-empty Arrow batch of the DataFrame with its Spark partition (None, untagged), as Spark's Arrow
    collect sends them.

    One job computes every partition at once; each finished partition's batches arrive together and in order,
    partitions in the order they finish (the batch order Spark sends last is not needed). `tagged`: each batch
    carries its partition in `PARTITION_COLUMN`, which costs Spark a projection (a copy) of every row; the driver's
    one writer does without (`ContentChecksum`). Batches are read one at a time, as the caller asks for them.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.util import _load_from_socket

    collected = df.withColumn(PARTITION_COLUMN, F.spark_partition_id()) if tagged else df
    port, secret, server = collected._jdf.collectAsArrowToPython()
    with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
        for item in stream:
            if not isinstance(item, pa.RecordBatch):
                continue  # the batch order, last: not needed
            if not item.num_rows:
                continue
            if tagged:
                yield item.column(item.num_columns - 1)[0].as_py(), item.drop_columns([PARTITION_COLUMN])
            else:
                yield None, item
    # The stream ended as it should (a failed job ends it with an error, raised above): join the serving thread,
    # which raises what it may have met after the last batch.
    from pyspark.errors.exceptions.captured import unwrap_spark_exception

    with unwrap_spark_exception():
        server.getResult()


def _ipc_partitions(df: DataFrame, tagged: bool = True) -> Iterator[tuple[int | None, pa.RecordBatch]]:
    """The same as `_arrow_stream` (`tagged` False: each batch's partition given as None), one Spark job per
    partition: tasks send their batches as Arrow IPC blobs, and Spark computes the next partition while the driver
    writes this one (`prefetchPartitions`: two partitions held)."""

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

    for row in df.mapInArrow(to_ipc, "partition int, ipc binary").toLocalIterator(prefetchPartitions=True):
        with pa.ipc.open_stream(row["ipc"]) as reader:
            for batch in reader:
                yield row["partition"] if tagged else None, batch


def _prepared_per_partition(context: WriteContext) -> bool:
    """A replay of a batch whose record has writer partitions other than `WHOLE_BATCH`: prepared one writer per
    Spark partition, so replayed that way (one partition alone reads the same either way: its own digest)."""
    replay = context.replay
    return replay is not None and any(partition != WHOLE_BATCH for partition in replay.prepared_partitions)


def _digested_per_partition(context: WriteContext) -> bool:
    """A replay of a batch whose one driver writer took each Spark partition as a source of its checksum (a version
    before it read its batches untagged), replayed that way; any other batch's checksum takes each Arrow batch."""
    replay = context.replay
    return replay is not None and any(not digested_per_batch(c) for c in replay.prepared_checksums.values())


def _write_in_driver(
    batches: Fetched, target: Target, router: Router, context: WriteContext, store: StateStore,
) -> list[PartitionResult]:
    """One writer over every (partition, batch) pair of the batch, in any order: one transaction per table. Its
    checksum takes each partition as a source, or each Arrow batch where they came untagged (`_digested_per_partition`)."""
    writer = PartitionWriter(context, target, router, store, WHOLE_BATCH)
    try:
        for partition, batch in batches:
            writer.add(batch, source=partition)
        result = writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        _hang_up(batches)
    return [result] if result.rows else []


def _hang_up(batches: Fetched) -> None:
    """A stream left early hangs up on Spark instead of waiting to be collected."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _write_per_partition(
    batches: Fetched, target: Target, router: Router, context: WriteContext,
    store: StateStore, identity: PartitionIdentity | None,
) -> list[PartitionResult]:
    """One writer per Spark partition over (partition, batch) pairs in which each partition's batches come together."""
    results: list[PartitionResult] = []
    writer: PartitionWriter | None = None
    current: int | None = None
    written: set[int] = set()
    try:
        for tagged, batch in batches:
            partition = _tag(tagged)
            if partition != current:
                if partition in written:  # a second writer would begin the same labels again (I4): refuse
                    raise InvariantBreach(f"the batches of Spark partition {partition} did not arrive together")
                if writer is not None:
                    results.append(writer.finish())
                current = partition
                written.add(partition)
                writer = PartitionWriter(context, target, router, store, writer_partition(identity, partition))
            assert writer is not None
            writer.add(batch)
        if writer is not None:
            results.append(writer.finish())
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        _hang_up(batches)
    return _one_per_partition(results)


def _one_per_partition(results: Iterable[PartitionResult]) -> list[PartitionResult]:
    """Spark returns one successful attempt per partition; keep exactly one even if it did not."""
    chosen: dict[int, PartitionResult] = {}
    for result in results:
        chosen.setdefault(result.partition, result)
    return [chosen[p] for p in sorted(chosen)]
