"""Typed value conversion: a CSV field, JSON value or Arrow value to its column's Python value, or a failure.

The rules are docs/protocol.md, "Common: value conversion" and "Common: strict mode"; what differs between
StarRocks and Doris is a ``ConversionRules``. A failed conversion raises ``ConversionError`` (the caller
decides between NULL and a filtered row); a too-long string raises ``TooLong``, which carries the truncated
value for the products that truncate. ``to_storage`` / ``from_storage`` are the exact JSON form of a typed
value, for persistence and the admin API.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from tests.support.doubles.emulators.column_types import INT_BITS, NESTED, ColumnType


class ConversionError(ValueError):
    """A value that does not convert to its column type (strict mode filters the row, else NULL)."""


class TooLong(ConversionError):
    """A string longer than its column; what follows depends on the product (``ConversionRules``)."""

    def __init__(self, message: str, truncated: Any) -> None:
        super().__init__(message)
        self.truncated = truncated


@dataclass(frozen=True)
class ConversionRules:
    """The product-dependent parts of value conversion (docs/protocol.md, "Common: strict mode" and
    "Common: value conversion").

    ``long_string``: what a too-long CHAR/VARCHAR becomes with strict mode off: "null" (StarRocks: a failed
    conversion), "filter" (Doris before 4.0: a data-quality error whatever strict mode says) or "truncate"
    (Doris 4.x docs). With strict mode on it is always filtered.
    ``string_max_bytes``: StarRocks STRING is VARCHAR(65533).
    ``datetime_default_scale``: fraction digits of a bare DATETIME: StarRocks keeps microseconds (6), Doris
    DATETIME means DATETIME(0).
    """

    long_string: str = "null"
    string_max_bytes: int | None = None
    datetime_default_scale: int = 6


STARROCKS_RULES = ConversionRules(long_string="null", string_max_bytes=65533, datetime_default_scale=6)
DORIS_RULES = ConversionRules(long_string="filter", datetime_default_scale=0)

_INT_TEXT = re.compile(r"[+-]?\d+")
_DECIMAL_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_FLOAT_TEXT = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf|infinity|nan)", re.I)
_DATE_FORMATS = ("%Y-%m-%d", "%Y%m%d", "%Y/%m/%d")
_DATETIME_RE = re.compile(
    r"(\d{4})-?(\d{1,2})-?(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d{1,9}))?)?")


def _fail(value: Any, what: str) -> ConversionError:
    return ConversionError(f"{value!r} is not a valid {what}")


def _to_int(value: Any, ctype: ColumnType) -> int:
    """Common: value conversion (integers): decimal digits only; out of range is a failed conversion."""
    if isinstance(value, bool):
        value = int(value)
    elif isinstance(value, float):
        if not value.is_integer():
            raise _fail(value, ctype.base)
        value = int(value)
    elif isinstance(value, decimal.Decimal):
        if value != value.to_integral_value():
            raise _fail(value, ctype.base)
        value = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not _INT_TEXT.fullmatch(text):
            raise _fail(value, ctype.base)
        value = int(text)
    if not isinstance(value, int):
        raise _fail(value, ctype.base)
    bits = INT_BITS[ctype.base]
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ConversionError(f"{value} is out of range for {ctype.base}")
    return value


def _to_float(value: Any, ctype: ColumnType) -> float:
    """Common: value conversion (FLOAT/DOUBLE): nan, inf, infinity (any case, signed) are values; a literal that
    overflows to infinity is a failed conversion. FLOAT keeps float32 precision."""
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal, str)):
        raise _fail(value, ctype.base)
    if isinstance(value, str):
        text = value.strip()
        if not _FLOAT_TEXT.fullmatch(text):
            raise _fail(value, ctype.base)
        number = float(text)
        spelled_inf = "i" in text.lower()
    else:
        try:
            number = float(value)
        except OverflowError:
            raise ConversionError(f"{value!r} overflows {ctype.base}") from None
        spelled_inf = isinstance(value, float) and math.isinf(value)
    if ctype.base == "FLOAT" and math.isfinite(number):
        try:  # round to the nearest float32, as the servers' parsers do; beyond the largest one it overflows
            number = struct.unpack("<f", struct.pack("<f", number))[0]
        except OverflowError:
            number = math.copysign(math.inf, number)
    if math.isinf(number) and not spelled_inf:
        raise ConversionError(f"{value!r} overflows {ctype.base}")
    return number


def _to_decimal(value: Any, ctype: ColumnType) -> decimal.Decimal:
    """Common: value conversion (DECIMAL): extra scale is rounded half up; too many integer digits fail."""
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal, str)):
        raise _fail(value, "DECIMAL")
    if isinstance(value, str):
        text = value.strip()
        if not _DECIMAL_TEXT.fullmatch(text):
            raise _fail(value, "DECIMAL")
        number = decimal.Decimal(text)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _fail(value, "DECIMAL")
        number = decimal.Decimal(repr(value))
    else:
        number = decimal.Decimal(value)
    precision, scale = ctype.precision_scale
    with decimal.localcontext() as ctx:
        ctx.prec = 200
        number = number.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
        too_big = abs(number) >= decimal.Decimal(10) ** (precision - scale)  # abs() rounds to the context's digits
    if too_big:
        raise ConversionError(f"{value!r} overflows DECIMAL({precision},{scale})")
    return number


def _to_bool(value: Any) -> bool:
    """Common: value conversion (BOOLEAN): true/false in any case, or 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise _fail(value, "BOOLEAN")


