"""Every type the sink writes, at its edges, through every target and wire format, read back equal to what
was sent, or refused with an error that names the column: never altered silently.

Targets: ClickHouse (the real engine, embedded and over HTTP through the test front), StarRocks (CSV, JSON) and Doris (CSV, JSON, Arrow)
through their emulators, which apply each product's documented conversion rules in strict mode
(docs/protocol.md, Common: value conversion). The values are Arrow, as Spark hands them to the sink
(`test_spark_types_reach_arrow_as_the_matrix_sends_them` pins that step). docs/types.md is the table
this test holds true.
"""
from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import TxnRef
from streaming_sink.targets.base import CommitOutcome, Target
from streaming_sink.targets.clickhouse import ClickHouseTarget
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.encoding import EncodingError
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

DB = "matrix"
UTC = dt.timezone.utc
LONG = "ü" * 30_000 + "𝄞"  # 60,004 bytes: under StarRocks' STRING limit of 65,533
DST = [dt.datetime(2024, 11, 3, 5, 30, tzinfo=UTC), dt.datetime(2024, 11, 3, 6, 30, tzinfo=UTC)]  # 01:30 twice in New York

# name -> (Arrow type, six values, ClickHouse type, StarRocks type, Doris type)
COLUMNS: dict[str, tuple[pa.DataType, list[Any], str, str, str]] = {
    "i8": (pa.int8(), [-128, 127, 0, None, -1, 1], "Nullable(Int8)", "TINYINT", "TINYINT"),
    "i16": (pa.int16(), [-32768, 32767, 0, None, -1, 1], "Nullable(Int16)", "SMALLINT", "SMALLINT"),
    "i32": (pa.int32(), [-2**31, 2**31 - 1, 0, None, -1, 1], "Nullable(Int32)", "INT", "INT"),
    "i64": (pa.int64(), [-2**63, 2**63 - 1, 0, None, -1, 1], "Nullable(Int64)", "BIGINT", "BIGINT"),
    "dec": (pa.decimal128(38, 10),
            [Decimal("9999999999999999999999999999.9999999999"), Decimal("-9999999999999999999999999999.9999999999"),
             Decimal("0E-10"), None, Decimal("0.0000000001"), Decimal("-1.5000000000")],
            "Nullable(Decimal(38, 10))", "DECIMAL(38,10)", "DECIMAL(38,10)"),
    "f32": (pa.float32(), [3.4028234663852886e38, -1.1754943508222875e-38, 0.0, None, -0.0, 0.1],
            "Nullable(Float32)", "FLOAT", "FLOAT"),
    "f64": (pa.float64(), [1.7976931348623157e308, 5e-324, 0.1, None, -0.0, -2.5], "Nullable(Float64)", "DOUBLE", "DOUBLE"),
    "fx": (pa.float64(), [math.nan, math.inf, -math.inf, None, 1.0, -0.0], "Nullable(Float64)", "DOUBLE", "DOUBLE"),
    "bin": (pa.binary(), [b"", b"abc", b"\x00\xff\xfe", None, "é".encode(), b"\\N"], "Nullable(String)", "VARBINARY", "VARBINARY"),
    "b": (pa.bool_(), [True, False, True, None, False, True], "Nullable(Bool)", "BOOLEAN", "BOOLEAN"),
    "s": (pa.string(), ["", None, "\\N", 'a,b "q" \\ back', "tab\there\nnew\r\nline", LONG],
          "Nullable(String)", "STRING", "STRING"),
    "d": (pa.date32(), [dt.date(1900, 1, 1), dt.date(2299, 12, 31), dt.date(1970, 1, 1), None, dt.date(2024, 2, 29),
                        dt.date(1969, 12, 31)], "Nullable(Date32)", "DATE", "DATE"),
    "ts": (pa.timestamp("us", "UTC"),
           [dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(2299, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), DST[0], None,
            DST[1], dt.datetime(2024, 2, 29, 12, 0, 0, 1, tzinfo=UTC)],
           "Nullable(DateTime64(6, 'UTC'))", "DATETIME", "DATETIME(6)"),
    "arr": (pa.list_(pa.int64()), [[1, None, -3], [], None, [2**63 - 1], [0], [None]],
            "Array(Nullable(Int64))", "ARRAY<BIGINT>", "ARRAY<BIGINT>"),
    "m": (pa.map_(pa.string(), pa.int64()), [[("k", 1), ("é", -2)], [], None, [("a,b", None)], [("", 0)], [("x", 7)]],
          "Map(String, Nullable(Int64))", "MAP<VARCHAR(20),BIGINT>", "MAP<VARCHAR(20),BIGINT>"),
    "st": (pa.struct([("a", pa.int64()), ("b", pa.string())]),
           [{"a": 1, "b": "x"}, {"a": None, "b": None}, None, {"a": -1, "b": 'q"uote'}, {"a": 0, "b": ""}, {"a": 2, "b": "𝄞"}],
           "Tuple(a Nullable(Int64), b Nullable(String))", "STRUCT<a BIGINT, b VARCHAR(20)>", "STRUCT<a BIGINT, b VARCHAR(20)>"),
}
ROWS = 6


