"""What a target's columns hold and how it names them: the facts the job's value checks and column
checks read from a target's descriptor, so no module outside `targets/` knows a product's type grammar.

Each target gives one `ColumnRules` (its type spellings -> `ColumnLimits`, and whether its column
names are case-sensitive); the job checks every value against the limits in Spark before anything is
sent (streaming_sink/value_checks.py), and what is checked is listed in docs/types.md.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Protocol

DAY_US = 86_400_000_000


def days_from_epoch(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days


def int_range(bits: int, signed: bool = True) -> tuple[int, int]:
    """The values an integer of `bits` holds."""
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def type_arguments(spelling: str) -> list[str]:
    """The arguments of a type spelling: `DECIMAL(10, 2)` -> ["10", "2"]."""
    match = re.search(r"\((.*)\)\s*$", spelling)
    return [a.strip() for a in match.group(1).split(",")] if match else []


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


class ColumnRules(Protocol):
    """A target's column facts: its type grammar and its identifier rule."""

    @property
    def case_sensitive_names(self) -> bool:
        """Whether `Id` and `id` name two columns (ClickHouse) or one (StarRocks, Doris)."""
        ...

    def limits(self, spelling: str | None) -> ColumnLimits:
        """The limits of a column typed `spelling` (None: the target cannot say; only what the product as a
        whole cannot hold is checked)."""
        ...

    def raw_value_room(self, spelling: str | None) -> int | None:
        """Bytes the dead-letter table's `raw_value` column, typed `spelling`, holds (None: no limit to respect)."""
        ...

    def table_name_problem(self, name: str) -> str | None:
        """Why the target cannot name a table `name` (None: it can), checked before any data moves."""
        ...

    def spark_type(self, spelling: str) -> str | None:
        """The Spark SQL type a message's JSON field is parsed as for a column typed `spelling` (a table whose
        schema the job takes from the target); None for a type the job cannot fill (arrays, maps, ...)."""
        ...


def integer_spark_type(bits: int, signed: bool = True) -> str:
    """The narrowest Spark type holding every integer of `bits` (DECIMAL beyond 64 bits)."""
    needed = bits if signed else bits + 1
    for width, name in ((8, "TINYINT"), (16, "SMALLINT"), (32, "INT"), (64, "BIGINT")):
        if needed <= width:
            return name
    return "DECIMAL(38,0)" if needed > 65 else "DECIMAL(20,0)"


def column_key(rules: ColumnRules, name: str) -> str:
    """The name as the target compares column names."""
    return name if rules.case_sensitive_names else name.lower()
