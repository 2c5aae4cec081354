"""What a target column can hold, and the per-row checks that send a value it cannot hold to the
dead-letter table instead of the server.

A server in strict mode rejects such a row and, as `max_filter_ratio` is 0, the whole load with it:
the batch would fail on every retry. ClickHouse does worse: it wraps an integer that overflows,
clamps a date out of range and turns NULL into the column's default, silently. So the packaged job
reads each table's column types from the target when it starts (`Target.table_columns`) and checks
every value in Spark before anything is sent; a row that fails goes to the dead-letter table with a
reason naming the table and the column. What is checked is listed in docs/types.md.

Each target's descriptor parses its own type spellings into `ColumnLimits` (streaming_sink/targets/columns.py);
`value_problems` builds the Spark expressions and imports PySpark only when called.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from .targets.columns import ColumnLimits, int_range


def value_problems(table: str, field: Any, value: Any, limits: ColumnLimits, text: Any = None) -> list[tuple[Any, str]]:
    """(condition, reason) pairs for one Spark field `field` whose value is the Column `value` (`text`: the field's
    JSON text, where the parsed value cannot show a fraction: a DECIMAL(38,0) holding a 128-bit integer).

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
        spark_low, spark_high = int_range(spark_bits)
        sides = ([value < F.lit(low)] if low > spark_low else []) + ([value > F.lit(high)] if high < spark_high else [])
        if sides:
            out = sides[0] if len(sides) == 1 else sides[0] | sides[1]
            problems.append((out, f"{where}: integer out of range [{low}, {high}]"))
    if isinstance(kind, T.DecimalType) and limits.int_range:  # an integer wider than BIGINT (UInt64, LARGEINT)
        low, high = limits.int_range
        digits = kind.precision - kind.scale  # a bound beyond the field's digits cannot be passed
        sides = [side for bound, side in ((low, value < F.lit(Decimal(low))), (high, value > F.lit(Decimal(high))))
                 if abs(bound) < 10 ** digits]
        if sides:
            problems.append((sides[0] if len(sides) == 1 else sides[0] | sides[1], f"{where}: integer out of range [{low}, {high}]"))
        if kind.scale > 0:
            problems.append((value != F.round(value, 0), f"{where}: not an integer"))
        elif text is not None:  # a number with places or an exponent, unless its places are zeros
            problems.append((text.rlike(r"[.eE]") & ~text.rlike(r"^-?[0-9]+\.0*$"), f"{where}: not an integer"))
    if isinstance(kind, T.DecimalType) and limits.decimal:
        precision, scale = limits.decimal
        if kind.precision - kind.scale > precision - scale:
            # in the field's own type: a wider literal would make Spark round the value before comparing
            bound = F.lit(10 ** (precision - scale)).cast(kind)
            problems.append((F.abs(value) >= bound, f"{where}: too many integer digits"))
        if kind.scale > scale:
            problems.append((value != F.round(value, scale), f"{where}: more than {scale} decimal places, would be rounded"))
        elif text is not None:  # parsed at the column's scale: a digit past it that is not a zero was rounded away
            problems.append((text.rlike(rf"\.[0-9]{{{kind.scale}}}[0-9]*[1-9]"),
                             f"{where}: more than {scale} decimal places, would be rounded"))
    if not limits.holds_non_finite:
        non_finite = _non_finite_inside(value, kind)
        if non_finite is not None:
            problems.append((non_finite, f"{where}: NaN or infinity, which the column cannot hold"))
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
