"""Target type spellings -> what their columns hold (each target descriptor's column rules), without Spark."""
from __future__ import annotations

import pytest

from streaming_sink.targets import DESCRIPTORS
from streaming_sink.targets.columns import ColumnLimits

RULES = {descriptor.product: descriptor.columns for descriptor in DESCRIPTORS}


def column_limits(product: str, spelling: str | None) -> ColumnLimits:
    return RULES[product].limits(spelling)


def raw_value_room(product: str, spelling: str | None) -> int | None:
    return RULES[product].raw_value_room(spelling)


@pytest.mark.parametrize("product, spelling, expected", [
    ("starrocks", "TINYINT", dict(int_range=(-128, 127))),
    ("doris", "LARGEINT", dict(int_range=(-(1 << 127), (1 << 127) - 1))),
    ("starrocks", "VARCHAR(10)", dict(max_bytes=10)),
    ("starrocks", "STRING", dict(max_bytes=65533)),
    ("doris", "CHAR(3) NOT NULL", dict(max_bytes=3, nullable=False)),
    ("doris", "DECIMAL(10,2)", dict(decimal=(10, 2))),
    ("starrocks", "DECIMAL", dict(decimal=(10, 0))),
    ("doris", "FLOAT", dict(single_precision=True)),
    ("doris", "DATETIME", dict(fraction_digits=0)),  # Doris DATETIME is DATETIME(0)
    ("starrocks", "DATETIME", dict(fraction_digits=6)),
    ("doris", "DATETIME(3)", dict(fraction_digits=3)),
    ("clickhouse", "Int8", dict(int_range=(-128, 127), nullable=False)),
    ("clickhouse", "Nullable(UInt16)", dict(int_range=(0, 65535), nullable=True)),
    ("clickhouse", "LowCardinality(Nullable(FixedString(4)))", dict(max_bytes=4, nullable=True)),
    ("clickhouse", "Decimal(18, 4)", dict(decimal=(18, 4))),
    ("clickhouse", "Decimal64(3)", dict(decimal=(18, 3))),
    ("clickhouse", "DateTime", dict(fraction_digits=0, time_micros=(0, 4294967295 * 1_000_000))),
    ("clickhouse", "DateTime64(9, 'UTC')", dict(fraction_digits=6)),
    ("clickhouse", "DateTime64(3)", dict(fraction_digits=3)),
    ("clickhouse", "Date", dict(date_days=(0, 65535))),
    ("clickhouse", "Float32", dict(single_precision=True, holds_non_finite=True)),
])
def test_a_spelling_gives_its_limits(product: str, spelling: str, expected: dict) -> None:
    limits = column_limits(product, spelling)
    for key, value in expected.items():
        assert getattr(limits, key) == value, (spelling, key)


def test_starrocks_and_doris_hold_no_nan_nor_year_10000_even_when_the_type_is_unknown() -> None:
    unknown = column_limits("doris", None)
    assert not unknown.holds_non_finite and unknown.date_days == (-719528, 2932896)
    assert not column_limits("starrocks", "DOUBLE").holds_non_finite
    assert column_limits("clickhouse", None).holds_non_finite and column_limits("clickhouse", "Float64").holds_non_finite


def test_dates_of_starrocks_and_doris_reach_back_to_year_zero() -> None:
    date = column_limits("starrocks", "DATE").date_days
    assert date == (-719528, 2932896)  # 0000-01-01 and 9999-12-31 in days from 1970-01-01
    assert column_limits("doris", "DATETIME").time_micros == (date[0] * 86_400_000_000, (date[1] + 1) * 86_400_000_000 - 1)


def test_types_without_limits_check_only_nulls() -> None:
    assert column_limits("clickhouse", "String") == ColumnLimits("String", nullable=False)
    json = column_limits("starrocks", "JSON")
    assert (json.int_range, json.max_bytes, json.decimal, json.fraction_digits, json.nullable) == (None, None, None, None, True)


def test_the_dead_letter_raw_value_room_where_schema_gives_no_length() -> None:
    assert raw_value_room("starrocks", "VARCHAR") == 65533  # StarRocks' STRING, as `_schema` spells it
    assert raw_value_room("doris", "VARCHAR") == 65533
    assert raw_value_room("doris", "STRING") is None
    assert raw_value_room("clickhouse", "Nullable(String)") is None
    assert raw_value_room("clickhouse", "FixedString(16)") == 16
    assert raw_value_room("starrocks", None) is None
