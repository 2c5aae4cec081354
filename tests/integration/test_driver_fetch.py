"""The driver's two ways of reading a micro-batch (writers in the driver, chdb), on a real local Spark.

`stream` (the default) computes every partition at once and streams Arrow batches tagged with their partition;
`partitions` runs one job per partition with the next one prefetched. Both must hand the writers the very
batches a task writer sees, so the content checksums agree with each other and with the tasks' own digest
(`_task_digests`, what a prepared batch's replay was matched with before the stream existed): a PREPARED
batch keeps its replay whichever path wrote it.
"""
from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from streaming_sink import ExactlyOnceSink, execution
from streaming_sink import sink as sink_module
from streaming_sink.errors import InvariantBreach
from streaming_sink.execution import (
    PARTITION_COLUMN,
    WHOLE_BATCH,
    SparkWriterRunner,
    _arrow_stream,
    _ipc_partitions,
    _stream_digests,
    _task_digests,
    _write_per_partition,
)
from streaming_sink.routing import Router
from streaming_sink.state import BatchRecord, FileStateStore, MemoryStateStore
from streaming_sink.targets.clickhouse import ClickHouseTarget
from streaming_sink.targets.memory import MemoryTarget
from streaming_sink.writer import ContentChecksum, PartitionWriter, WriteContext, digested_per_batch
from tests.support.pipeline import create_tables, open_target, table_rows

DB = "analytics"
TYPES = (
    "id BIGINT, name STRING, amount DOUBLE, __table STRING, small INT, price DECIMAL(12,3), day DATE, at TIMESTAMP, "
    "raw BINARY, tags ARRAY<STRING>, attrs MAP<STRING,INT>, point STRUCT<x: DOUBLE, y: DOUBLE>, flag BOOLEAN"
)


def typed_frame(spark, n: int, partitions: int = 3):
    rows = [
        (i, f"n{i}" if i % 7 else None, i / 2, "orders" if i % 2 else "payments", i % 1000,
         decimal.Decimal(i) / 1000, dt.date(2026, 1, 1) + dt.timedelta(days=i % 300),
         dt.datetime(2026, 1, 1, 12, 0, 0) + dt.timedelta(seconds=i), bytes([i % 256]) * (i % 5),
         [f"t{i % 3}"] * (i % 3), {"k": i}, (i / 3, -i / 3), bool(i % 2))
        for i in range(n)
    ]
    return spark.createDataFrame(rows, TYPES).repartition(partitions, "small")


# several Arrow batches per partition, for the `spark` fixture (tests/support/fixtures.py)
pytestmark = pytest.mark.spark_conf({"spark.sql.execution.arrow.maxRecordsPerBatch": "700"})


def digests_of(pairs) -> dict[int, str]:
    checksums: dict[int, ContentChecksum] = {}
    for partition, batch in pairs:
        assert PARTITION_COLUMN not in batch.schema.names
        checksums.setdefault(partition, ContentChecksum()).update(batch)
    return {p: c.hexdigest() for p, c in checksums.items()}


def whole_batch_digest(pairs) -> str:
    """The checksum of one writer over every Arrow batch of every partition, fed in reverse order."""
    checksum = ContentChecksum()
    for _, batch in reversed(list(pairs)):
        checksum.update(batch, source=None)
    return checksum.hexdigest()


def test_both_driver_paths_hand_the_writers_what_a_task_sees(spark) -> None:
    df = typed_frame(spark, 5000)
    tasks = _task_digests(df)
    assert len(tasks) == 3 and sum(int(c.split(":")[0]) for c in tasks.values()) == 5000
    assert _stream_digests(df) == tasks
    assert digests_of(_ipc_partitions(df)) == tasks
    seen: list[int] = []
    for partition, _ in _arrow_stream(df):
        if not seen or seen[-1] != partition:
            seen.append(partition)
    assert sorted(seen) == sorted(set(seen)) == sorted(tasks)  # each partition's batches arrive together
    # untagged, the stream hands over the same Arrow batches, only without their partitions
    untagged = list(_arrow_stream(df, tagged=False))
    assert {p for p, _ in untagged} == {None}
    assert whole_batch_digest(untagged) == whole_batch_digest(_ipc_partitions(df)) == whole_batch_digest(_arrow_stream(df))
    assert len(untagged) > len(tasks)  # several batches a partition (maxRecordsPerBatch 700): each its own source


