"""Column mapping and transforms per table (issue 25, item 4): `[tables.<name>] select` maps the message's fields and
the Kafka metadata columns to the table's columns; a row it cannot compute is a dead letter naming the column; a select
that cannot work is refused before any data moves, in one line naming the key."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest

from streaming_sink.errors import ConfigurationError
from streaming_sink.frame import build_frame, resolve_tables, table_projections, table_schemas, table_slots
from streaming_sink.job_spec import JobSpec
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore

DB = "analytics"
KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
TABLES = {"orders": "id BIGINT NOT NULL, name STRING, amount DOUBLE, code STRING, topic STRING",
          "payments": "id BIGINT NOT NULL, method STRING"}
SELECTS = {
    # `topic` is the message's own field: the Kafka record's is kafka_topic, a metadata column
    "orders": "id, upper(name) AS name, CAST(amount * 100 AS BIGINT) AS cents, CAST(code AS INT) AS code, "
              "concat(topic, '@', kafka_offset) AS origin",
    "payments": "*, coalesce(upper(method), 'NONE') AS shout",
}
MESSAGES = [
    '{"table": "orders", "id": 1, "name": "a", "amount": 1.5, "code": "7", "topic": "shop"}',
    '{"table": "orders", "id": 2, "name": "b", "amount": 2.0, "code": "x7", "topic": "shop"}',  # CAST raises (ANSI)
    '{"table": "payments", "id": 3, "method": "card"}',
    '{"table": "orders", "id": 4, "name": null, "amount": null, "code": null, "topic": null}',  # NULLs are no failure
]


def spec(tmp_path, target_url: str, selects=SELECTS) -> JobSpec:
    job = JobSpec(job_id="mapped", bootstrap="unused", topics=["events"], target_url=target_url, database=DB,
                  state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"), tables=dict(TABLES),
                  table_selects=dict(selects), table_field="table", dead_letter_table="dead_letters")
    job.validate()
    return job


def test_a_select_maps_and_transforms_columns_and_a_row_it_cannot_compute_is_a_dead_letter(
        spark_session, clickhouse_target, tmp_path):
    job = spec(tmp_path, clickhouse_target.url)
    schemas = table_schemas(job, job.tables or {})
    assert schemas["orders"].names == ["id", "name", "cents", "code", "origin"]
    assert schemas["payments"].names == ["id", "method", "kafka_partition", "kafka_offset", "shout"]
    for table, schema in schemas.items():
        clickhouse_target.create_table(table, schema)
    sink = ExactlyOnceSink(target=clickhouse_target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table", dead_letter_table=job.dead_letter_table)
    sink.start()
    raw = spark_session.createDataFrame(
        [(bytearray(m.encode()), "events", 0, offset, dt.datetime(2026, 1, 2)) for offset, m in enumerate(MESSAGES)], KAFKA)
    tables = resolve_tables(job, sink.known_tables)
    sink.route_by_slots(table_slots(job, tables))
    report = sink.process(build_frame(raw, job, tables), 0, "q")
    client = clickhouse_target.client()
    assert client.query(f"SELECT id, name, cents, code, origin FROM {DB}.orders ORDER BY id").result_rows == [
        (1, "A", 150, 7, "shop@0"), (4, None, None, None, None)]
    assert client.query(f"SELECT id, method, kafka_offset, shout FROM {DB}.payments").result_rows == [(3, "card", 2, "CARD")]
    assert client.query(f"SELECT offset, reason FROM {DB}.dead_letters").result_rows == [
        (1, "tables.orders.select: column 'code' could not be computed for this message (Spark raised an error "
            "evaluating it: a bad cast, an overflow, a division by zero...)")]
    assert report.dead_letters == 1 and report.records_in == 4


@pytest.mark.parametrize("select, says", [
    ("id, upper(name AS name", "PARSE_SYNTAX_ERROR"),
    ("id, nosuch + 1 AS n", "`nosuch` cannot be resolved"),
    ("id, kafka_key", "`kafka_key` cannot be resolved"),  # not among sink.metadata_columns
    ("id, rand() AS r", "column 'r' uses rand()"),
    ("id, current_timestamp() AS loaded_at", "column 'loaded_at' uses current_timestamp()"),
    ("id, uuid() AS u", "column 'u' uses uuid()"),
    ("count(*) AS n", "must give one row per message"),
    ("explode(array(id, id)) AS n", "must give one row per message"),
    ("id, name AS id", "names column(s) ['id'] more than once"),
    ("id, , name", "has an empty column"),
])
def test_a_select_that_cannot_work_is_refused_at_start_naming_the_key(spark_session, tmp_path, select, says):
    job = spec(tmp_path, "chdb:///unused", {"orders": select})
    with pytest.raises(ConfigurationError) as error:
        table_projections(job, job.tables or {})
    message = str(error.value)
    assert message.startswith("tables.orders.select: ") and says in message and "\n" not in message, message


def test_the_command_refuses_a_bad_select_in_one_line_before_reading_kafka(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('job_id = "shop"\n[kafka]\nbootstrap_servers = "127.0.0.1:1"\ntopics = ["orders"]\n'
                   '[routing]\ntable = "orders"\n[tables.orders]\nschema = "id BIGINT"\nselect = "id, idd + 1 AS next"\n')
    result = subprocess.run([sys.executable, "-m", "streaming_sink.cli", "run", "--config", str(job)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stderr
    assert last.startswith("streaming-sink: configuration error: tables.orders.select: 'id, idd + 1 AS next': "), last
    assert "`idd` cannot be resolved" in last and "Traceback" not in result.stderr


def test_the_selects_output_is_what_the_value_checks_hold_to_the_tables_columns(spark_session, clickhouse_target, tmp_path):
    from streaming_sink.frame import check_columns
    from streaming_sink.targets import descriptor_for

    job = spec(tmp_path, clickhouse_target.url, {"orders": "id, CAST(amount * 100 AS BIGINT) AS cents"})
    job.tables = {"orders": TABLES["orders"]}
    client = clickhouse_target.client()
    client.command(f"CREATE TABLE {DB}.orders (id Int64, cents Int16) ENGINE = MergeTree ORDER BY id")
    client.command(f"CREATE TABLE {DB}.dead_letters (raw_value Nullable(String), topic String, partition Int32, "
                   "offset Int64, kafka_timestamp DateTime64(6), reason String) ENGINE = MergeTree ORDER BY offset")
    sink = ExactlyOnceSink(target=clickhouse_target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table", dead_letter_table=job.dead_letter_table)
    sink.start()
    tables = resolve_tables(job, sink.known_tables)
    sink.route_by_slots(table_slots(job, tables))
    types = check_columns(clickhouse_target, descriptor_for(job.target_url).columns, table_schemas(job, tables))
    messages = ['{"table": "orders", "id": 1, "amount": 1.5}', '{"table": "orders", "id": 2, "amount": 400}']
    raw = spark_session.createDataFrame(
        [(bytearray(m.encode()), "events", 0, offset, dt.datetime(2026, 1, 2)) for offset, m in enumerate(messages)], KAFKA)
    sink.process(build_frame(raw, job, tables, types), 0, "q")
    assert client.query(f"SELECT id, cents FROM {DB}.orders").result_rows == [(1, 150)]
    [(offset, reason)] = client.query(f"SELECT offset, reason FROM {DB}.dead_letters").result_rows
    assert offset == 1 and reason.startswith("column 'cents' of orders (Int16): integer out of range"), reason
