"""Debezium change events into change rows (frame.py with `kafka.format = "debezium"`, issue 27 item 1): envelopes with
and without the converter's schema part, ops c, r, u and d, tombstones skipped and counted, malformed events to the
dead letters with the reason, and one change per key per batch reaching the writers (the sink's rule). Real local
Spark; the rows land in the in-memory target, which shows exactly what a target is handed."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from streaming_sink.changes import DELETE, UPSERT
from streaming_sink.frame import CHANGE_KEY_COLUMN, build_frame, table_schemas, table_slots
from streaming_sink.job_spec import JobSpec
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore
from streaming_sink.targets.memory import MemoryTarget

pytestmark = pytest.mark.slow

KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
SCHEMA = "id INT NOT NULL, name STRING"


def event(op: str, before: dict | None, after: dict | None, lsn: int | None = None, schema: bool = False) -> str:
    """A change event as Debezium's JSON converter writes it (the schema part abridged: the job never reads it)."""
    payload: dict[str, Any] = {"before": before, "after": after, "op": op, "ts_ms": 1,
                               "source": {"connector": "postgresql", "table": "customers", **({"lsn": lsn} if lsn else {})}}
    return json.dumps({"schema": {"type": "struct", "optional": False}, "payload": payload} if schema else payload)


def spec(tmp_path: Any, schema: str = SCHEMA, **changes: Any) -> JobSpec:
    job = JobSpec(job_id="cdc", bootstrap="unused", topics=["pg.public.customers"], target_url=f"chdb://{tmp_path}/ch",
                  database="db", state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"),
                  tables={"customers": schema}, topic_tables={"pg.public.customers": "customers"},
                  dead_letter_table="dead_letters", source_format="debezium", table_keys={"customers": ["id"]},
                  metadata_columns=False, **changes)
    job.validate()
    return job


def load(spark: Any, tmp_path: Any, job: JobSpec, messages: list[str | None], batch: int = 0,
         target: MemoryTarget | None = None, column_types: dict[str, str] | None = None) -> MemoryTarget:
    """The messages as one batch of the topic (offsets from 100), through the frame and the sink, as the job runs
    (`column_types`: the target table's, as the job reads them at start, for the value checks)."""
    target = target or MemoryTarget()
    records = [(None if text is None else bytearray(text.encode()), "pg.public.customers", 0, 100 + at,
                dt.datetime(2026, 1, 2)) for at, text in enumerate(messages)]
    frame = build_frame(spark.createDataFrame(records, KAFKA).repartition(3), job, job.tables or {},
                        column_types={"customers": column_types} if column_types else None, keys={"customers": ("id",)})
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table", table_slots=table_slots(job, job.tables or {}), dead_letter_table="dead_letters",
                           change_key=(CHANGE_KEY_COLUMN,))
    sink.process(frame, batch, "q")
    return target


def rows(target: MemoryTarget, table: str = "customers") -> list[tuple]:
    return sorted(tuple(row.values()) for row in target.rows(table))


@pytest.mark.parametrize("schema", [False, True], ids=["payload-only", "with-schema"])
def test_each_key_gets_its_latest_change_with_its_op_and_version(spark, tmp_path, schema):
    messages = [
        event("r", None, {"id": 1, "name": "snap"}, lsn=10, schema=schema),
        event("c", None, {"id": 2, "name": "new"}, lsn=20, schema=schema),
        event("u", {"id": 1, "name": "snap"}, {"id": 1, "name": "renamed"}, lsn=30, schema=schema),
        event("d", {"id": 2, "name": "new"}, None, lsn=40, schema=schema),
        None,  # the tombstone Debezium sends after the delete of 2
        event("c", None, {"id": 3, "name": "x"}, lsn=50, schema=schema),
        event("d", {"id": 3, "name": None}, None, lsn=60, schema=schema),
        event("c", None, {"id": 3, "name": "back"}, lsn=70, schema=schema),  # deleted and re-inserted in one batch
    ]
    target = load(spark, tmp_path, spec(tmp_path), messages)
    assert rows(target) == [(1, "renamed", UPSERT, 30), (2, "", DELETE, 40), (3, "back", UPSERT, 70)]
    assert target.rows("dead_letters") == []


def test_without_a_log_position_the_version_is_the_kafka_offset(spark, tmp_path):
    messages = [event("c", None, {"id": 1, "name": "a"}), event("u", {"id": 1, "name": "a"}, {"id": 1, "name": "b"})]
    assert rows(load(spark, tmp_path, spec(tmp_path), messages)) == [(1, "b", UPSERT, 101)]


