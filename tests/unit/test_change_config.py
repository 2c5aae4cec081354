"""Change streams in job.toml (issue 27, item 1): `kafka.format = "debezium"` and `tables.<name>.key`; each table's key
from the file or, where the file names none, from the target; every mistake one line before anything runs."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.config import resolve_config
from streaming_sink.errors import ConfigurationError
from streaming_sink.target_tables import job_tables
from streaming_sink.targets.base import Target

CHANGES: dict[str, Any] = {
    "job_id": "shop-cdc",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\.public\..+$", "format": "debezium"},
    "routing": {"topic_table": r"^pg\.public\.(.+)$"},
    "dead_letters": {"table": "dead_letters"},
    "sink": {"metadata_columns": False},
    "target": {"url": "clickhouse://ch:8123", "database": "shop"},
    "tables": {"customers": {"schema": "id INT NOT NULL, name STRING", "key": ["id"]}},
}


def changed(**sections: Any) -> dict[str, Any]:
    data = copy.deepcopy(CHANGES)
    for section, keys in sections.items():
        data[section] = {key: value for key, value in {**data.get(section, {}), **keys}.items() if value is not None}
    return data


def refusal(data: dict[str, Any], tmp_path: Path) -> str:
    with pytest.raises(ConfigurationError) as error:
        resolve_config(data, tmp_path)
    assert "\n" not in str(error.value)
    return str(error.value)


class _Keyed(Target):
    """A target with tables, their columns and keys (None: it cannot tell); nothing is loaded."""

    kind, database = "clickhouse", "shop"

    def __init__(self, tables: dict[str, tuple[dict[str, str], tuple[str, ...] | None]]) -> None:
        self.tables = tables

    def routable_tables(self) -> set[str]:
        return set(self.tables)

    def table_columns(self, table: str) -> dict[str, str] | None:
        return self.tables[table][0]

    def table_key(self, table: str) -> tuple[str, ...] | None:
        return self.tables[table][1]

    def begin(self, *args: Any) -> Any:
        raise AssertionError("not loading")

    commit = abort = begin


def test_debezium_and_keys_reach_the_job(tmp_path):
    spec = resolve_config(CHANGES, tmp_path)
    assert spec.changes and spec.source_format == "debezium" and spec.table_keys == {"customers": ["id"]}


@pytest.mark.parametrize("data, expected", [
    (changed(kafka={"format": "avro"}), "kafka.format = 'avro'"),
    (changed(kafka={"format": None}), 'tables.customers.key is for change events: set kafka.format = "debezium"'),
    (changed(tables={"customers": {"schema": "id INT", "key": []}}), 'tables.customers.key: give the names of the fields'),
    (changed(tables={"customers": {"schema": "id INT", "key": ["id"], "select": "id"}}),
     'tables.customers.select: change events (kafka.format = "debezium") load the row as it is; remove the select'),
])
def test_mistakes_are_one_line_naming_the_key(tmp_path, data, expected):
    assert expected in refusal(data, tmp_path)


def test_a_table_without_a_key_in_the_file_takes_the_targets(tmp_path):
    spec = resolve_config(changed(tables={"customers": {"schema": "id INT NOT NULL, name STRING"}}), tmp_path)
    target = _Keyed({"customers": ({"id": "Int32", "name": "String"}, ("id",)),
                     "orders": ({"id": "Int64", "note": "Nullable(String)"}, ("id",)),
                     "audit": ({"at": "Int64"}, None), "dead_letters": ({"raw_value": "String"}, None)})
    found = job_tables(spec, target, target.routable_tables(), ["pg.public.customers", "pg.public.orders", "pg.public.audit"])
    assert found.keys == {"customers": ("id",), "orders": ("id",)}
    assert set(found.tables) == {"customers", "orders"}  # audit has no key: its messages become dead letters
    assert found.unavailable == {"audit": "change events need its key and the target cannot tell it: list it under "
                                          "[tables.audit] with a schema and a key"}


def test_a_listed_table_whose_key_nobody_tells_is_refused(tmp_path):
    spec = resolve_config(changed(tables={"customers": {"schema": "id INT NOT NULL, name STRING"}}), tmp_path)
    target = _Keyed({"customers": ({"id": "Int32", "name": "String"}, None), "dead_letters": ({"raw_value": "String"}, None)})
    with pytest.raises(ConfigurationError, match=r"^table 'customers': change events need its key and the target cannot "
                                                 r"tell it; give tables.customers.key"):
        job_tables(spec, target, target.routable_tables(), ["pg.public.customers"])


def test_the_example_resolves(tmp_path):
    from streaming_sink.config import load_config

    spec = load_config(Path(__file__).resolve().parents[2] / "examples" / "change-stream.toml")
    assert spec.changes and spec.table_keys == {"customers": ["id"], "orders": ["id"]}


def test_add_column_is_for_change_events_into_tables_the_job_creates(tmp_path):
    text = refusal(changed(sink={"metadata_columns": False, "on_unknown_field": "add-column"}), tmp_path)
    assert text.startswith('on_unknown_field = "add-column" adds columns to tables the job created for change events')
    embedded = changed(sink={"metadata_columns": False, "on_unknown_field": "add-column"}, target={"url": None, "database": None})
    assert resolve_config(embedded, tmp_path).on_unknown_field == "add-column"


@pytest.mark.parametrize("error, wanted", [
    ('<bad message t/0@7: columns to add to customers: ["coupon","a, b"] (sink.on_unknown_field = "add-column")>',
     ("customers", ["coupon", "a, b"])),
    ('<bad message t/0@7: field(s) not in the schema of customers: coupon (sink.on_unknown_field = "fail")>', None),
])
def test_the_fields_to_add_read_back_from_the_failed_batch(error, wanted):
    from streaming_sink.frame import columns_to_add

    assert columns_to_add(f"UnknownTableError: {error}") == wanted
