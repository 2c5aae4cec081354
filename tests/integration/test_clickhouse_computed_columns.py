"""A ClickHouse table's computed columns are no fields of its messages: a whole-database job (routing.topic_table)
takes a table's fields from its columns, and MATERIALIZED, ALIAS and EPHEMERAL columns are ones an INSERT of stored
rows cannot (or need not) set. Taken as fields, a NOT NULL one made every message of the table a dead letter
("required field ... is missing"), and a value sent for one would be refused by ClickHouse."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink.config import resolve_config
from streaming_sink.state import MemoryStateStore
from streaming_sink.target_tables import job_tables
from tests.support.batches import InMemoryRunner
from tests.support.pipeline import open_target


def whole_database_job(tmp_path: Path) -> Any:
    """A job that takes its tables' fields from the embedded ClickHouse's tables (routing.topic_table)."""
    return resolve_config({
        "job_id": "wd", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"},
        "target": {"url": f"chdb://{tmp_path / 'ch'}", "database": "default"}}, tmp_path)


DDL = ("id Int64, name String, loaded_at DateTime MATERIALIZED toDateTime('2026-01-02 03:04:05', 'UTC'), "
       "upper_name String ALIAS upper(name), raw String EPHEMERAL, kafka_partition Int32, kafka_offset Int64")


def test_a_derived_tables_fields_leave_out_its_computed_columns_and_its_rows_load(tmp_path: Path) -> None:
    spec = whole_database_job(tmp_path)
    with open_target(tmp_path / "ch", "default") as target:
        target.client().command(f"CREATE TABLE default.orders ({DDL}) ENGINE = MergeTree ORDER BY id")
        resolved = job_tables(spec, target, target.routable_tables(), ["pg.public.orders"])
        assert resolved.tables == {"orders": "`id` BIGINT NOT NULL, `name` STRING NOT NULL"}, resolved
        assert target.table_columns("orders") == {"id": "Int64", "name": "String", "kafka_partition": "Int32",
                                                  "kafka_offset": "Int64"}

        rows = pa.record_batch({"id": [1, 2], "name": ["a", "b"], "kafka_partition": pa.array([0, 0], pa.int32()),
                                "kafka_offset": [7, 8]})
        sink = ExactlyOnceSink(target, MemoryStateStore(), "wd", table="orders", runner=InMemoryRunner(),
                               heartbeat_seconds=None)
        assert sink.process([[rows]], 0, "q").action == "written"
        assert target.client().query("SELECT id, name, upper_name, toString(loaded_at) FROM default.orders ORDER BY id"
                                     ).result_rows == [(1, "a", "A", "2026-01-02 03:04:05"), (2, "b", "B", "2026-01-02 03:04:05")]


DEFAULTS_DDL = ("id Int64, n UInt32 DEFAULT 7, tag String DEFAULT concat('t', toString(id)), kept String, "
                "kafka_partition Int32, kafka_offset Int64")


def test_a_derived_tables_default_columns_are_optional_and_a_row_without_them_takes_the_expression(tmp_path: Path) -> None:
    """A column with a DEFAULT expression (`ingested_at DateTime DEFAULT now()` is common) was a required field of a
    whole-database table, so every message without it was a dead letter, and a NULL sent for it was refused as one that
    would land as the type's default. ClickHouse fills a DEFAULT column's expression in for a NULL, row by row."""
    spec = whole_database_job(tmp_path)
    with open_target(tmp_path / "ch", "default") as target:
        target.client().command(f"CREATE TABLE default.items ({DEFAULTS_DDL}) ENGINE = MergeTree ORDER BY id")
        resolved = job_tables(spec, target, target.routable_tables(), ["pg.public.items"])
        assert resolved.tables == {"items": "`id` BIGINT NOT NULL, `n` BIGINT, `tag` STRING, `kept` STRING NOT NULL"}
        assert target.table_columns("items") == {"id": "Int64", "n": "UInt32 DEFAULT", "tag": "String DEFAULT",
                                                 "kept": "String", "kafka_partition": "Int32", "kafka_offset": "Int64"}

        rows = pa.record_batch({"id": [1, 2, 3], "n": pa.array([None, 5, None], pa.int64()), "tag": [None, "b", None],
                                "kept": ["x", "y", "z"], "kafka_partition": pa.array([0, 0, 0], pa.int32()),
                                "kafka_offset": [7, 8, 9]})
        sink = ExactlyOnceSink(target, MemoryStateStore(), "wd", table="items", runner=InMemoryRunner(),
                               heartbeat_seconds=None)
        assert sink.process([[rows]], 0, "q").action == "written"
        assert target.client().query("SELECT id, n, tag, kept FROM default.items ORDER BY id").result_rows == [
            (1, 7, "t1", "x"), (2, 5, "b", "y"), (3, 7, "t3", "z")]
        # a column without a DEFAULT expression still refuses a NULL: it would land as ''
        nulls = rows.set_column(3, "kept", pa.array(["x", None, "z"]))
        with pytest.raises(Exception, match="column 'kept' of default.items has NULLs"):
            sink.process([[nulls]], 1, "q")


def test_a_message_may_leave_a_default_column_out_and_its_values_are_still_checked(tmp_path: Path, spark_session) -> None:
    """The frame of a derived table: a message without the DEFAULT column (or with null) is a row, not a dead letter;
    a value the column cannot hold is still one, naming the column as the target spells it."""
    from tests.integration.test_wide_integers import _load

    columns = {"id": "Int64", "n": "UInt32 DEFAULT", "kept": "String"}
    rows, dead = _load(tmp_path, spark_session, "clickhouse://127.0.0.1:8123", columns,
                       [{"id": 1, "kept": "a"}, {"id": 2, "n": None, "kept": "b"}, {"id": 3, "n": 5, "kept": "c"},
                        {"id": 4, "n": -1, "kept": "d"}, {"id": 5, "n": 6}])
    assert [(r["id"], r["n"], r["kept"]) for r in rows] == [(1, None, "a"), (2, None, "b"), (3, 5, "c")]
    assert dead == {4: "column 'n' of t (UInt32 DEFAULT): integer out of range [0, 4294967295]",
                    5: "required field 'kept' of t is missing or null"}