def _round_fraction(moment: dt.datetime, scale: int) -> dt.datetime:
    """Keep ``scale`` fraction digits, rounding half up (Doris DATETIME(p); rounding is UNCONFIRMED)."""
    if scale >= 6:
        return moment
    unit = 10 ** (6 - scale)
    micros = (moment.microsecond + unit // 2) // unit * unit
    return moment.replace(microsecond=0) + dt.timedelta(microseconds=micros)


def _to_datetime(value: Any, ctype: ColumnType, rules: ConversionRules) -> Any:
    """Common: value conversion (DATE, DATETIME): yyyy-MM-dd or yyyyMMdd, optionally ' HH:mm:ss[.f]' or 'T...';
    0001-01-01..9999-12-31 (year 0 exists on the servers but not in Python: refused here)."""
    if isinstance(value, dt.datetime):
        moment = value.astimezone(dt.timezone.utc).replace(tzinfo=None) if value.tzinfo else value
    elif isinstance(value, dt.date):
        moment = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        match = _DATETIME_RE.fullmatch(value.strip())
        if not match:
            raise _fail(value, ctype.base)
        year, month, day, hour, minute, second, fraction = match.groups()
        try:
            moment = dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                                 int(second or 0), int((fraction or "0")[:6].ljust(6, "0")))
        except ValueError:
            raise _fail(value, ctype.base) from None
        if fraction and len(fraction) > 6 and int(fraction[6]) >= 5:
            moment += dt.timedelta(microseconds=1)
    else:
        raise _fail(value, ctype.base)
    if ctype.base == "DATE":
        return moment.date()
    scale = ctype.args[0] if ctype.args else rules.datetime_default_scale
    try:
        return _round_fraction(moment, scale)
    except OverflowError:
        raise _fail(value, ctype.base) from None


