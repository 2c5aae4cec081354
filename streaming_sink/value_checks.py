"""What a target column can hold, and the per-row checks that send a value it cannot hold to the
dead-letter table instead of the server.

A server in strict mode rejects such a row and, as `max_filter_ratio` is 0, the whole load with it:
the batch would fail on every retry. ClickHouse does worse: it wraps an integer that overflows,
clamps a date out of range and turns NULL into the column's default, silently. So the packaged job
reads each table's column types from the target when it starts (`Target.table_columns`) and checks
every value in Spark before anything is sent; a row that fails goes to the dead-letter table with a
reason naming the table and the column. What is checked is listed in docs/types.md.

Parsing the target's type spellings is pure Python (`column_limits`); `value_problems` builds the
Spark expressions and imports PySpark only when called.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

_DAY_US = 86_400_000_000


def _days(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days


# Ranges (docs/types.md), as days or microseconds from 1970-01-01 UTC, with their text for reasons.
# StarRocks and Doris: DATE and DATETIME from 0000-01-01 (719528 days before 1970, proleptic Gregorian
# like Spark) to 9999-12-31; the text wire formats write no other years, whatever the column.
_OLAP_RANGES = dict(date_days=(-719528, _days(dt.date(9999, 12, 31))),
                    time_micros=(-719528 * _DAY_US, (_days(dt.date(9999, 12, 31)) + 1) * _DAY_US - 1),
                    range_text="0000-01-01 .. 9999-12-31 (UTC)")
_CH_DATE = dict(date_days=(0, _days(dt.date(2149, 6, 6))), range_text="1970-01-01 .. 2149-06-06")
_CH_DATE32 = dict(date_days=(_days(dt.date(1900, 1, 1)), _days(dt.date(2299, 12, 31))), range_text="1900-01-01 .. 2299-12-31")
_CH_DATETIME = dict(time_micros=(0, 4294967295 * 1_000_000), range_text="1970-01-01 00:00:00 .. 2106-02-07 06:28:15 UTC")
_CH_DATETIME64 = dict(time_micros=(_days(dt.date(1900, 1, 1)) * _DAY_US, (_days(dt.date(2299, 12, 31)) + 1) * _DAY_US - 1),
                      range_text="1900-01-01 00:00:00 .. 2299-12-31 23:59:59.999999 UTC")


@dataclass(frozen=True)
class ColumnLimits:
    """What one target column holds, as far as values are checked before sending. None: no limit known."""

    spelling: str  # the type as the target spells it, for reasons
    nullable: bool = True
    int_range: tuple[int, int] | None = None
    max_bytes: int | None = None  # strings: the column's length in bytes
    decimal: tuple[int, int] | None = None  # (precision, scale)
    date_days: tuple[int, int] | None = None  # DATE: first and last day, in days from 1970-01-01
    time_micros: tuple[int, int] | None = None  # timestamps: first and last instant, µs from 1970-01-01 UTC
    range_text: str = ""  # the date or time range as people read it
    fraction_digits: int | None = None  # digits of a second a timestamp column keeps
    single_precision: bool = False  # FLOAT / Float32: a double would be rounded
    holds_non_finite: bool = True  # NaN and infinities


def _int_range(bits: int, signed: bool = True) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


_OLAP_INTS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "INTEGER": 32, "BIGINT": 64, "LARGEINT": 128}
_CH_DECIMAL_PRECISION = {"DECIMAL32": 9, "DECIMAL64": 18, "DECIMAL128": 38, "DECIMAL256": 76}


def _arguments(text: str) -> list[str]:
    match = re.search(r"\((.*)\)\s*$", text)
    return [a.strip() for a in match.group(1).split(",")] if match else []


def column_limits(product: str, spelling: str | None) -> ColumnLimits:
    """The limits of a column of `product` ("starrocks", "doris", "clickhouse") typed `spelling`
    (None: the target cannot say; only what the product as a whole cannot hold is checked)."""
    if spelling is None:
        if product == "clickhouse":
            return ColumnLimits("type unknown")
        return ColumnLimits("type unknown", holds_non_finite=False, **_OLAP_RANGES)
    if product == "clickhouse":
        return _clickhouse_limits(spelling.strip(), spelling.strip())
    return _olap_limits(product, spelling.strip())


def _olap_limits(product: str, spelling: str) -> ColumnLimits:
    nullable = True
    text = spelling
    if re.search(r"\s+NOT\s+NULL\s*$", text, re.IGNORECASE):
        nullable, text = False, re.sub(r"\s+NOT\s+NULL\s*$", "", text, flags=re.IGNORECASE)
    base = re.split(r"[(<\s]", text, maxsplit=1)[0].upper()
    args = _arguments(text) if "<" not in text else []
    common: dict[str, Any] = dict(spelling=spelling, nullable=nullable, holds_non_finite=False, **_OLAP_RANGES)
    if base in _OLAP_INTS:
        return ColumnLimits(int_range=_int_range(_OLAP_INTS[base]), **common)
    if base in ("DECIMAL", "DECIMALV3", "DECIMAL32", "DECIMAL64", "DECIMAL128", "NUMERIC"):
        precision = int(args[0]) if args else 10
        scale = int(args[1]) if len(args) > 1 else 0
        return ColumnLimits(decimal=(precision, scale), **common)
    if base in ("CHAR", "VARCHAR") and args:
        return ColumnLimits(max_bytes=int(args[0]), **common)
    if base == "STRING" and product == "starrocks":
        return ColumnLimits(max_bytes=65533, **common)  # StarRocks STRING is VARCHAR(65533)
    if base == "FLOAT":
        return ColumnLimits(single_precision=True, **common)
    if base in ("DATETIME", "DATETIMEV2"):
        # Doris keeps the declared digits (DATETIME alone is DATETIME(0)); StarRocks keeps microseconds.
        digits = int(args[0]) if args else (0 if product == "doris" else 6)
        return ColumnLimits(fraction_digits=digits, **common)
    return ColumnLimits(**common)


def raw_value_room(product: str, spelling: str | None) -> int | None:
    """Bytes the dead-letter table's `raw_value` column holds (None: no limit to respect).

    StarRocks' and Doris' `_schema` report VARCHAR without its length; for that one column the job
    assumes 65,533 bytes (StarRocks' STRING, and Doris' largest VARCHAR) rather than let a long
    message be refused there and fail its batch on every retry. Doris' STRING holds far more.
    """
    if spelling is None:
        return None
    limits = column_limits(product, spelling)
    if limits.max_bytes is not None or product == "clickhouse":
        return limits.max_bytes
    base = spelling.split("(")[0].strip().upper()
    return 65533 if base in ("VARCHAR", "CHAR") else None


def _clickhouse_limits(spelling: str, text: str, nullable: bool = False) -> ColumnLimits:
    """ClickHouse columns are NOT NULL unless Nullable(...): a NULL would become the type's default."""
    for wrapper in ("Nullable", "LowCardinality"):
        if text.startswith(wrapper + "(") and text.endswith(")"):
            return _clickhouse_limits(spelling, text[len(wrapper) + 1:-1], nullable or wrapper == "Nullable")
    base = re.split(r"[(\s]", text, maxsplit=1)[0]
    args = _arguments(text)
    common: dict[str, Any] = dict(spelling=spelling, nullable=nullable)
    integer = re.fullmatch(r"(U?)Int(8|16|32|64|128|256)", base)
    if integer:
        return ColumnLimits(int_range=_int_range(int(integer.group(2)), signed=not integer.group(1)), **common)
    if base == "Decimal":
        return ColumnLimits(decimal=(int(args[0]), int(args[1]) if len(args) > 1 else 0), **common)
    if base.upper() in _CH_DECIMAL_PRECISION:
        return ColumnLimits(decimal=(_CH_DECIMAL_PRECISION[base.upper()], int(args[0])), **common)
    if base == "FixedString":
        return ColumnLimits(max_bytes=int(args[0]), **common)
    if base == "Float32":
        return ColumnLimits(single_precision=True, **common)
    # Ranges: ClickHouse documentation of Date, Date32, DateTime and DateTime64 (docs/types.md).
    if base == "Date":
        return ColumnLimits(**_CH_DATE, **common)
    if base == "Date32":
        return ColumnLimits(**_CH_DATE32, **common)
    if base == "DateTime":
        return ColumnLimits(fraction_digits=0, **_CH_DATETIME, **common)
    if base == "DateTime64":
        return ColumnLimits(fraction_digits=min(int(args[0]), 6) if args else 3, **_CH_DATETIME64, **common)
    return ColumnLimits(**common)


