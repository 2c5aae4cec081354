"""Which columns of a ClickHouse table take change rows' `__version` and `__op`, read from system.tables
(change_tables.py); and how a chunk of change rows becomes the table's rows."""
from __future__ import annotations

import pyarrow as pa
import pytest

from streaming_sink.changes import DELETE, OP_COLUMN, UPSERT, VERSION_COLUMN
from streaming_sink.targets.clickhouse.change_tables import (
    ReplacingColumns,
    change_refusal,
    replacing_columns,
    sorting_key_columns,
    table_rows,
)
from streaming_sink.targets.clickhouse.engines import TableFacts
from streaming_sink.targets.encoding import EncodingError


def facts(engine: str, engine_full: str, sorting_key: str = "id", partition_key: str = "") -> TableFacts:
    return TableFacts(name="t", engine=engine, engine_full=engine_full, sorting_key=sorting_key, partition_key=partition_key)


@pytest.mark.parametrize("engine, engine_full, sorting_key, expected", [
    ("ReplacingMergeTree", "ReplacingMergeTree(ver, gone) ORDER BY id SETTINGS index_granularity = 8192", "id",
     ReplacingColumns("ver", "gone", ("id",))),
    ("ReplacingMergeTree", "ReplacingMergeTree(`__version`, `__is_deleted`) ORDER BY (a, `b c`)", "a, `b c`",
     ReplacingColumns("__version", "__is_deleted", ("a", "b c"))),
    ("ReplicatedReplacingMergeTree", "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', "
     "ver, gone) ORDER BY (id)", "(id)", ReplacingColumns("ver", "gone", ("id",))),
    ("SharedReplacingMergeTree", "SharedReplacingMergeTree(ver, gone) ORDER BY id", "id", ReplacingColumns("ver", "gone", ("id",))),
    ("ReplacingMergeTree", "ReplacingMergeTree(ver) ORDER BY id", "id", None),  # no is-deleted column
    ("ReplacingMergeTree", "ReplacingMergeTree ORDER BY id", "id", None),
    ("ReplicatedReplacingMergeTree", "ReplicatedReplacingMergeTree('/p', '{replica}', ver) ORDER BY id", "id", None),
    ("ReplacingMergeTree", "ReplacingMergeTree(ver, gone) ORDER BY (id, toDate(ts))", "id, toDate(ts)", None),
    ("MergeTree", "MergeTree ORDER BY id", "id", None),
    ("CollapsingMergeTree", "CollapsingMergeTree(sign) ORDER BY id", "id", None),
])
def test_the_version_and_is_deleted_columns_come_from_a_replacing_merge_trees_engine(engine, engine_full, sorting_key,
                                                                                     expected):
    assert replacing_columns(facts(engine, engine_full, sorting_key)) == expected


def test_a_sorting_key_of_plain_columns_is_the_tables_key_and_one_with_an_expression_is_none():
    assert sorting_key_columns("id") == ("id",)
    assert sorting_key_columns("(tenant, id)") == ("tenant", "id")
    assert sorting_key_columns("tenant, intHash32(id)") is None
    assert sorting_key_columns("") is None and sorting_key_columns("tuple()") is None


def change_schema(*names: str) -> pa.Schema:
    return pa.schema([(name, pa.int64()) for name in names] + [(OP_COLUMN, pa.int32()), (VERSION_COLUMN, pa.int64())])


def test_a_partition_key_over_a_column_a_change_can_alter_is_refused_and_one_over_the_key_is_not():
    columns = {"id": "Int64", "day": "Date", "ver": "UInt64", "gone": "UInt8"}
    engine_full = "ReplacingMergeTree(ver, gone) ORDER BY id"
    moving = change_refusal(facts("ReplacingMergeTree", engine_full, partition_key="toYYYYMM(day)"), columns,
                            change_schema("id", "day"))
    assert moving is not None and "PARTITION BY reads ['day']" in moving and "\n" not in moving
    assert change_refusal(facts("ReplacingMergeTree", engine_full, partition_key="id % 4"), columns,
                          change_schema("id", "day")) is None


def test_a_version_column_that_is_not_uint64_is_refused():
    why = change_refusal(facts("ReplacingMergeTree", "ReplacingMergeTree(ver, gone) ORDER BY id"),
                         {"id": "Int64", "ver": "DateTime", "gone": "UInt8"}, change_schema("id"))
    assert why is not None and "version column ver is DateTime, not UInt64" in why


def test_change_rows_become_the_tables_rows_and_a_negative_version_is_refused():
    chunk = pa.table({"id": [1, 2], OP_COLUMN: pa.array([UPSERT, DELETE], pa.int32()), VERSION_COLUMN: [7, 8]})
    rows = table_rows(chunk, ReplacingColumns("ver", "gone", ("id",)))
    assert rows.schema == pa.schema([("id", pa.int64()), ("ver", pa.uint64()), ("gone", pa.uint8())])
    assert rows.to_pylist() == [{"id": 1, "ver": 7, "gone": 0}, {"id": 2, "ver": 8, "gone": 1}]
    negative = chunk.set_column(2, VERSION_COLUMN, pa.array([7, -1]))
    with pytest.raises(EncodingError, match="negative version"):
        table_rows(negative, ReplacingColumns("ver", "gone", ("id",)))
