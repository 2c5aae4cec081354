"""The packaged job's parsing and routing: good rows to their tables, every bad one to the dead letters.

ClickHouse is reached both ways (the `clickhouse_url` fixture): embedded, writers in the driver, and over
HTTP through the test front, writers in Spark tasks."""
from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from streaming_sink.frame import build_frame, resolve_tables, table_slots
from streaming_sink.job_spec import JobSpec
from streaming_sink.routing import UnknownTableError
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore
from streaming_sink.targets.base import ConfigurationError

DB = "analytics"
SCHEMAS = {"orders": "id BIGINT NOT NULL, name STRING, amount DOUBLE", "payments": "id BIGINT NOT NULL, method STRING"}
KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
T0 = dt.datetime(2026, 1, 2, 3, 4, 5)

MESSAGES = [
    ({"table": "orders", "id": 1, "name": "a", "amount": 1.5}, None),
    ({"table": "payments", "id": 2, "method": "card"}, None),
    ({"table": "orders", "id": "not-a-number", "name": "b"},
     "not valid JSON for the schema of orders: field 'id' holds not-a-number, which does not parse as BIGINT"),
    ("{this is not json", "message has no 'table' field"),
    ({"table": "refunds", "id": 3}, "unknown table refunds"),
    ({"id": 4, "name": "no table"}, "message has no 'table' field"),
    ({"table": "payments", "method": "cash"}, "required field 'id' of payments is missing or null"),
    ({"table": "orders", "id": 5, "name": "c", "amount": None}, None),
]


def spec(tmp_path, target_url: str, dead_letters: str | None = "dead_letters") -> JobSpec:
    return JobSpec(
        job_id="dlq", bootstrap="unused", topics=["events"], target_url=target_url, database=DB,
        state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"), tables=SCHEMAS,
        table_field="table", dead_letter_table=dead_letters,
    )


@pytest.fixture
def target(clickhouse_target):
    client = clickhouse_target.client()
    client.command(f"CREATE TABLE {DB}.orders (id Int64, name Nullable(String), amount Nullable(Float64), "
                   "kafka_partition Int32, kafka_offset Int64) ENGINE = MergeTree ORDER BY id")
    client.command(f"CREATE TABLE {DB}.payments (id Int64, method Nullable(String), kafka_partition Int32, "
                   "kafka_offset Int64) ENGINE = MergeTree ORDER BY id")
    client.command(f"CREATE TABLE {DB}.dead_letters (raw_value Nullable(String), topic String, partition Int32, "
                   "offset Int64, kafka_timestamp DateTime64(6), reason String) ENGINE = MergeTree ORDER BY (topic, partition, offset)")
    return clickhouse_target


def kafka_frame(spark):
    rows = []
    for offset, (message, _) in enumerate(MESSAGES):
        raw = message if isinstance(message, str) else json.dumps(message)
        rows.append((bytearray(raw.encode()), "events", 0, offset, T0))
    return spark.createDataFrame(rows, KAFKA)


def run_batch(spark, target, tmp_path, job: JobSpec):
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table", dead_letter_table=job.dead_letter_table)
    sink.start()
    tables = resolve_tables(job, sink.known_tables)
    sink.route_by_slots(table_slots(job, tables))
    return sink.process(build_frame(kafka_frame(spark), job, tables), 0, "q")


def test_bad_messages_go_to_dead_letters_with_reasons_and_counts_reconcile(spark_session, target, tmp_path):
    report = run_batch(spark_session, target, tmp_path, spec(tmp_path, target.url))
    client = target.client()
    orders = client.query(f"SELECT id, name, amount, kafka_offset FROM {DB}.orders ORDER BY id").result_rows
    payments = client.query(f"SELECT id, method, kafka_offset FROM {DB}.payments ORDER BY id").result_rows
    dead = client.query(f"SELECT offset, reason, raw_value, topic, partition, kafka_timestamp FROM {DB}.dead_letters "
                        "ORDER BY offset").result_rows
    assert orders == [(1, "a", 1.5, 0), (5, "c", None, 7)]
    assert payments == [(2, "card", 1)]
    expected_dead = [(offset, reason) for offset, (_, reason) in enumerate(MESSAGES) if reason]
    assert [(o, r) for o, r, *_ in dead] == expected_dead
    raw_of = {offset: m if isinstance(m, str) else json.dumps(m) for offset, (m, _) in enumerate(MESSAGES)}
    assert all(raw == raw_of[o] and topic == "events" and p == 0 and ts.replace(tzinfo=None) == T0
               for o, _, raw, topic, p, ts in dead)
    assert report.records_in == len(MESSAGES) == report.rows == len(orders) + len(payments) + len(dead)
    assert report.dead_letters == len(dead) == 5
    assert report.rows_by_table == {"orders": 2, "payments": 1, "dead_letters": 5}