def value_problems(table: str, field: Any, value: Any, limits: ColumnLimits) -> list[tuple[Any, str]]:
    """(condition, reason) pairs for one Spark field `field` whose value is the Column `value`.

    A condition is true for a row whose value `limits` cannot hold; the reasons name the table and
    column and say what the column is.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    kind, name = field.dataType, field.name
    where = f"column {name!r} of {table} ({limits.spelling})"
    problems: list[tuple[Any, str]] = []
    if not limits.nullable:
        problems.append((value.isNull(), f"{where}: NULL, which the column cannot hold"))
    spark_bits = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}.get(type(kind))
    if spark_bits and limits.int_range:
        low, high = limits.int_range
        spark_low, spark_high = _int_range(spark_bits)
        sides = ([value < F.lit(low)] if low > spark_low else []) + ([value > F.lit(high)] if high < spark_high else [])
        if sides:
            out = sides[0] if len(sides) == 1 else sides[0] | sides[1]
            problems.append((out, f"{where}: integer out of range [{low}, {high}]"))
    if isinstance(kind, T.DecimalType) and limits.decimal:
        precision, scale = limits.decimal
        if kind.precision - kind.scale > precision - scale:
            # in the field's own type: a wider literal would make Spark round the value before comparing
            bound = F.lit(10 ** (precision - scale)).cast(kind)
            problems.append((F.abs(value) >= bound, f"{where}: too many integer digits"))
        if kind.scale > scale:
            problems.append((value != F.round(value, scale), f"{where}: more than {scale} decimal places, would be rounded"))
    if not limits.holds_non_finite:
        non_finite = _non_finite_inside(value, kind)
        if non_finite is not None:
            problems.append((non_finite, f"{where}: NaN or infinity, which the column cannot hold"))
    if isinstance(kind, (T.FloatType, T.DoubleType)):
        if isinstance(kind, T.DoubleType) and limits.single_precision:
            rounded = value.cast("float").cast("double") != value
            problems.append((rounded & ~F.isnan(value), f"{where}: a double that FLOAT would round"))
    if isinstance(kind, T.StringType) and limits.max_bytes is not None:
        problems.append((F.octet_length(value) > F.lit(limits.max_bytes), f"{where}: longer than {limits.max_bytes} bytes"))
    if isinstance(kind, T.DateType) and limits.date_days:
        days = F.unix_date(value)
        out = (days < F.lit(limits.date_days[0])) | (days > F.lit(limits.date_days[1]))
        problems.append((out, f"{where}: date outside {limits.range_text}"))
    if isinstance(kind, T.TimestampType):
        micros = F.unix_micros(value)
        if limits.time_micros:
            out = (micros < F.lit(limits.time_micros[0])) | (micros > F.lit(limits.time_micros[1]))
            problems.append((out, f"{where}: time outside {limits.range_text}"))
        if limits.fraction_digits is not None and limits.fraction_digits < 6:
            unit = 10 ** (6 - limits.fraction_digits)
            problems.append((F.pmod(micros, F.lit(unit)) != 0,
                             f"{where}: keeps {limits.fraction_digits} digits of a second, would truncate"))
    return problems


def _holds_floats(kind: Any) -> bool:
    from pyspark.sql import types as T

    if isinstance(kind, (T.FloatType, T.DoubleType)):
        return True
    if isinstance(kind, T.ArrayType):
        return _holds_floats(kind.elementType)
    if isinstance(kind, T.MapType):
        return _holds_floats(kind.valueType)
    return isinstance(kind, T.StructType) and any(_holds_floats(f.dataType) for f in kind.fields)


def _non_finite_inside(value: Any, kind: Any) -> Any:
    """True where a float anywhere in the value (top level, or inside arrays, map values and structs)
    is NaN or infinite; None for types that hold no floats."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not _holds_floats(kind):
        return None
    if isinstance(kind, (T.FloatType, T.DoubleType)):
        return F.isnan(value) | (F.abs(value) == F.lit(float("inf")))
    if isinstance(kind, T.ArrayType):
        return F.exists(value, lambda item: F.coalesce(_non_finite_inside(item, kind.elementType), F.lit(False)))
    if isinstance(kind, T.MapType):
        return _non_finite_inside(F.map_values(value), T.ArrayType(kind.valueType))
    found = F.lit(False)
    for f in kind.fields:
        if _holds_floats(f.dataType):
            found = found | F.coalesce(_non_finite_inside(value[f.name], f.dataType), F.lit(False))
    return found
