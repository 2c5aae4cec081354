"""A ClickHouse table's computed columns are no fields of its messages: a whole-database job (routing.topic_table)
takes a table's fields from its columns, and MATERIALIZED, ALIAS and EPHEMERAL columns are ones an INSERT of stored
rows cannot (or need not) set. Taken as fields, a NOT NULL one made every message of the table a dead letter
("required field ... is missing"), and a value sent for one would be refused by ClickHouse."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from streaming_sink import ExactlyOnceSink
from streaming_sink.config import resolve_config
from streaming_sink.state import MemoryStateStore
from streaming_sink.target_tables import job_tables
from tests.integration.test_protocol_findings import InMemoryRunner
from tests.support.pipeline import open_target

DDL = ("id Int64, name String, loaded_at DateTime MATERIALIZED toDateTime('2026-01-02 03:04:05', 'UTC'), "
       "upper_name String ALIAS upper(name), raw String EPHEMERAL, kafka_partition Int32, kafka_offset Int64")


def test_a_derived_tables_fields_leave_out_its_computed_columns_and_its_rows_load(tmp_path: Path) -> None:
    spec = resolve_config({
        "job_id": "wd", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"},
        "target": {"url": f"chdb://{tmp_path / 'ch'}", "database": "default"}}, tmp_path)
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