def test_a_partition_whose_batches_come_apart_is_refused_before_a_second_writer_begins(tmp_path) -> None:
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()), "name": ["a"], "amount": [1.0], "__table": ["orders"],
                                        "kafka_partition": pa.array([0], pa.int32()), "kafka_offset": pa.array([1], pa.int64())})
    create_tables(tmp_path / "ch", DB, ["orders"])
    store = FileStateStore(tmp_path / "state")
    with open_target(tmp_path / "ch", DB) as target:
        context = WriteContext("job", "q", 0, store.take_epoch("job", "t"), 0, 1 << 20)
        with pytest.raises(InvariantBreach, match="partition 0 did not arrive together"):
            _write_per_partition([(0, batch), (1, batch), (0, batch)], target, Router(None, None, "__table"), context, store, None)


@pytest.mark.parametrize("driver_fetch", ["stream", "partitions"])
def test_the_sink_loads_a_batch_exactly_through_either_path(spark, tmp_path, driver_fetch: str) -> None:
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    with open_target(tmp_path / "ch", DB) as target:
        sink = ExactlyOnceSink(target, FileStateStore(tmp_path / "state"), "job", table_column="__table",
                               runner=SparkWriterRunner(driver_fetch))
        df = typed_frame(spark, 3000).selectExpr(
            "id", "coalesce(name, 'none') AS name", "amount", "__table", "small AS kafka_partition", "id AS kafka_offset")
        report = sink.process(df, 0, "q")
        assert report.action == "written" and report.rows == 3000
        record = FileStateStore(tmp_path / "state").get_batch("job", "q", 0)
        # one writer for the batch: one transaction per table, and a checksum that ignores the partitions' order
        assert sorted(c.table for c in record.committables) == ["orders", "payments"]
        assert record.checksums == {WHOLE_BATCH: whole_batch_digest(_ipc_partitions(df))}
        assert [r[0] for r in table_rows(target, "orders")] == sorted(i for i in range(3000) if i % 2)
        assert [r[0] for r in table_rows(target, "payments")] == sorted(i for i in range(3000) if not i % 2)


def test_an_unknown_driver_fetch_is_refused() -> None:
    with pytest.raises(ValueError, match="driver_fetch 'all'"):
        SparkWriterRunner("all")


# -- replays of a batch whose staging table was lost: the re-run numbers the partitions differently --------------