def _to_string(value: Any, ctype: ColumnType, rules: ConversionRules) -> str:
    """Common: value conversion (CHAR, VARCHAR, STRING): lengths count UTF-8 bytes; JSON values that are not
    strings keep their JSON text."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
    elif isinstance(value, (dt.date, decimal.Decimal)):
        text = str(value)
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    limit = ctype.length if ctype.base != "STRING" else rules.string_max_bytes
    encoded = text.encode("utf-8")
    if limit is not None and len(encoded) > limit:
        truncated = encoded[:limit].decode("utf-8", errors="ignore")
        raise TooLong(f"the length of input {len(encoded)} exceeds {ctype.spelled()}", truncated)
    return text


def reject_json_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def parse_json_text(text: str) -> Any:
    """Strict JSON: NaN and Infinity are not JSON (the servers' parsers refuse them)."""
    return json.loads(text, parse_constant=reject_json_constant)


def _parse_complex_text(text: str) -> Any:
    """The text form of ARRAY, MAP and STRUCT values in CSV loads: ``[1,2]``, ``{"k":1}``, ``{k:1}``.

    Strings may be quoted with " or '; unquoted tokens are kept as text (``null`` is NULL) and converted by the
    element type. Maps and structs come back as lists of (key, value) pairs, in text order.
    """
    pos = 0

    def skip() -> None:
        nonlocal pos
        while pos < len(text) and text[pos].isspace():
            pos += 1

    def token() -> Any:
        nonlocal pos
        skip()
        if pos >= len(text):
            raise ValueError("unexpected end")
        ch = text[pos]
        if ch == "[":
            pos += 1
            items: list[Any] = []
            skip()
            if text.startswith("]", pos):
                pos += 1
                return items
            while True:
                items.append(token())
                skip()
                if text.startswith(",", pos):
                    pos += 1
                    continue
                if text.startswith("]", pos):
                    pos += 1
                    return items
                raise ValueError("expected , or ]")
        if ch == "{":
            pos += 1
            pairs: list[tuple[Any, Any]] = []
            skip()
            if text.startswith("}", pos):
                pos += 1
                return _Pairs(pairs)
            while True:
                key = token()
                skip()
                if not text.startswith(":", pos):
                    raise ValueError("expected :")
                pos += 1
                pairs.append((key, token()))
                skip()
                if text.startswith(",", pos):
                    pos += 1
                    continue
                if text.startswith("}", pos):
                    pos += 1
                    return _Pairs(pairs)
                raise ValueError("expected , or }")
        if ch in "\"'":
            end = pos + 1
            out: list[str] = []
            while end < len(text) and text[end] != ch:
                if text[end] == "\\" and end + 1 < len(text):
                    end += 1
                out.append(text[end])
                end += 1
            if end >= len(text):
                raise ValueError("unterminated string")
            pos = end + 1
            return _Quoted("".join(out))
        end = pos
        while end < len(text) and text[end] not in ",:]}":
            end += 1
        raw = text[pos:end].strip()
        pos = end
        return None if raw.lower() == "null" else raw

    value = token()
    skip()
    if pos != len(text):
        raise ValueError("trailing text")
    return value


class _Quoted(str):
    """A quoted string inside a complex-type literal (so ``"null"`` stays text)."""


class _Pairs(list):  # type: ignore[type-arg]
    """Key/value pairs of a ``{...}`` literal, in order."""


def _to_nested(value: Any, ctype: ColumnType, rules: ConversionRules) -> Any:
    """Common: value conversion (ARRAY, MAP, STRUCT): any element that fails fails the whole value."""
    if isinstance(value, str) and not isinstance(value, _Quoted):
        try:
            value = _parse_complex_text(value)
        except ValueError as exc:
            raise ConversionError(f"{value!r} is not a valid {ctype.spelled()}: {exc}") from None
    if ctype.base == "ARRAY":
        if not isinstance(value, (list, tuple)) or isinstance(value, _Pairs):
            raise _fail(value, ctype.spelled())
        return [_element(v, ctype.children[0], rules) for v in value]
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, _Pairs) or (isinstance(value, list) and all(
            isinstance(p, tuple) and len(p) == 2 for p in value)):
        pairs = list(value)  # pyarrow gives MAP values as (key, value) tuples
    else:
        raise _fail(value, ctype.spelled())
    if ctype.base == "MAP":
        out: dict[Any, Any] = {}
        for key, item in pairs:
            converted = _element(key, ctype.children[0], rules)
            if converted is None:
                raise ConversionError(f"NULL map key in {value!r}")
            out[_hashable(converted)] = _element(item, ctype.children[1], rules)
        return out
    given = {str(k).lower(): v for k, v in pairs}
    if set(given) - {n.lower() for n in ctype.field_names}:
        raise ConversionError(f"unknown STRUCT field in {value!r}")
    return {name: _element(given.get(name.lower()), child, rules)
            for name, child in zip(ctype.field_names, ctype.children)}


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _element(value: Any, ctype: ColumnType, rules: ConversionRules) -> Any:
    if value is None:
        return None
    try:
        return convert_value(value, ctype, rules)
    except TooLong:
        raise ConversionError(f"{value!r} is too long for {ctype.spelled()}") from None


