import pyarrow as pa
import pytest

from streaming_sink.routing import Router, UnknownTableError
from streaming_sink.targets.base import ConfigurationError


def batch(tables):
    return pa.RecordBatch.from_pydict({"id": list(range(len(tables))), "__table": tables})


def test_routes_by_column_and_drops_it():
    router = Router(frozenset({"a", "b"}), table_column="__table")
    parts = dict(router.split(batch(["a", "b", "a"])))
    assert parts["a"].column("id").to_pylist() == [0, 2]
    assert parts["b"].column("id").to_pylist() == [1]
    assert parts["a"].schema.names == ["id"]


def test_unknown_table_fails_before_yielding_anything():
    router = Router(frozenset({"a"}), table_column="__table")
    produced = []
    with pytest.raises(UnknownTableError, match="unknown table.*'zzz'"):
        for part in router.split(batch(["a", "zzz"])):
            produced.append(part)
    assert produced == []


def test_null_table_is_an_error():
    router = Router(frozenset({"a"}), table_column="__table")
    with pytest.raises(UnknownTableError, match="null"):
        list(router.split(batch(["a", None])))


def test_static_table_must_exist():
    with pytest.raises(ConfigurationError, match="'missing'"):
        Router(frozenset({"a"}), table="missing")
    with pytest.raises(ConfigurationError, match="exactly one"):
        Router(frozenset({"a"}), table="a", table_column="t")