def table_of(names: list[str]) -> pa.Table:
    arrays = {"id": pa.array(range(ROWS), pa.int64())}
    arrays.update({name: pa.array(COLUMNS[name][1], COLUMNS[name][0]) for name in names})
    return pa.table(arrays)


def expected_value(name: str, value: Any) -> Any:
    """What a target that holds the value exactly gives back, in the emulators' and our readers' terms."""
    kind = COLUMNS[name][0]
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return "nan"  # NaN equals nothing, itself included
    if pa.types.is_timestamp(kind):
        return value.astimezone(UTC).replace(tzinfo=None)  # DATETIME holds the UTC wall time
    if pa.types.is_float32(kind):
        return struct.unpack("f", struct.pack("f", value))[0]
    if pa.types.is_map(kind):
        return dict(value)
    return value


def normalised(name: str, value: Any) -> Any:
    """A value read back, in the same terms: float32 precision, naive UTC datetimes, dict maps and structs."""
    kind = COLUMNS[name][0]
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if pa.types.is_binary(kind) and isinstance(value, str):
        return bytes.fromhex(value)  # read as hex(...) from ClickHouse, whose client decodes String as text
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if pa.types.is_float32(kind):
        return struct.unpack("f", struct.pack("f", value))[0]
    if pa.types.is_struct(kind) and isinstance(value, tuple):
        return dict(zip([f.name for f in kind], value))
    return value


def load(target: Target, table: str, data: pa.Table) -> None:
    txn = target.begin(table, lambda chunk: TxnRef(target.kind, DB, table, f"L_{table}_{chunk}", 0, "e1w0t0"), lambda ref: None)
    txn.write(data)
    for part in txn.prepare():
        assert target.commit(part.committable("sum")) is CommitOutcome.COMMITTED


class Case:
    """One (target, format): how to make a table of some columns, load it, and read it back."""

    def __init__(self, name: str, make: Callable[[list[str]], Target], read: Callable[[list[str]], list[dict[str, Any]]]) -> None:
        self.name, self.make, self.read = name, make, read


@pytest.fixture(params=["clickhouse", "clickhouse-http", "starrocks-csv", "starrocks-json", "doris-csv", "doris-json", "doris-arrow"])
def case(request, tmp_path) -> Iterator[Case]:
    product, _, fmt = request.param.partition("-")
    if product == "clickhouse":
        url = request.getfixturevalue("clickhouse_front").url if fmt == "http" else f"chdb://{tmp_path / 'ch'}"
        target = ClickHouseTarget(url, database=DB)
        target.client().command(f"CREATE DATABASE {DB}")

        def make_ch(names: list[str]) -> Target:
            columns = ", ".join(["id Int64"] + [f"{n} {COLUMNS[n][2]}" for n in names])
            target.client().command(f"CREATE TABLE {DB}.t ({columns}) ENGINE = MergeTree ORDER BY id")
            target.routable_tables()
            return target

        def read_ch(names: list[str]) -> list[dict[str, Any]]:
            columns = ", ".join(["id"] + [f"hex({n}) AS {n}" if pa.types.is_binary(COLUMNS[n][0]) else n for n in names])
            result = target.client().query(f"SELECT {columns} FROM {DB}.t ORDER BY id")
            return [dict(zip(result.column_names, row)) for row in result.result_rows]

        try:
            yield Case(request.param, make_ch, read_ch)
        finally:
            target.close()
        return
    emulator_class = StarRocksEmulator if product == "starrocks" else DorisEmulator
    with emulator_class(tmp_path / product) as emu:
        def make_olap(names: list[str]) -> Target:
            index = 3 if product == "starrocks" else 4
            emu.create_table(DB, "t", [("id", "BIGINT")] + [(n, COLUMNS[n][index]) for n in names])
            if product == "starrocks":
                return StarRocksTarget(emu.fe_url, DB, "root", "", format=fmt, backoff_s=0.0)
            return DorisTarget(emu.fe_url, DB, "root", "", format=fmt, backoff_s=0.0)

        def read_olap(names: list[str]) -> list[dict[str, Any]]:
            return sorted(emu.visible_dicts(DB, "t"), key=lambda row: row["id"])

        yield Case(request.param, make_olap, read_olap)


# What each (target, format) cannot hold, and must refuse naming the column: {case: {column: rows refused}}.
REFUSED: dict[str, dict[str, set[int]]] = {
    # ClickHouse Array, Map and Tuple columns cannot be Nullable: a NULL would be stored as [], {}, (NULL, NULL).
    **{case: {"arr": {2}, "m": {2}, "st": {2}} for case in ("clickhouse", "clickhouse-http")},
    # Doris reads an Arrow timestamp as unsigned on older versions: instants before 1970-01-01 08:00 +08:00
    # are refused rather than risked (docs/protocol.md, Doris: Arrow and Parquet loads).
    "doris-arrow": {"ts": {0}, "fx": {0, 1, 2}},
    # StarRocks and Doris hold no NaN or infinity; the text formats carry text, and these bytes are not UTF-8.
    **{case: {"fx": {0, 1, 2}, "bin": {2}} for case in ("starrocks-csv", "starrocks-json", "doris-csv", "doris-json")},
}