def convert_value(value: Any, ctype: ColumnType, rules: ConversionRules = STARROCKS_RULES) -> Any:
    """Convert one CSV field (str), JSON value or Arrow value to ``ctype``'s Python type, or raise.

    The rules are docs/protocol.md, "Common: value conversion"; ``TooLong`` carries the truncated value for the
    products that truncate.
    """
    base = ctype.base
    if base in INT_BITS:
        return _to_int(value, ctype)
    if base in ("FLOAT", "DOUBLE"):
        return _to_float(value, ctype)
    if base == "DECIMAL":
        return _to_decimal(value, ctype)
    if base == "BOOLEAN":
        return _to_bool(value)
    if base in ("DATE", "DATETIME"):
        return _to_datetime(value, ctype, rules)
    if base in NESTED:
        return _to_nested(value, ctype, rules)
    if base == "JSON":
        if isinstance(value, str) and not isinstance(value, _Quoted):
            try:
                return parse_json_text(value)
            except ValueError:
                raise _fail(value, "JSON") from None
        if isinstance(value, (dict, list, str, int, float, bool)) and not (
                isinstance(value, float) and not math.isfinite(value)):
            return value
        raise _fail(value, "JSON")
    if base == "VARBINARY":
        data = value if isinstance(value, bytes) else str(value).encode("utf-8") if isinstance(value, str) else None
        if data is None:
            raise _fail(value, base)
        if ctype.length is not None and len(data) > ctype.length:
            raise TooLong(f"the length of input {len(data)} exceeds {ctype.spelled()}", data[:ctype.length])
        return data
    return _to_string(value, ctype, rules)


def to_storage(value: Any, ctype: ColumnType) -> Any:
    """A typed value as plain JSON (persistence and the admin API); ``from_storage`` reverses it exactly."""
    if value is None:
        return None
    base = ctype.base
    if base in ("DATE", "DATETIME"):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if base == "DECIMAL":
        return str(value)
    if base in ("FLOAT", "DOUBLE"):
        return value if math.isfinite(value) else repr(value)
    if base == "VARBINARY":
        return base64.b64encode(value).decode("ascii")
    if base == "JSON":
        return json.dumps(value, ensure_ascii=False)
    if base == "ARRAY":
        return [to_storage(v, ctype.children[0]) for v in value]
    if base == "MAP":
        return [[to_storage(list(k) if isinstance(k, tuple) else k, ctype.children[0]),
                 to_storage(v, ctype.children[1])] for k, v in value.items()]
    if base == "STRUCT":
        return {n: to_storage(value.get(n), c) for n, c in zip(ctype.field_names, ctype.children)}
    return value


def from_storage(value: Any, ctype: ColumnType) -> Any:
    """Inverse of ``to_storage``."""
    if value is None:
        return None
    base = ctype.base
    if base == "DATE":
        return dt.date.fromisoformat(value)
    if base == "DATETIME":
        return dt.datetime.fromisoformat(value)
    if base == "DECIMAL":
        return decimal.Decimal(value)
    if base in ("FLOAT", "DOUBLE"):
        return float(value)
    if base == "VARBINARY":
        return base64.b64decode(value)
    if base == "JSON":
        return json.loads(value)
    if base == "ARRAY":
        return [from_storage(v, ctype.children[0]) for v in value]
    if base == "MAP":
        return {_hashable(from_storage(k, ctype.children[0])): from_storage(v, ctype.children[1]) for k, v in value}
    if base == "STRUCT":
        return {n: from_storage(value.get(n), c) for n, c in zip(ctype.field_names, ctype.children)}
    return value


def encode_cell(value: Any, ctype: ColumnType | None = None) -> Any:
    """A typed value as JSON; without its type, a best effort (kept for older callers)."""
    if ctype is not None:
        return to_storage(value, ctype)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def decode_cell(value: Any, ctype: ColumnType) -> Any:
    """Inverse of ``encode_cell`` with a type."""
    return from_storage(value, ctype)
