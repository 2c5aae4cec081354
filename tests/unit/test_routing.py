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


def test_tables_take_their_columns_from_their_slots_and_nothing_else():
    """The packaged job's frame: each table's columns in typed slots shared by every table; a column no table maps
    (a change stream's `__key`, say) reaches none."""
    data = pa.RecordBatch.from_pydict({"__table": ["a", "b", "a"], "__s0_0": [1, 2, 3], "__s0_1": [10, None, 30],
                                       "__s1_0": [None, "x", None], "__key": ["k1", "k2", "k3"]})
    router = Router(None, table_column="__table",
                    table_slots={"a": (("id", "__s0_0"), ("cents", "__s0_1")), "b": (("id", "__s0_0"), ("name", "__s1_0"))})
    parts = dict(router.split(data))
    assert parts["a"].to_pylist() == [{"id": 1, "cents": 10}, {"id": 3, "cents": 30}]
    assert parts["b"].to_pylist() == [{"id": 2, "name": "x"}]


def test_a_route_to_a_table_without_slots_fails_naming_it_when_the_target_cannot_list_tables():
    router = Router(None, table_column="__table", table_slots={"a": (("id", "__s0_0"),)})
    with pytest.raises(UnknownTableError, match=r"unknown table\(s\) \['<bad message t/0@1: why>'\].*the job loads \['a'\]"):
        list(router.split(pa.RecordBatch.from_pydict({"__table": ["a", "<bad message t/0@1: why>"], "__s0_0": [1, 2]})))