@pytest.mark.parametrize("names", [[name] for name in COLUMNS], ids=list(COLUMNS))
def test_each_value_arrives_as_sent_or_is_refused_naming_its_column(case: Case, names: list[str]) -> None:
    target = case.make(names)
    data = table_of(names)
    refused = set().union(*[rows for column, rows in REFUSED.get(case.name, {}).items() if column in names])
    if refused:
        with pytest.raises(EncodingError, match=f"column '{names[0]}'"):
            load(target, "t", data)
        data = data.filter(pa.array([i not in refused for i in range(ROWS)]))
    load(target, "t", data)
    back = case.read(names)
    kept = [i for i in range(ROWS) if i not in refused]
    assert [row["id"] for row in back] == kept
    for name in names:
        got = [normalised(name, row[name]) for row in back]
        want = [expected_value(name, COLUMNS[name][1][i]) for i in kept]
        assert got == want, f"{case.name}: column {name}"


SPARK_TYPES = {
    "i8": "TINYINT", "i16": "SMALLINT", "i32": "INT", "i64": "BIGINT", "dec": "DECIMAL(38,10)", "f32": "FLOAT",
    "f64": "DOUBLE", "b": "BOOLEAN", "s": "STRING", "d": "DATE", "ts": "TIMESTAMP", "arr": "ARRAY<BIGINT>",
    "m": "MAP<STRING,BIGINT>", "st": "STRUCT<a: BIGINT, b: STRING>",
}
SPARK_ROWS = [0, 1, 3, 4, 5]  # row 2 holds NULL arrays, maps and structs, which ClickHouse cannot (refused above)


@pytest.mark.parametrize("product, zone", [("clickhouse", "Asia/Kolkata"), ("clickhouse-http", "Asia/Kolkata"),
                                           ("starrocks", "America/New_York")])
def test_spark_types_reach_the_target_as_sent_whatever_the_session_zone(spark_session, tmp_path, product, zone, request) -> None:
    """The step before the matrix: Spark's types through `ExactlyOnceSink` (Spark to Arrow, writers in the driver
    for embedded ClickHouse and in tasks for ClickHouse over HTTP and StarRocks). A session zone other than UTC must
    not move a timestamp."""
    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.state import FileStateStore

    names = list(SPARK_TYPES)
    schema = ", ".join(["id BIGINT"] + [f"{name} {kind}" for name, kind in SPARK_TYPES.items()])
    rows = [tuple([i] + [dict(COLUMNS[n][1][i]) if n == "m" and COLUMNS[n][1][i] is not None else COLUMNS[n][1][i]
                         for n in names]) for i in SPARK_ROWS]
    previous = spark_session.conf.get("spark.sql.session.timeZone")
    spark_session.conf.set("spark.sql.session.timeZone", zone)
    try:
        frame = spark_session.createDataFrame(rows, schema).repartition(2)
        if product.startswith("clickhouse"):
            url = request.getfixturevalue("clickhouse_front").url if product == "clickhouse-http" else f"chdb://{tmp_path / 'ch'}"
            target: Target = ClickHouseTarget(url, database=DB)
            target.client().command(f"CREATE DATABASE {DB}")
            columns = ", ".join(["id Int64"] + [f"{n} {COLUMNS[n][2]}" for n in names])
            target.client().command(f"CREATE TABLE {DB}.t ({columns}) ENGINE = MergeTree ORDER BY id")
            try:
                ExactlyOnceSink(target, FileStateStore(tmp_path / "state"), "types", table="t").process(frame, 0, "q")
                result = target.client().query(f"SELECT * FROM {DB}.t ORDER BY id")
                back = [dict(zip(result.column_names, row)) for row in result.result_rows]
            finally:
                target.close()
        else:
            with StarRocksEmulator(tmp_path / "sr") as emu:
                emu.create_table(DB, "t", [("id", "BIGINT")] + [(n, COLUMNS[n][3]) for n in names])
                target = StarRocksTarget(emu.fe_url, DB, "root", "", backoff_s=0.0)
                ExactlyOnceSink(target, FileStateStore(tmp_path / "state"), "types", table="t").process(frame, 0, "q")
                back = sorted(emu.visible_dicts(DB, "t"), key=lambda row: row["id"])
    finally:
        spark_session.conf.set("spark.sql.session.timeZone", previous)
    assert [row["id"] for row in back] == SPARK_ROWS
    for name in names:
        got = [normalised(name, row[name]) for row in back]
        assert got == [expected_value(name, COLUMNS[name][1][i]) for i in SPARK_ROWS], f"{product}: column {name}"