def test_a_snapshot_row_and_a_change_at_the_same_log_position_keep_the_change(spark, tmp_path):
    """Debezium gives a PostgreSQL snapshot row and its key's first streamed change the same `source.lsn`: within a
    batch the later Kafka offset wins (the target resolves equal versions across batches by load order)."""
    messages = [text for key in range(20) for text in (event("r", None, {"id": key, "name": "snap"}, lsn=500 + key),
                                                        event("u", None, {"id": key, "name": "new"}, lsn=500 + key))]
    assert rows(load(spark, tmp_path, spec(tmp_path), messages)) == [(key, "new", UPSERT, 500 + key) for key in range(20)]


def test_a_delete_needs_only_its_key(spark, tmp_path):
    """With PostgreSQL's default replica identity a delete's `before` holds the key and NULLs: each other column gets
    its type's zero (the row goes by its key), never a dead letter; a change without its key is one."""
    job = spec(tmp_path, schema="id INT NOT NULL, name STRING NOT NULL, born DATE NOT NULL, score DOUBLE")
    messages = [event("d", {"id": 1, "name": None, "born": None, "score": None}, None, lsn=10),
                event("c", None, {"id": None, "name": "x", "born": "2000-01-01"}, lsn=11),
                event("u", None, {"id": 2, "name": None, "born": "2000-01-01"}, lsn=12)]
    target = load(spark, tmp_path, job, messages)
    assert rows(target) == [(1, "", dt.date(1970, 1, 1), 0.0, DELETE, 10)]
    assert sorted((r["offset"], r["reason"]) for r in target.rows("dead_letters")) == [
        (101, "required field 'id' of customers is missing or null"),
        (102, "required field 'name' of customers is missing or null")]


def test_a_delete_is_never_held_to_the_target_columns_it_does_not_set(spark, tmp_path):
    """The target's NOT NULL columns (read from the table at start) do not see a delete's NULLs: with PostgreSQL's
    default replica identity a delete carries its key alone, and a create and its delete in one batch end deleted.
    A full `before` image (REPLICA IDENTITY FULL) whose old values the column could not hold deletes the row too:
    a delete sets nothing but its key. Its key is still checked."""
    job = spec(tmp_path, schema="id INT NOT NULL, name STRING, active BOOLEAN NOT NULL, tiny INT")
    types = {"id": "Int32", "name": "String", "active": "Bool", "tiny": "Int8"}
    messages = [event("c", None, {"id": 1, "name": "a", "active": True, "tiny": 1}, lsn=10),
                event("d", {"id": 1, "name": None, "active": None, "tiny": None}, None, lsn=11),  # key-only before
                event("d", {"id": 2, "name": "b", "active": False, "tiny": 300}, None, lsn=12),  # a full before
                event("d", {"id": None, "name": "c", "active": True, "tiny": 1}, None, lsn=13),
                event("c", None, {"id": 4, "name": None, "active": None, "tiny": 1}, lsn=14)]
    target = load(spark, tmp_path, job, messages, column_types=types)
    assert rows(target) == [(1, "", False, 0, DELETE, 11), (2, "", False, 0, DELETE, 12)]
    assert sorted((r["offset"], r["reason"]) for r in target.rows("dead_letters")) == [
        (103, "required field 'id' of customers is missing or null"),
        (104, "required field 'active' of customers is missing or null")]


def test_a_table_with_a_map_column_keeps_one_change_per_key(spark, tmp_path):
    """Spark refuses to hash maps: the step that keeps one change per key hashes a row's content as text instead
    (reliability review N4: every batch of such a job failed)."""
    job = spec(tmp_path, schema="id INT NOT NULL, tags MAP<STRING, STRING>")
    messages = [event("c", None, {"id": 1, "tags": {"a": "1"}}, lsn=10),
                event("u", None, {"id": 1, "tags": {"a": "2", "b": "3"}}, lsn=11),
                event("c", None, {"id": 2, "tags": None}, lsn=12)]
    assert rows(load(spark, tmp_path, job, messages)) == [(1, [("a", "2"), ("b", "3")], UPSERT, 11), (2, None, UPSERT, 12)]


