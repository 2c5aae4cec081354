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

from streaming_sink.state import FileStateStore
from streaming_sink import ExactlyOnceSink
from streaming_sink.execution import (
    PARTITION_COLUMN, SparkWriterRunner, _arrow_stream, _ipc_partitions, _stream_digests, _task_digests, _write_in_driver,
)
from streaming_sink.errors import InvariantBreach
from streaming_sink.routing import Router
from streaming_sink.writer import ContentChecksum, WriteContext
from devstack.pipeline import create_tables, open_target, table_rows

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


@pytest.fixture
def spark(spark_session):
    previous = spark_session.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark_session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "700")  # several batches per partition
    yield spark_session
    spark_session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)


def digests_of(pairs) -> dict[int, str]:
    checksums: dict[int, ContentChecksum] = {}
    for partition, batch in pairs:
        assert PARTITION_COLUMN not in batch.schema.names
        checksums.setdefault(partition, ContentChecksum()).update(batch)
    return {p: c.hexdigest() for p, c in checksums.items()}


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


def test_a_partition_whose_batches_come_apart_is_refused_before_a_second_writer_begins(tmp_path) -> None:
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()), "name": ["a"], "amount": [1.0], "__table": ["orders"],
                                        "kafka_partition": pa.array([0], pa.int32()), "kafka_offset": pa.array([1], pa.int64())})
    create_tables(tmp_path / "ch", DB, ["orders"])
    store = FileStateStore(tmp_path / "state")
    with open_target(tmp_path / "ch", DB) as target:
        context = WriteContext("job", "q", 0, store.take_epoch("job", "t"), 0, 1 << 20)
        with pytest.raises(InvariantBreach, match="partition 0 did not arrive together"):
            _write_in_driver([(0, batch), (1, batch), (0, batch)], target, Router(None, None, "__table"), context, store, None)


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
        assert record.checksums == _task_digests(df)  # what a replay matches partitions with
        assert [r[0] for r in table_rows(target, "orders")] == sorted(i for i in range(3000) if i % 2)
        assert [r[0] for r in table_rows(target, "payments")] == sorted(i for i in range(3000) if not i % 2)


def test_an_unknown_driver_fetch_is_refused() -> None:
    with pytest.raises(ValueError, match="driver_fetch 'all'"):
        SparkWriterRunner("all")
