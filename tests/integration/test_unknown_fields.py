"""A field the producer adds is never dropped in silence (issue 25, item 5): by default its message goes to the
dead letters with the fields named; "ignore" loads it without them and counts it; "fail" fails the batch."""
from __future__ import annotations

import datetime as dt

import pytest

from streaming_sink.errors import UnknownTableError
from streaming_sink.frame import build_frame, resolve_tables, table_schemas, table_slots
from streaming_sink.job_spec import JobSpec
from streaming_sink.metrics import BatchMetrics, progress_listener
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore

DB = "analytics"
KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
MESSAGES = [
    '{"table": "orders", "id": 1, "name": "a"}',  # the routing field is no unknown field
    '{"table": "orders", "id": 2, "name": "b", "coupon": "X", "Name": "B"}',  # case-sensitive, as Spark parses
    '{"table": "orders", "id": 3, "name": "c", "name": "c"}',  # a key given twice is still a known one
]
ADDED = 'field(s) not in the schema of orders: coupon, Name (sink.on_unknown_field = "{}")'


def job(tmp_path, target, action: str) -> JobSpec:
    spec = JobSpec(job_id="added", bootstrap="unused", topics=["events"], target_url=target.url, database=DB,
                   state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"),
                   tables={"orders": "id BIGINT NOT NULL, name STRING"}, table_field="table",
                   dead_letter_table="dead_letters", on_unknown_field=action)  # type: ignore[arg-type]
    spec.validate()
    for table, schema in table_schemas(spec, spec.tables or {}).items():
        target.create_table(table, schema)
    return spec


def records() -> list[tuple]:
    return [(bytearray(text.encode()), "events", 0, offset, dt.datetime(2026, 1, 2)) for offset, text in enumerate(MESSAGES)]


def sink_for(spec: JobSpec, target, tmp_path, listeners=()) -> ExactlyOnceSink:
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=spec.job_id,
                           table_column="__table", dead_letter_table=spec.dead_letter_table,
                           listeners=list(listeners))
    sink.start()
    sink.route_by_slots(table_slots(spec, resolve_tables(spec, sink.known_tables)))
    return sink


def table(target, sql: str) -> list[tuple]:
    return target.client().query(sql).result_rows


def test_by_default_a_message_with_an_added_field_is_a_dead_letter_naming_it(spark_session, clickhouse_target, tmp_path):
    spec = job(tmp_path, clickhouse_target, "dead-letter")
    sink = sink_for(spec, clickhouse_target, tmp_path)
    frame = build_frame(spark_session.createDataFrame(records(), KAFKA), spec, resolve_tables(spec, sink.known_tables))
    report = sink.process(frame, 0, "q")
    assert table(clickhouse_target, f"SELECT id, name FROM {DB}.orders ORDER BY id") == [(1, "a"), (3, "c")]
    assert table(clickhouse_target, f"SELECT offset, reason FROM {DB}.dead_letters") == [(1, ADDED.format("dead-letter"))]
    assert report.dead_letters == 1


def test_fail_stops_the_batch_naming_the_message_and_its_fields(spark_session, clickhouse_target, tmp_path):
    spec = job(tmp_path, clickhouse_target, "fail")
    sink = sink_for(spec, clickhouse_target, tmp_path)
    frame = build_frame(spark_session.createDataFrame(records(), KAFKA), spec, resolve_tables(spec, sink.known_tables))
    with pytest.raises(UnknownTableError, match=r"<bad message events/0@1: " + ADDED.format("fail").replace("(", r"\(")
                       .replace(")", r"\)") + ">"):
        sink.process(frame, 0, "q")
    assert table(clickhouse_target, f"SELECT count() FROM {DB}.orders") == [(0,)]


def test_ignore_loads_the_message_without_the_field_and_counts_it_in_the_metrics(spark_session, clickhouse_target, tmp_path):
    """Through a streaming query, as the job runs: the count reaches /metrics through Spark's observed metrics."""
    spec = job(tmp_path, clickhouse_target, "ignore")
    metrics = stream_with_metrics(spark_session, spec, clickhouse_target, tmp_path)
    assert table(clickhouse_target, f"SELECT id, name FROM {DB}.orders ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
    assert table(clickhouse_target, f"SELECT count() FROM {DB}.dead_letters") == [(0,)]
    assert 'streaming_sink_messages_with_unknown_fields_total{job_id="added",table="orders"} 1.0' in metrics.render()


def stream_with_metrics(spark_session, spec, clickhouse_target, tmp_path) -> BatchMetrics:
    """`records()` through the job's frame and sink in a streaming query (available-now), as the job runs them: the
    metrics returned hold what Spark's observed metrics told the driver."""
    source = tmp_path / "kafka"
    spark_session.createDataFrame(records(), KAFKA).write.parquet(str(source))
    metrics = BatchMetrics(spec.job_id)
    sink = sink_for(spec, clickhouse_target, tmp_path, [metrics])
    frame = build_frame(spark_session.readStream.schema(KAFKA).parquet(str(source)), spec,
                        resolve_tables(spec, sink.known_tables))
    listener = progress_listener(metrics, log_progress=False)
    spark_session.streams.addListener(listener)
    try:
        query = (frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
        listener.follow(query.id)
        query.awaitTermination()
        assert listener.wait_for_batch(int(query.lastProgress["batchId"]), timeout_s=30)
    finally:
        spark_session.streams.removeListener(listener)
    return metrics
