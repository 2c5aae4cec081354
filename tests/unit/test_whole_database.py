"""A whole database in a few lines (issue 26, item 3): kafka.topic_pattern, routing.topic_table, tables from the target.

What is checked before Spark starts: one line per mistake, naming the keys. How a table's columns become the schema
the job parses with, and what happens to a topic whose table cannot be loaded (tests/integration/test_whole_database.py
runs it end to end).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib

from streaming_sink.config import load_config, resolve_config
from streaming_sink.config_schema import json_schema
from streaming_sink.errors import ConfigurationError
from streaming_sink.target_tables import job_tables, table_of
from streaming_sink.targets.base import Target
from streaming_sink.targets.clickhouse.column_types import CLICKHOUSE_COLUMNS
from streaming_sink.targets.olap_types import DORIS_COLUMNS, STARROCKS_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
WHOLE = {
    "job_id": "shop-db",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\.public\..+$"},
    "routing": {"topic_table": r"^pg\.public\.(.+)$"},
    "dead_letters": {"table": "dead_letters"},
}


def changed(**sections: Any) -> dict[str, Any]:
    data = copy.deepcopy(WHOLE)
    for section, keys in sections.items():
        data[section] = {key: value for key, value in {**data.get(section, {}), **keys}.items() if value is not None}
    return data


def refusal(data: dict[str, Any], tmp_path: Path) -> str:
    with pytest.raises(ConfigurationError) as error:
        resolve_config(data, tmp_path)
    text = str(error.value)
    assert "\n" not in text
    return text


def test_a_pattern_and_a_topic_table_need_no_tables(tmp_path):
    spec = resolve_config(WHOLE, tmp_path)
    assert spec.topic_table == r"^pg\.public\.(.+)$" and spec.tables == {} and spec.topics is None
    options = spec.kafka_source().reader_options()
    assert options["subscribePattern"] == r"^pg\.public\..+$" and "subscribe" not in options


@pytest.mark.parametrize("kafka, named", [
    ({"topics": ["pg.public.orders"]}, ["kafka.topics", "kafka.topic_pattern"]),
    ({"topic_pattern": None}, ["kafka.topics", "kafka.topic_pattern"]),
    ({"options": {"subscribePattern": "pg.*"}}, ["kafka.topic_pattern", "kafka.options.subscribePattern"]),
])
def test_topics_and_a_pattern_are_one_choice(tmp_path, kafka, named):
    text = refusal(changed(kafka=kafka), tmp_path)
    assert all(key in text for key in named), text


def test_a_pattern_that_is_no_regex_is_named(tmp_path):
    text = refusal(changed(kafka={"topic_pattern": "pg.(public"}), tmp_path)
    assert text.startswith("kafka.topic_pattern: 'pg.(public' is not a regular expression: missing )")


@pytest.mark.parametrize("routing, expected", [
    ({"topic_table": "pg.(public"}, "routing.topic_table: 'pg.(public' is not a regular expression"),
    ({"topic_table": r"^pg\.public\..+$"}, r"routing.topic_table: '^pg\\.public\\..+$' has no group"),
    ({"topic_table": ""}, "routing.topic_table: give a regular expression"),
    ({"field": "table"}, "the file gives routing.field, routing.topic_table"),
])
def test_a_topic_table_must_be_a_regex_with_a_group_and_the_only_routing(tmp_path, routing, expected):
    assert expected in refusal(changed(routing=routing), tmp_path)


def test_other_routings_still_need_their_tables(tmp_path):
    data = changed(routing={"topic_table": None, "table": "orders"})
    assert refusal(data, tmp_path).startswith("tables: give at least one [tables.<name>] with its schema")


def test_the_table_is_the_first_group_over_the_whole_topic():
    pattern = r"pg\.public\.(.+)"
    assert table_of(pattern, "pg.public.orders") == "orders"
    assert table_of(pattern, "xpg.public.orders") is None  # the whole name, as Kafka matches a pattern
    assert table_of(r"pg\.public\.(.*)", "pg.public.") is None  # an empty group names no table


@pytest.mark.parametrize("rules, spelling, spark", [
    (CLICKHOUSE_COLUMNS, "Int64", "BIGINT"),
    (CLICKHOUSE_COLUMNS, "UInt8", "SMALLINT"),
    (CLICKHOUSE_COLUMNS, "UInt64", "DECIMAL(20,0)"),
    (CLICKHOUSE_COLUMNS, "Nullable(String)", "STRING"),
    (CLICKHOUSE_COLUMNS, "LowCardinality(Nullable(String))", "STRING"),
    (CLICKHOUSE_COLUMNS, "Decimal(12, 2)", "DECIMAL(12,2)"),
    (CLICKHOUSE_COLUMNS, "Decimal64(4)", "DECIMAL(18,4)"),
    (CLICKHOUSE_COLUMNS, "DateTime64(3, 'UTC')", "TIMESTAMP"),
    (CLICKHOUSE_COLUMNS, "Date32", "DATE"),
    (CLICKHOUSE_COLUMNS, "Float64", "DOUBLE"),
    (CLICKHOUSE_COLUMNS, "Bool", "BOOLEAN"),
    (CLICKHOUSE_COLUMNS, "Array(Int32)", None),
    (CLICKHOUSE_COLUMNS, "Map(String, String)", None),
    (STARROCKS_COLUMNS, "INT", "INT"),
    (STARROCKS_COLUMNS, "LARGEINT", "DECIMAL(38,0)"),
    (STARROCKS_COLUMNS, "DECIMAL(10,2)", "DECIMAL(10,2)"),
    (STARROCKS_COLUMNS, "VARCHAR", "STRING"),
    (STARROCKS_COLUMNS, "DATETIME", "TIMESTAMP"),
    (DORIS_COLUMNS, "BIGINT NOT NULL", "BIGINT"),
    (DORIS_COLUMNS, "ARRAY", None),
])
def test_a_target_column_type_becomes_the_spark_type_its_field_is_parsed_as(rules, spelling, spark):
    assert rules.spark_type(spelling) == spark


class _Tables(Target):
    """A target that has some tables with their columns; nothing else is called."""

    kind, database = "clickhouse", "shop"

    def __init__(self, columns: dict[str, dict[str, str]]) -> None:
        self.columns = columns

    def routable_tables(self) -> set[str]:
        return set(self.columns)

    def table_columns(self, table: str) -> dict[str, str] | None:
        return self.columns.get(table)

    def begin(self, *args: Any) -> Any:
        raise AssertionError("not loading")

    commit = abort = begin


def test_tables_come_from_the_target_and_a_topic_without_one_is_named(tmp_path):
    data = changed(target={"url": "clickhouse://ch:8123", "database": "shop"}, sink={"metadata_columns": ["offset"]},
                   tables={"payments": {"schema": "id BIGINT NOT NULL, method STRING"}})
    spec = resolve_config(data, tmp_path)
    target = _Tables({
        "orders": {"id": "Int64", "name": "Nullable(String)", "kafka_offset": "Int64"},
        "payments": {"id": "Int64", "method": "String", "kafka_offset": "Int64"},
        "tags": {"id": "Int64", "labels": "Array(String)", "kafka_offset": "Int64"},
        "dead_letters": {"raw_value": "String"},
    })
    topics = ["pg.public.orders", "pg.public.payments", "pg.public.refunds", "pg.public.tags", "pg.public.dead_letters"]
    found = job_tables(spec, target, target.routable_tables(), topics)
    assert found.tables == {"orders": "`id` BIGINT NOT NULL, `name` STRING",  # kafka_offset is the job's own
                            "payments": "id BIGINT NOT NULL, method STRING"}  # as listed
    assert found.unavailable == {
        "dead_letters": "that is the dead-letter table",
        "refunds": "the target database 'shop' has no such table the job can load (create it, or list it under "
                   "[tables] with a schema on a target that creates tables)",
        "tags": "its column 'labels' is Array(String), which the job cannot fill from JSON: list the table under "
                "[tables.tags] with a schema and a select",
    }
    target.columns["orders"].pop("kafka_offset")
    with pytest.raises(ConfigurationError, match=r"^table 'orders' \(routing.topic_table\) has no column\(s\) "
                                                 r"\['kafka_offset'\] that sink.metadata_columns writes"):
        job_tables(spec, target, target.routable_tables(), topics)


def test_the_whole_database_example_loads_and_its_schema_accepts_it():
    path = ROOT / "examples" / "whole-database.toml"
    spec = load_config(path)
    assert spec.topic_table == r"^pg\.public\.(.+)$" and spec.tables == {} and spec.metadata() == []
    assert spec.kafka_source().reader_options()["subscribePattern"] == r"^pg\.public\..+$"
    assert table_of(spec.topic_table, "pg.public.order_items") == "order_items"
    settings = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(settings) <= 15, settings  # a 500-table database in about a dozen lines
    assert list(jsonschema.Draft202012Validator(json_schema()).iter_errors(tomllib.loads(path.read_text()))) == []