SOURCE_SCHEMA = "id BIGINT, name STRING, amount DOUBLE, __table STRING, kafka_partition INT, kafka_offset BIGINT"
SOURCE = [[(p * 1000 + i, f"n{p}-{i}", i / 4, ("orders", "payments")[(i // 3 + p) % 2], p, i) for i in range(40)] for p in range(3)]


def kafka_frame(spark, order: list[int]):
    """The same three Kafka partitions as Spark partitions numbered in `order` (the Kafka source's re-run may do so)."""
    rows = [row for p in order for row in SOURCE[p]]
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, len(order)), SOURCE_SCHEMA)


class _Stop(Exception):
    """Raised at the commit point instead of a kill: the batch stays PREPARED."""


def prepare_then_lose_a_staging_table(spark, monkeypatch, target: ClickHouseTarget, store: FileStateStore) -> BatchRecord:
    def stop_at_commit_point(name: str, batch_id: int) -> None:
        if name == "after-prepared-record":
            raise _Stop(name)

    monkeypatch.setattr(sink_module, "crash_point", stop_at_commit_point)
    with pytest.raises(_Stop):
        ExactlyOnceSink(target, store, "job", table_column="__table").process(kafka_frame(spark, [0, 1, 2]), 0, "q")
    monkeypatch.undo()
    record = store.get_batch("job", "q", 0)
    target.client().command(f"DROP TABLE {DB}.`{record.committables[0].label}`")
    return record


def replay_renumbered_and_verify(spark, target: ClickHouseTarget, store: FileStateStore) -> None:
    report = ExactlyOnceSink(target, store, "job", table_column="__table").process(kafka_frame(spark, [2, 1, 0]), 0, "q")
    assert report.action == "recovered-prepared" and report.replayed == 1
    for table in ("orders", "payments"):
        assert table_rows(target, table) == sorted(r[:3] + r[4:] for part in SOURCE for r in part if r[3] == table)
    assert not target.staging_tables() and not store.intents("job", "q", 0)


def test_a_lost_part_is_replayed_by_the_one_driver_writer_from_renumbered_partitions(spark, tmp_path, monkeypatch) -> None:
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    store = FileStateStore(tmp_path / "state")
    with open_target(tmp_path / "ch", DB) as target:
        record = prepare_then_lose_a_staging_table(spark, monkeypatch, target, store)
        assert set(record.checksums) == {WHOLE_BATCH} and len(record.committables) == 2
        replay_renumbered_and_verify(spark, target, store)


def test_a_batch_prepared_one_writer_per_partition_is_replayed_per_partition(spark, tmp_path, monkeypatch) -> None:
    """As an older version prepared it: the replay matches the renumbered partitions by content."""
    monkeypatch.setattr(execution, "_digested_per_partition", lambda context: True)  # its stream was tagged
    monkeypatch.setattr(execution, "_write_in_driver", lambda batches, target, router, context, store:
                        _write_per_partition(batches, target, router, context, store, None))
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    store = FileStateStore(tmp_path / "state")
    with open_target(tmp_path / "ch", DB) as target:
        record = prepare_then_lose_a_staging_table(spark, monkeypatch, target, store)
        assert set(record.checksums) == {0, 1, 2} and len(record.committables) == 6
        replay_renumbered_and_verify(spark, target, store)


@pytest.mark.parametrize("driver_fetch", ["stream", "partitions"])
def test_a_batch_whose_checksum_took_each_partition_is_replayed_by_partition(spark, tmp_path, monkeypatch,
                                                                             driver_fetch: str) -> None:
    """As a version before the untagged stream prepared it (one driver writer, a digest per Spark partition, the
    checksum unmarked): its replay reads the batch tagged again and takes the renumbered partitions as sources."""
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    store = FileStateStore(tmp_path / "state")
    batch_rows = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    # three Arrow batches a partition: a digest per partition and one per batch differ in more than their mark
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    try:
        with open_target(tmp_path / "ch", DB) as target:
            with monkeypatch.context() as older:
                older.setattr(execution, "_digested_per_partition", lambda context: True)
                record = prepare_then_lose_a_staging_table(spark, monkeypatch, target, store)
            assert set(record.checksums) == {WHOLE_BATCH} and not digested_per_batch(record.checksums[WHOLE_BATCH])
            report = ExactlyOnceSink(target, store, "job", table_column="__table", runner=SparkWriterRunner(driver_fetch)
                                     ).process(kafka_frame(spark, [2, 1, 0]), 0, "q")
            assert report.action == "recovered-prepared" and report.replayed == 1
            for table in ("orders", "payments"):
                assert table_rows(target, table) == sorted(r[:3] + r[4:] for part in SOURCE for r in part if r[3] == table)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch_rows)


def test_flushes_of_a_writer_over_several_partitions_are_not_offered_for_a_partial_replay() -> None:
    """Their rows depend on the order the partitions arrived in, which a re-run changes: a replay that lost some
    of them must reload all or stop, never skip the flushes it believes committed."""
    def committables(sources: list[int]) -> list[tuple]:
        store = MemoryStateStore()
        context = WriteContext("job", "q", 0, store.take_epoch("job", "t"), 0, flush_bytes=1)
        writer = PartitionWriter(context, MemoryTarget(["t"], per_flush=True), Router(None, table="t"), store, WHOLE_BATCH)
        for source in sources:
            writer.add(pa.record_batch({"id": pa.array([source], pa.int64())}), source=source)
        return [(c.flush, c.flush_rows) for c in writer.finish().committables]

    assert committables([0, 0]) == [(0, 1), (1, 1)]
    assert committables([0, 1]) == [(None, None), (None, None)]
