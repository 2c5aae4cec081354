"""The column type grammar StarRocks and Doris share (MySQL-like spellings, as their `_schema` APIs
report them), with the two points where they differ as parameters. Ranges and lengths: docs/types.md."""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from .columns import DAY_US, ColumnLimits, days_from_epoch, int_range, integer_spark_type, type_arguments

# DATE and DATETIME from 0000-01-01 (719528 days before 1970, proleptic Gregorian like Spark) to
# 9999-12-31; the text wire formats write no other years, whatever the column.
_LAST_DAY = days_from_epoch(dt.date(9999, 12, 31))
_RANGES: dict[str, Any] = dict(date_days=(-719528, _LAST_DAY), time_micros=(-719528 * DAY_US, (_LAST_DAY + 1) * DAY_US - 1),
                               range_text="0000-01-01 .. 9999-12-31 (UTC)")
_INTS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "INTEGER": 32, "BIGINT": 64, "LARGEINT": 128}
_DECIMALS = ("DECIMAL", "DECIMALV3", "DECIMAL32", "DECIMAL64", "DECIMAL128", "NUMERIC")
#: types a JSON field fills as it is: base name -> Spark type (integers and decimals below)
_SPARK_TYPES = {"BOOLEAN": "BOOLEAN", "FLOAT": "FLOAT", "DOUBLE": "DOUBLE", "CHAR": "STRING", "VARCHAR": "STRING",
                "STRING": "STRING", "DATE": "DATE", "DATETIME": "TIMESTAMP"}
#: `_schema` reports VARCHAR without its length: StarRocks' STRING and Doris' largest VARCHAR hold this many bytes
_UNSIZED_VARCHAR_BYTES = 65533


@dataclass(frozen=True)
class OlapColumnRules:
    """StarRocks' or Doris' columns. Column names are case-insensitive in both; no column holds NaN."""

    string_bytes: int | None  # STRING's length in bytes (None: more than a message holds)
    datetime_digits: int  # digits of a second DATETIME without a precision keeps
    product: str  # for messages
    table_name_marks: str = "_"  # what a table name may hold besides letters and digits
    case_sensitive_names: bool = False

    def table_name_problem(self, name: str) -> str | None:
        """Letters (Unicode ones too, which a server may allow: Doris' enable_unicode_name_support), digits and the
        product's marks only: a '.', a quote or a space is refused by the server's name check, so here first."""
        odd = sorted({c for c in name if not (c.isalnum() or c in self.table_name_marks)})
        if not odd:
            return None
        marks = " and ".join(repr(m) for m in self.table_name_marks)
        return f"{self.product} table names hold letters, digits and {marks} only, not {''.join(odd)!r}"

    def limits(self, spelling: str | None) -> ColumnLimits:
        if spelling is None:
            return ColumnLimits("type unknown", holds_non_finite=False, **_RANGES)
        spelling = spelling.strip()
        nullable, text = True, spelling
        if re.search(r"\s+NOT\s+NULL\s*$", text, re.IGNORECASE):
            nullable, text = False, re.sub(r"\s+NOT\s+NULL\s*$", "", text, flags=re.IGNORECASE)
        base = re.split(r"[(<\s]", text, maxsplit=1)[0].upper()
        args = type_arguments(text) if "<" not in text else []
        common: dict[str, Any] = dict(spelling=spelling, nullable=nullable, holds_non_finite=False, **_RANGES)
        if base in _INTS:
            return ColumnLimits(int_range=int_range(_INTS[base]), **common)
        if base in _DECIMALS:
            return ColumnLimits(decimal=(int(args[0]) if args else 10, int(args[1]) if len(args) > 1 else 0), **common)
        if base in ("CHAR", "VARCHAR") and args:
            return ColumnLimits(max_bytes=int(args[0]), **common)
        if base == "STRING" and self.string_bytes is not None:
            return ColumnLimits(max_bytes=self.string_bytes, **common)
        if base == "FLOAT":
            return ColumnLimits(single_precision=True, **common)
        if base in ("DATETIME", "DATETIMEV2"):
            return ColumnLimits(fraction_digits=int(args[0]) if args else self.datetime_digits, **common)
        return ColumnLimits(**common)

    def spark_type(self, spelling: str) -> str | None:
        text = re.sub(r"\s+NOT\s+NULL\s*$", "", spelling.strip(), flags=re.IGNORECASE)
        base = re.split(r"[(<\s]", text, maxsplit=1)[0].upper()
        if base in _INTS:
            return integer_spark_type(_INTS[base])
        decimal = self.limits(text).decimal
        if decimal is not None:
            return f"DECIMAL({min(decimal[0], 38)},{decimal[1]})"
        return _SPARK_TYPES.get(base)

    def raw_value_room(self, spelling: str | None) -> int | None:
        """A VARCHAR reported without its length is taken as 65,533 bytes, rather than let a long message be
        refused there and fail its batch on every retry."""
        if spelling is None:
            return None
        limits = self.limits(spelling)
        if limits.max_bytes is not None:
            return limits.max_bytes
        base = spelling.split("(")[0].strip().upper()
        return _UNSIZED_VARCHAR_BYTES if base in ("VARCHAR", "CHAR") else None


#: StarRocks: STRING is VARCHAR(65533); DATETIME keeps microseconds.
STARROCKS_COLUMNS = OlapColumnRules(string_bytes=65533, datetime_digits=6, product="StarRocks")
#: Doris: STRING holds far more than a message; DATETIME alone is DATETIME(0).
DORIS_COLUMNS = OlapColumnRules(string_bytes=None, datetime_digits=0, product="Doris", table_name_marks="_-")