def test_without_a_dead_letter_table_a_bad_message_fails_the_batch_and_names_it(spark_session, target, tmp_path):
    from pyspark.errors import PythonException

    # writers in the driver raise the error itself; from Spark tasks it arrives as text, and the sink raises it again
    # as its own type, with the task's traceback as its cause
    with pytest.raises(UnknownTableError, match=r"^rows route to unknown table\(s\) .*bad message events/0@\d+: ") as failure:
        run_batch(spark_session, target, tmp_path, spec(tmp_path, target.url, dead_letters=None))
    assert target.embedded or isinstance(failure.value.__cause__, PythonException)
    # whichever partition a writer reads first names its first bad message, with that message's reason
    offset = int(re.search(r"events/0@(\d+): ", str(failure.value)).group(1))
    assert f"events/0@{offset}: {MESSAGES[offset][1]}; configure a dead-letter table" in str(failure.value)
    assert target.client().query(f"SELECT count() FROM {DB}.orders").result_rows == [(0,)]
    assert target.staging_tables() == []


def test_missing_table_is_a_configuration_error_naming_it(tmp_path):
    job = spec(tmp_path, "chdb:///unused")
    job.tables = dict(SCHEMAS, refunds="id BIGINT")
    with pytest.raises(ConfigurationError, match=r"\['refunds'\] do not exist in the target database 'analytics'"):
        resolve_tables(job, {"orders", "payments", "dead_letters"})



def test_table_order_does_not_depend_on_the_process(tmp_path):
    """The frame's layout feeds the replay checksum: it must be the same in every driver process."""
    job = spec(tmp_path, "chdb:///unused")
    job.tables = None
    job.schema = "id BIGINT"
    names = {f"t{i}" for i in range(20)}
    assert list(resolve_tables(job, names | {"dead_letters"})) == sorted(names)


def test_batch_figures_reach_the_metrics_endpoint(spark_session, target, tmp_path):
    import urllib.request

    from streaming_sink.metrics import BatchMetrics

    metrics = BatchMetrics("dlq")
    server = metrics.serve(0)
    try:
        job = spec(tmp_path, target.url)
        sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                               table_column="__table", dead_letter_table=job.dead_letter_table,
                               listeners=[metrics.record])
        sink.start()
        tables = resolve_tables(job, sink.known_tables)
        sink.route_by_slots(table_slots(job, tables))
        frame = build_frame(kafka_frame(spark_session), job, tables)
        sink.process(frame, 0, "q")
        sink.process(frame, 0, "q")  # re-run: already committed, counted as such, no rows twice
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10).read().decode()
    finally:
        metrics.close()
    assert 'streaming_sink_batches_total{action="written",job_id="dlq"} 1.0' in text
    assert 'streaming_sink_batches_total{action="already-committed",job_id="dlq"} 1.0' in text
    assert 'streaming_sink_rows_total{job_id="dlq",table="dead_letters"} 5.0' in text
    assert 'streaming_sink_records_in_total{job_id="dlq"} 8.0' in text
    assert 'streaming_sink_dead_letters_total{job_id="dlq"} 5.0' in text


def test_kafka_metadata_columns_a_user_chooses_arrive_as_the_records_carried_them(spark_session, tmp_path, clickhouse_target):
    from streaming_sink.frame import table_schemas

    job = JobSpec(job_id="meta", bootstrap="unused", topics=["a", "b"], target_url=clickhouse_target.url,
                  database=DB, state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"),
                  tables={"orders": "id BIGINT NOT NULL, name STRING"}, table="orders",
                  metadata_columns=["key", "timestamp", "topic", "offset", "partition"])
    job.validate()
    records = [(b"k-1", '{"id": 1, "name": "x"}', "a", 0, 7, T0),
               (None, '{"id": 2, "name": "y"}', "b", 3, 9, T0 + dt.timedelta(microseconds=1)),
               ("ключ-🔑".encode(), '{"id": 3}', "b", 1, 0, dt.datetime(1999, 12, 31, 23, 59, 59))]
    raw = spark_session.createDataFrame([(bytearray(k) if k else None, bytearray(v.encode()), *rest) for k, v, *rest in records],
                                        "key BINARY, " + KAFKA)
    target = clickhouse_target
    for table, schema in table_schemas(job, job.tables).items():
        target.create_table(table, schema)
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table")
    sink.start()
    tables = resolve_tables(job, sink.known_tables)
    sink.route_by_slots(table_slots(job, tables))
    sink.process(build_frame(raw, job, tables), 0, "q")
    rows = target.client().query(f"SELECT id, kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_key "
                                 f"FROM {DB}.orders ORDER BY id").result_rows
    assert [(i, t, p, o, ts.replace(tzinfo=None), k) for i, t, p, o, ts, k in rows] == [
        (1, "a", 0, 7, T0, "k-1"), (2, "b", 3, 9, T0 + dt.timedelta(microseconds=1), None),
        (3, "b", 1, 0, dt.datetime(1999, 12, 31, 23, 59, 59), "ключ-🔑")]


def test_a_schema_spark_cannot_parse_names_its_key(spark_session):
    from streaming_sink.frame import spark_schema

    with pytest.raises(ConfigurationError) as error:
        spark_schema("id BIGNT NOT NULL, name STRING", "tables.orders.schema")
    assert str(error.value).startswith("tables.orders.schema: 'id BIGNT NOT NULL, name STRING' is not Spark DDL: ")
    assert "\n" not in str(error.value)
