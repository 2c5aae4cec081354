"""The coordinator on a real local Spark and chdb, in this process: fencing, routing errors, I6, I7."""
from __future__ import annotations

import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink.records import BatchState
from streaming_sink.routing import UnknownTableError
from streaming_sink.state import FencedError, FileStateStore
from tests.support.pipeline import create_tables, open_target, table_rows

DB = "analytics"
SCHEMA = "id BIGINT, name STRING, amount DOUBLE, __table STRING, kafka_partition INT, kafka_offset BIGINT"


@pytest.fixture
def target(tmp_path):
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    with open_target(tmp_path / "ch", DB) as t:
        yield t


def frame(spark, n: int, table_of=lambda i: "orders" if i % 2 else "payments", partitions: int = 3):
    rows = [(i, f"n{i}", i / 2, table_of(i), i % partitions, i) for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA).repartition(partitions, "kafka_partition")


def make_sink(target, tmp_path, job_id="job") -> ExactlyOnceSink:
    return ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job_id, table_column="__table")


def expected(n, table):
    return sorted((i, f"n{i}", i / 2, i % 3, i) for i in range(n) if (table == "orders") == bool(i % 2))


def test_second_driver_fences_the_first(spark, target, tmp_path):
    first, second = make_sink(target, tmp_path), make_sink(target, tmp_path)
    first.start()
    second.start()
    with pytest.raises(FencedError, match=f"holds fencing epoch {first.epoch}, but epoch {second.epoch}"):
        first.process(frame(spark, 30), 0, "q")
    assert table_rows(target, "orders") == [] and target.staging_tables() == []
    second.process(frame(spark, 30), 0, "q")
    assert table_rows(target, "orders") == expected(30, "orders")
    assert table_rows(target, "payments") == expected(30, "payments")


def test_rerunning_a_committed_batch_changes_nothing(spark, target, tmp_path):
    sink = make_sink(target, tmp_path)
    assert sink.process(frame(spark, 40), 0, "q").action == "written"
    assert sink.process(frame(spark, 40), 0, "q").action == "already-committed"
    restarted = make_sink(target, tmp_path)
    assert restarted.process(frame(spark, 40), 0, "q").action == "already-committed"
    assert table_rows(target, "orders") == expected(40, "orders")


def test_empty_batch_begins_no_transaction(spark, target, tmp_path):
    sink = make_sink(target, tmp_path)
    report = sink.process(frame(spark, 0), 0, "q")
    assert report.action == "empty" and report.transactions == 0
    store = FileStateStore(tmp_path / "state")
    record = store.get_batch("job", "q", 0)
    assert record.state is BatchState.COMMITTED and record.committables == []
    assert target.staging_tables() == []


def test_empty_table_in_a_batch_begins_no_transaction(spark, target, tmp_path):
    sink = make_sink(target, tmp_path)
    report = sink.process(frame(spark, 30, table_of=lambda i: "orders"), 0, "q")
    committables = FileStateStore(tmp_path / "state").get_batch("job", "q", 0).committables
    assert {c.table for c in committables} == {"orders"}
    assert report.transactions == len(committables) == 1  # the driver's one writer: one transaction per table


def test_unknown_table_fails_and_leaves_nothing_behind(spark, target, tmp_path):
    sink = make_sink(target, tmp_path)
    bad = frame(spark, 30, table_of=lambda i: "nope" if i == 29 else "orders")
    with pytest.raises(UnknownTableError, match="'nope'"):
        sink.process(bad, 0, "q")
    store = FileStateStore(tmp_path / "state")
    assert store.intents("job", "q", 0) == [] and store.get_batch("job", "q", 0) is None
    assert target.staging_tables() == [] and table_rows(target, "orders") == []


def test_configuration_errors_fail_at_start(target, tmp_path):
    with pytest.raises(ValueError, match="exactly one of table"):
        ExactlyOnceSink(target=target, state=FileStateStore(tmp_path), job_id="j")
    with pytest.raises(ValueError, match="job_id"):
        ExactlyOnceSink(target=target, state=FileStateStore(tmp_path), job_id="bad id!", table="orders")
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path), job_id="j", table="missing")
    with pytest.raises(ValueError, match="'missing' is not a table"):
        sink.start()
