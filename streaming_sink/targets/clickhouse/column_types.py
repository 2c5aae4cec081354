"""ClickHouse's column type grammar, for the job's value checks. ClickHouse columns are NOT NULL unless
`Nullable(...)` (a NULL would silently become the type's default), names are case-sensitive, floats
hold NaN. Ranges: ClickHouse documentation of Date, Date32, DateTime and DateTime64 (docs/types.md)."""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from ..columns import DAY_US, ColumnLimits, days_from_epoch, int_range, integer_spark_type, type_arguments

_DATE: dict[str, Any] = dict(date_days=(0, days_from_epoch(dt.date(2149, 6, 6))), range_text="1970-01-01 .. 2149-06-06")
_DATE32: dict[str, Any] = dict(date_days=(days_from_epoch(dt.date(1900, 1, 1)), days_from_epoch(dt.date(2299, 12, 31))),
                               range_text="1900-01-01 .. 2299-12-31")
_DATETIME: dict[str, Any] = dict(time_micros=(0, 4294967295 * 1_000_000), range_text="1970-01-01 00:00:00 .. 2106-02-07 06:28:15 UTC")
_DATETIME64: dict[str, Any] = dict(
    time_micros=(days_from_epoch(dt.date(1900, 1, 1)) * DAY_US, (days_from_epoch(dt.date(2299, 12, 31)) + 1) * DAY_US - 1),
    range_text="1900-01-01 00:00:00 .. 2299-12-31 23:59:59.999999 UTC")
#: How a column with a DEFAULT expression is spelled to the job, after its type (`Catalog.columns`): a message may
#: leave it out or send NULL, and ClickHouse fills the expression in, row by row (`input_format_null_as_default` on
#: every staging insert; checked on chdb 4.4 for Arrow inserts, also for an expression over other columns)
DEFAULTED = " DEFAULT"
_DECIMAL_PRECISION = {"DECIMAL32": 9, "DECIMAL64": 18, "DECIMAL128": 38, "DECIMAL256": 76}
#: ClickHouse types a JSON field fills as it is: base name -> Spark type (the others below, or none)
_SPARK_TYPES = {"Bool": "BOOLEAN", "Float32": "FLOAT", "Float64": "DOUBLE", "String": "STRING", "FixedString": "STRING",
                "UUID": "STRING", "Enum8": "STRING", "Enum16": "STRING", "IPv4": "STRING", "IPv6": "STRING",
                "Date": "DATE", "Date32": "DATE", "DateTime": "TIMESTAMP", "DateTime64": "TIMESTAMP"}


@dataclass(frozen=True)
class ClickHouseColumnRules:
    case_sensitive_names: bool = True

    def table_name_problem(self, name: str) -> str | None:
        return None  # any name, quoted with backticks

    def limits(self, spelling: str | None) -> ColumnLimits:
        """`<type> DEFAULT` (a column with a DEFAULT expression, as the target spells it to the job) may be left NULL."""
        if spelling is None:
            return ColumnLimits("type unknown")
        text = spelling.strip()
        defaulted = text.endswith(DEFAULTED)
        return _limits(text, text.removesuffix(DEFAULTED).strip(), nullable=defaulted)

    def raw_value_room(self, spelling: str | None) -> int | None:
        return None if spelling is None else self.limits(spelling).max_bytes

    def spark_type(self, spelling: str) -> str | None:
        text = spelling.strip().removesuffix(DEFAULTED).strip()
        while re.fullmatch(r"(Nullable|LowCardinality)\(.*\)", text):
            text = text[text.index("(") + 1:-1].strip()
        base = re.split(r"[(\s]", text, maxsplit=1)[0]
        integer = re.fullmatch(r"(U?)Int(8|16|32|64|128|256)", base)
        if integer:
            return integer_spark_type(int(integer.group(2)), signed=not integer.group(1))
        decimal = self.limits(text).decimal
        if decimal is not None:
            precision, scale = decimal
            return f"DECIMAL({min(precision, 38)},{min(scale, 38)})"
        return _SPARK_TYPES.get(base)


def _limits(spelling: str, text: str, nullable: bool = False) -> ColumnLimits:
    for wrapper in ("Nullable", "LowCardinality"):
        if text.startswith(wrapper + "(") and text.endswith(")"):
            return _limits(spelling, text[len(wrapper) + 1:-1], nullable or wrapper == "Nullable")
    base = re.split(r"[(\s]", text, maxsplit=1)[0]
    args = type_arguments(text)
    common: dict[str, Any] = dict(spelling=spelling, nullable=nullable)
    integer = re.fullmatch(r"(U?)Int(8|16|32|64|128|256)", base)
    if integer:
        return ColumnLimits(int_range=int_range(int(integer.group(2)), signed=not integer.group(1)), **common)
    if base == "Decimal":
        return ColumnLimits(decimal=(int(args[0]), int(args[1]) if len(args) > 1 else 0), **common)
    if base.upper() in _DECIMAL_PRECISION:
        return ColumnLimits(decimal=(_DECIMAL_PRECISION[base.upper()], int(args[0])), **common)
    if base == "FixedString":
        return ColumnLimits(max_bytes=int(args[0]), **common)
    if base == "Float32":
        return ColumnLimits(single_precision=True, **common)
    if base == "Date":
        return ColumnLimits(**_DATE, **common)
    if base == "Date32":
        return ColumnLimits(**_DATE32, **common)
    if base == "DateTime":
        return ColumnLimits(fraction_digits=0, **_DATETIME, **common)
    if base == "DateTime64":
        return ColumnLimits(fraction_digits=min(int(args[0]), 6) if args else 3, **_DATETIME64, **common)
    return ColumnLimits(**common)


CLICKHOUSE_COLUMNS = ClickHouseColumnRules()