def test_debeziums_placeholder_for_an_unchanged_toasted_value_is_never_loaded(spark, tmp_path):
    """Without REPLICA IDENTITY FULL, Debezium's PostgreSQL connector sends an update whose large (TOASTed) column did
    not change with a placeholder instead of the value: loading it would overwrite the stored text. The update goes to
    the dead letters naming the column and the fix; the stored row stays as it was."""
    job = spec(tmp_path, schema="id INT NOT NULL, body STRING, blob BINARY, tags ARRAY<STRING>")
    placeholder = "__debezium_unavailable_value"
    encoded = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # the placeholder's bytes in base64, as a bytea carries it
    messages = [event("u", None, {"id": 1, "body": placeholder, "blob": None, "tags": None}, lsn=10),
                event("u", None, {"id": 2, "body": "x", "blob": encoded, "tags": None}, lsn=11),
                event("u", None, {"id": 3, "body": "x", "blob": None, "tags": [placeholder]}, lsn=12),
                event("u", None, {"id": 4, "body": "fine", "blob": None, "tags": ["a"]}, lsn=13),
                event("d", {"id": 5, "body": placeholder, "blob": None, "tags": None}, None, lsn=14)]
    target = load(spark, tmp_path, job, messages)
    assert rows(target) == [(4, "fine", None, ["a"], UPSERT, 13), (5, "", b"", [], DELETE, 14)]
    reasons = {row["offset"]: row["reason"] for row in target.rows("dead_letters")}
    assert sorted(reasons) == [100, 101, 102]
    for at, column in ((100, "body"), (101, "blob"), (102, "tags")):
        assert reasons[at].startswith(f"column {column!r} of customers holds Debezium's placeholder for an unchanged "
                                      "TOASTed value"), reasons[at]
        assert "REPLICA IDENTITY FULL" in reasons[at]


def test_malformed_events_are_dead_letters_with_the_reason(spark, tmp_path):
    messages = [
        '{"id": 1, "name": "a"}',  # a plain row, not an event
        event("t", None, None),  # a truncate
        event("d", None, None),  # a delete without its before
        "not json",
        event("c", None, {"id": 9, "name": "ok", "added": 1}),  # a field the schema lacks (on_unknown_field)
        event("c", None, {"id": 8, "name": "fine"}),
    ]
    target = load(spark, tmp_path, spec(tmp_path), messages)
    assert rows(target) == [(8, "fine", UPSERT, 105)]
    reasons = {row["offset"]: row["reason"] for row in target.rows("dead_letters")}
    assert reasons == {
        100: "not a Debezium change event: no `op` (in the message or its `payload`)",
        101: "Debezium op 't' is not a row change (the job loads c, r, u and d; a truncate or a message is not loaded)",
        102: "Debezium op 'd' carries no row (`after` for c, r, u; `before` for d)",
        103: "not a Debezium change event: no `op` (in the message or its `payload`)",
        104: 'field(s) not in the schema of customers: added (sink.on_unknown_field = "dead-letter")',
    }


def test_a_table_without_a_key_is_refused_before_any_data_moves(spark, tmp_path):
    job = spec(tmp_path)
    with pytest.raises(Exception, match=r"tables.customers.key: \['nope'\] must name fields of its schema \(id, name\)"):
        build_frame(spark.createDataFrame([], KAFKA), job, {"customers": SCHEMA}, keys={"customers": ("nope",)})


def test_the_tables_rows_carry_op_and_version(tmp_path, spark):
    schemas = table_schemas(spec(tmp_path), {"customers": SCHEMA})
    assert schemas["customers"].names == ["id", "name", "__op", "__version"]


def test_a_foreach_batch_pipeline_of_its_own_reads_events_with_the_same_functions(spark, tmp_path):
    """The sink's API: a user's own pipeline reads the events with streaming_sink.debezium and hands change rows to
    `ExactlyOnceSink(change_key=...)`, as docs/change-streams.md shows."""
    from pyspark.sql import functions as F

    from streaming_sink.debezium import change_op, change_row, change_version

    messages = [event("c", None, {"id": 1, "name": "a"}, lsn=5), event("u", None, {"id": 1, "name": "b"}, lsn=6),
                event("c", None, {"id": 2, "name": "c"}, lsn=7), event("d", {"id": 2, "name": None}, None, lsn=8)]
    kafka = spark.createDataFrame([(bytearray(m.encode()), "t", 0, at, dt.datetime(2026, 1, 2)) for at, m in enumerate(messages)],
                                  KAFKA).repartition(2)
    value = F.col("value").cast("string")
    changes = kafka.select(F.from_json(change_row(value), "id INT, name STRING").alias("row"), change_op(value).alias("__op"),
                           change_version(value).alias("__version")).select("row.*", "__op", "__version")
    target = MemoryTarget()
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="own", table="customers",
                           change_key=["id"])
    sink.process(changes, 0, "q")
    assert rows(target) == [(1, "b", UPSERT, 6), (2, None, DELETE, 8)]
