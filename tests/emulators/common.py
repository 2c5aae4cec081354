"""What the StarRocks and Doris emulators share, so nothing is written twice.

The emulators are test doubles of the *wire protocol* described in docs/protocol.md (cited below
by its source keys, e.g. SR-RBA, D-DTM, or by section name, e.g. "StarRocks: responses"). This
module holds the parts that do not depend on the product:

* ``Clock``: a controllable clock; every timeout and label retention is measured on it.
* ``Faults`` / ``Knob``: fault-injection knobs armed for the next N matching requests.
* column types, CSV/JSON parsing and typed conversion with filtered-row accounting.
* ``Store``: databases, tables, transactions and their rows, persisted to a sqlite3 file in the
  data dir (one SQL transaction per state change), so a restarted emulator keeps its history.
* ``BaseEmulator``: the FE and BE listeners, Basic auth, the 307 helper, lazy expiry (``tick``),
  the generic fault knobs, the ``/__emulator/`` admin API and the Python API both emulators expose.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import itertools
import json
import math
import os
import re
import socket
import sqlite3
import struct
import threading
import traceback
import uuid
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator, Optional
from urllib.parse import parse_qs, unquote, urlsplit

# --------------------------------------------------------------------------------------------
# Clock
# --------------------------------------------------------------------------------------------


class Clock:
    """Emulated wall clock (seconds). Only ``advance`` moves it, so timeouts are deterministic."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[float], None]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward; expiry itself is evaluated lazily by the emulator (``tick``)."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        with self._lock:
            self._now += float(seconds)
            now = self._now
        for listener in list(self._listeners):
            listener(now)
        return now

    def set(self, value: float) -> None:
        """Restore a persisted time (used when an emulator reopens a data dir)."""
        with self._lock:
            self._now = float(value)

    def on_change(self, listener: Callable[[float], None]) -> None:
        self._listeners.append(listener)


# --------------------------------------------------------------------------------------------
# Fault knobs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """What a request is, for knob matching: the protocol op, its label/db and the listener role."""

    op: str
    role: str
    label: Optional[str] = None
    db: Optional[str] = None


@dataclass
class _Arm:
    times: int
    label: Optional[str]
    op: Optional[str]
    role: Optional[str]
    params: dict[str, Any]


class Knob:
    """One fault, armed for the next ``times`` matching requests (optionally one label/op/role)."""

    def __init__(self, name: str, doc: str = "") -> None:
        self.name = name
        self.__doc__ = doc
        self._arms: list[_Arm] = []
        self._lock = threading.Lock()
        self.fired = 0

    def arm(self, times: int = 1, label: Optional[str] = None, op: Optional[str] = None,
            role: Optional[str] = None, **params: Any) -> "Knob":
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._arms.append(_Arm(times, label, op, role, dict(params)))
        return self

    def disarm(self) -> None:
        with self._lock:
            self._arms.clear()

    @property
    def armed(self) -> bool:
        with self._lock:
            return bool(self._arms)

    def take(self, call: Call) -> Optional[dict[str, Any]]:
        """Consume one arming that matches ``call``; return its params (a dict, maybe empty)."""
        with self._lock:
            for arm in self._arms:
                if arm.label is not None and arm.label != call.label:
                    continue
                if arm.op is not None and arm.op.lower() != call.op.lower():
                    continue
                if arm.role is not None and arm.role != call.role:
                    continue
                arm.times -= 1
                if arm.times <= 0:
                    self._arms.remove(arm)
                self.fired += 1
                return dict(arm.params)
        return None


class Faults:
    """The knob set of one emulator; each knob is an attribute (``emu.faults.http_5xx.arm()``)."""

    def __init__(self, knobs: dict[str, str]) -> None:
        self._knobs = {name: Knob(name, doc) for name, doc in knobs.items()}
        # Set to cut every pending ``slow_response`` short (tests, stop()).
        self.wake = threading.Event()

    def __getattr__(self, name: str) -> Knob:
        knobs = self.__dict__.get("_knobs", {})
        if name in knobs:
            return knobs[name]
        raise AttributeError(f"unknown fault knob {name!r}; known: {sorted(knobs)}")

    def names(self) -> list[str]:
        return sorted(self._knobs)

    def reset(self) -> None:
        for knob in self._knobs.values():
            knob.disarm()

    def release(self) -> None:
        """Let every delayed answer go now; later arms wait again."""
        old, self.wake = self.wake, threading.Event()
        old.set()


# The knobs both emulators implement generically in BaseEmulator (product-specific ones are
# added by each emulator). Values are short docs, surfaced by the admin API.
GENERIC_KNOBS: dict[str, str] = {
    "drop_connection_before": "close the socket without acting or answering",
    "http_5xx": "answer HTTP `status` (default 503) without acting",
    "slow_response": "act, then delay the answer by `seconds` (default 1) on an Event",
    "drop_connection_after_commit": "apply a commit, then close the socket without an answer",
    "expire_prepared": "time out the label's prepared/pre-committed txn before handling",
}


# --------------------------------------------------------------------------------------------
# Column types and typed conversion
# --------------------------------------------------------------------------------------------

_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64, "LARGEINT": 128}
# Spellings both products accept for one type, mapped to the name the emulator reasons with.
_ALIASES = {
    "INTEGER": "INT", "BOOL": "BOOLEAN", "TEXT": "STRING", "NUMERIC": "DECIMAL", "DECIMALV3": "DECIMAL",
    "DECIMALV2": "DECIMAL", "DATEV2": "DATE", "DATETIMEV2": "DATETIME", "JSONB": "JSON", "BINARY": "VARBINARY",
}
_SCALARS = set(_INT_BITS) | {"BOOLEAN", "FLOAT", "DOUBLE", "DECIMAL", "CHAR", "VARCHAR", "STRING", "DATE", "DATETIME",
                             "JSON", "VARBINARY"}
_NESTED = {"ARRAY", "MAP", "STRUCT"}
_TYPE_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\(|\)|<|>|,|:|\d+)")


@dataclass(frozen=True)
class ColumnType:
    """A column type: canonical base name, (length | precision, scale | fraction digits), element types, nullability.

    ``declared`` keeps the name as written (e.g. DECIMALV2, DATETIMEV2), which the ``_schema`` endpoints report.
    ARRAY<T> has one child, MAP<K,V> two, STRUCT<a T, b U> one per field with ``field_names``.
    """

    base: str
    args: tuple[int, ...] = ()
    nullable: bool = True
    children: tuple["ColumnType", ...] = ()
    field_names: tuple[str, ...] = ()
    declared: str = ""

    @classmethod
    def parse(cls, text: str) -> "ColumnType":
        body = re.sub(r"\s+NOT\s+NULL\s*$|\s+NULL\s*$", "", text.strip(), flags=re.I)
        nullable = not re.search(r"\bNOT\s+NULL\s*$", text.strip(), flags=re.I)
        tokens = [t for t in _TYPE_TOKEN.findall(body)]
        if "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", body):
            raise ValueError(f"unsupported column type {text!r}")
        try:
            ctype, rest = cls._parse_tokens(tokens)
        except (IndexError, ValueError) as exc:
            raise ValueError(f"unsupported column type {text!r}: {exc}") from None
        if rest:
            raise ValueError(f"unsupported column type {text!r}")
        return ColumnType(ctype.base, ctype.args, nullable, ctype.children, ctype.field_names, ctype.declared)

    @classmethod
    def _parse_tokens(cls, tokens: list[str]) -> tuple["ColumnType", list[str]]:
        name, rest = tokens[0].upper(), tokens[1:]
        base = _ALIASES.get(name, name)
        if base not in _SCALARS | _NESTED:
            raise ValueError(f"unknown type {name}")
        args: list[int] = []
        if rest and rest[0] == "(":
            rest = rest[1:]
            while rest[0] != ")":
                if rest[0] != ",":
                    args.append(int(rest[0]))
                rest = rest[1:]
            rest = rest[1:]
        children: list[ColumnType] = []
        names: list[str] = []
        if base in _NESTED:
            if not rest or rest[0] != "<":
                raise ValueError(f"{base} needs element types")
            rest = rest[1:]
            while True:
                if base == "STRUCT":
                    names.append(rest[0])
                    rest = rest[1:]
                    if rest[0] == ":":
                        rest = rest[1:]
                child, rest = cls._parse_tokens(rest)
                children.append(child)
                if rest[0] == ",":
                    rest = rest[1:]
                    continue
                if rest[0] != ">":
                    raise ValueError("expected '>'")
                rest = rest[1:]
                break
            expected = {"ARRAY": 1, "MAP": 2}.get(base)
            if expected is not None and len(children) != expected:
                raise ValueError(f"{base} takes {expected} element type(s)")
        return cls(base, tuple(args), True, tuple(children), tuple(names), name), rest

    @property
    def length(self) -> Optional[int]:
        """CHAR/VARCHAR/VARBINARY length in bytes, if declared."""
        return self.args[0] if self.args and self.base in ("CHAR", "VARCHAR", "VARBINARY") else None

    @property
    def precision_scale(self) -> tuple[int, int]:
        """DECIMAL(p[,s]); without arguments DECIMAL(10,0), as in MySQL and both products."""
        return (self.args[0] if self.args else 10, self.args[1] if len(self.args) > 1 else 0)

    def spelled(self) -> str:
        """Upper-case spelling with arguments, e.g. DECIMAL(10,2), MAP<VARCHAR(10),INT>."""
        text = self.base + (f"({','.join(str(a) for a in self.args)})" if self.args else "")
        if self.base == "STRUCT":
            text += "<" + ",".join(f"{n} {c.spelled()}" for n, c in zip(self.field_names, self.children)) + ">"
        elif self.children:
            text += "<" + ",".join(c.spelled() for c in self.children) + ">"
        return text


class ConversionError(ValueError):
    """A value that does not convert to its column type (strict mode filters the row, else NULL)."""


class _TooLong(ConversionError):
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
    string_max_bytes: Optional[int] = None
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
    bits = _INT_BITS[ctype.base]
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
        raise _TooLong(f"the length of input {len(encoded)} exceeds {ctype.spelled()}", truncated)
    return text


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def parse_json_text(text: str) -> Any:
    """Strict JSON: NaN and Infinity are not JSON (the servers' parsers refuse them)."""
    return json.loads(text, parse_constant=_no_constants)


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
    except _TooLong:
        raise ConversionError(f"{value!r} is too long for {ctype.spelled()}") from None


def convert_value(value: Any, ctype: ColumnType, rules: ConversionRules = STARROCKS_RULES) -> Any:
    """Convert one CSV field (str), JSON value or Arrow value to ``ctype``'s Python type, or raise.

    The rules are docs/protocol.md, "Common: value conversion"; ``_TooLong`` carries the truncated value for the
    products that truncate.
    """
    base = ctype.base
    if base in _INT_BITS:
        return _to_int(value, ctype)
    if base in ("FLOAT", "DOUBLE"):
        return _to_float(value, ctype)
    if base == "DECIMAL":
        return _to_decimal(value, ctype)
    if base == "BOOLEAN":
        return _to_bool(value)
    if base in ("DATE", "DATETIME"):
        return _to_datetime(value, ctype, rules)
    if base in _NESTED:
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
            raise _TooLong(f"the length of input {len(data)} exceeds {ctype.spelled()}", data[:ctype.length])
        return data
    return _to_string(value, ctype, rules)


def schema_properties(schema: "TableSchema", product: str, **extra: str) -> list[dict[str, str]]:
    """The ``properties`` of a ``_schema`` answer: name, type, comment, decimals' precision and scale
    (docs/protocol.md, "Common: table schema endpoint"); ``extra`` adds the product's own fields."""
    props = []
    for name, ctype in schema.columns:
        prop: dict[str, str] = {}
        if ctype.base == "DECIMAL":
            precision, scale = ctype.precision_scale
            prop.update(precision=str(precision), scale=str(scale))
        prop.update(type=schema_type_name(ctype, product), comment="", name=name, **extra)
        props.append(prop)
    return props


def schema_type_name(ctype: ColumnType, product: str) -> str:
    """The ``type`` the FE ``_schema`` endpoint reports: the primitive type's name, without lengths or element
    types (docs/protocol.md, "Common: table schema endpoint")."""
    base, declared = ctype.base, ctype.declared
    if base == "DECIMAL":
        if declared == "DECIMALV2":
            return "DECIMALV2"
        precision = ctype.precision_scale[0]
        return ("DECIMAL32" if precision <= 9 else "DECIMAL64" if precision <= 18
                else "DECIMAL128" if precision <= 38 else "DECIMAL256")
    if product == "starrocks":
        if base in _NESTED:
            return "INVALID_TYPE"  # complex types have no primitive type (inference, UNCONFIRMED)
        return "VARCHAR" if base == "STRING" else base
    if base == "DATE":
        return "DATEV2"
    if base == "DATETIME":
        return "DATETIMEV2"
    return base


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


def encode_cell(value: Any, ctype: Optional[ColumnType] = None) -> Any:
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


# --------------------------------------------------------------------------------------------
# Load formats (docs/protocol.md, StarRocks: load formats)
# --------------------------------------------------------------------------------------------


class LoadError(Exception):
    """A load that fails as a whole (bad headers, unknown columns), not row by row."""


def _unescape_separator(text: str) -> str:
    r"""Separators may be given as hex (``\x01``); other text is literal (STREAM_LOAD docs)."""
    if text.lower().startswith("\\x") and re.fullmatch(r"(?:\\[xX][0-9a-fA-F]{2})+", text):
        return bytes.fromhex(text.replace("\\x", "").replace("\\X", "")).decode("latin-1")
    return text


def _truthy(text: Optional[str]) -> bool:
    return (text or "").strip().lower() == "true"


@dataclass
class LoadFormat:
    """The data-format headers of one load request."""

    format: str = "csv"
    column_separator: str = "\t"
    row_delimiter: str = "\n"
    enclose: Optional[str] = None
    escape: Optional[str] = None
    skip_header: int = 0
    trim_space: bool = False
    columns: Optional[list[str]] = None
    strip_outer_array: bool = False
    read_json_by_line: bool = False
    max_filter_ratio: float = 0.0
    strict_mode: bool = False

    @classmethod
    def from_headers(cls, headers: Any, formats: tuple[str, ...] = ("csv", "json")) -> "LoadFormat":
        """``formats``: what the emulated product and version accept (Doris 2.1+ adds arrow)."""
        def get(name: str) -> Optional[str]:
            value = headers.get(name)
            return value if value is None else str(value)

        fmt = (get("format") or "csv").strip().lower()
        if fmt not in formats:
            # Compressed CSV, parquet and orc exist on the servers; the emulator does not read them.
            raise LoadError(f"unknown data format: {fmt}")
        for unsupported in ("jsonpaths", "json_root", "where", "partial_update"):
            if get(unsupported):
                raise LoadError(f"emulator: header {unsupported!r} is not supported")
        out = cls(format=fmt)
        if get("column_separator") is not None:
            out.column_separator = _unescape_separator(get("column_separator") or "")
        if get("row_delimiter") is not None:
            out.row_delimiter = _unescape_separator(get("row_delimiter") or "")
        if not out.column_separator or not out.row_delimiter:
            raise LoadError("column_separator and row_delimiter must not be empty")
        for key in ("enclose", "escape"):
            value = get(key)
            if value:
                if len(value) != 1:
                    raise LoadError(f"{key} must be a single byte")  # StarRocks: load formats
                setattr(out, key, value)
        if get("skip_header"):
            try:
                out.skip_header = int(get("skip_header") or 0)
            except ValueError as exc:
                raise LoadError("skip_header must be an integer") from exc
        out.trim_space = _truthy(get("trim_space"))
        if get("columns"):
            out.columns = [c.strip().strip("`").strip() for c in (get("columns") or "").split(",")]
            if any("=" in c for c in out.columns):
                raise LoadError("emulator: column expressions in `columns` are not supported")
        out.strip_outer_array = _truthy(get("strip_outer_array"))
        out.read_json_by_line = _truthy(get("read_json_by_line"))
        if get("max_filter_ratio"):
            try:
                out.max_filter_ratio = float(get("max_filter_ratio") or 0)
            except ValueError as exc:
                raise LoadError("max_filter_ratio must be a number") from exc
        # Common: strict mode: off unless the header says "true" (both products document false as the default).
        out.strict_mode = _truthy(get("strict_mode"))
        return out


@dataclass
class ParseResult:
    """Rows that converted, plus the counters the servers report."""

    rows: list[list[Any]] = field(default_factory=list)
    total: int = 0
    filtered: int = 0
    unselected: int = 0
    errors: list[str] = field(default_factory=list)

    def extend(self, other: "ParseResult") -> None:
        self.rows.extend(other.rows)
        self.total += other.total
        self.filtered += other.filtered
        self.unselected += other.unselected
        self.errors.extend(other.errors)

    def too_many_filtered(self, max_filter_ratio: float) -> bool:
        """SR-BE-EXE (StarRocks: responses): filtered / (total - unselected) > max_filter_ratio fails."""
        considered = self.total - self.unselected
        if self.filtered == 0 or considered <= 0:
            return False
        return self.filtered / considered > max_filter_ratio


def split_csv(text: str, fmt: LoadFormat) -> list[list[Optional[str]]]:
    """Split CSV text into records honouring separator, delimiter, enclose and escape.

    ``\\N`` (unenclosed) is NULL. Empty lines are skipped. A last record without a trailing
    delimiter is kept (curl -d '1' loads one row in SR-T-prepared_timeout).
    """
    sep, delim = fmt.column_separator, fmt.row_delimiter
    records: list[list[Optional[str]]] = []

    def finish_field(raw: str, quoted: bool) -> Optional[str]:
        if not quoted and fmt.trim_space:
            raw = raw.strip(" ")
        if not quoted and raw == "\\N":
            return None
        return raw

    if fmt.enclose is None and fmt.escape is None:
        for line in text.split(delim):
            if line == "":
                continue
            records.append([finish_field(f, False) for f in line.split(sep)])
        return records

    i, n = 0, len(text)
    row: list[Optional[str]] = []
    buf: list[str] = []
    quoted = False  # the current field was enclosed
    in_quotes = False
    at_field_start = True
    while i < n:
        ch = text[i]
        if at_field_start and text.startswith("\\N", i) and (
                i + 2 == n or text.startswith(sep, i + 2) or text.startswith(delim, i + 2)):
            row.append(None)  # \N is NULL even when backslash is the escape character
            i += 2
            if i < n and text.startswith(sep, i):
                i += len(sep)
            else:
                records.append(row)
                row = []
                i += len(delim) if i < n else 0
            continue
        if fmt.escape is not None and ch == fmt.escape and i + 1 < n:
            buf.append(text[i + 1])
            i += 2
            at_field_start = False
            continue
        if in_quotes:
            if ch == fmt.enclose:
                if i + 1 < n and text[i + 1] == fmt.enclose:  # doubled enclose = literal
                    buf.append(ch)
                    i += 2
                    continue
                in_quotes = False
                i += 1
                continue
            buf.append(ch)
            i += 1
            continue
        if at_field_start and fmt.enclose is not None and ch == fmt.enclose:
            in_quotes = quoted = True
            at_field_start = False
            i += 1
            continue
        if text.startswith(sep, i):
            row.append(finish_field("".join(buf), quoted))
            buf, quoted, at_field_start = [], False, True
            i += len(sep)
            continue
        if text.startswith(delim, i):
            row.append(finish_field("".join(buf), quoted))
            if not (len(row) == 1 and row[0] == "" and not quoted):
                records.append(row)
            row, buf, quoted, at_field_start = [], [], False, True
            i += len(delim)
            continue
        buf.append(ch)
        at_field_start = False
        i += 1
    if buf or row or quoted:
        row.append(finish_field("".join(buf), quoted))
        if not (len(row) == 1 and row[0] == "" and not quoted):
            records.append(row)
    return records


def _iter_json_values(text: str) -> Iterator[Any]:
    """Concatenated / newline-separated JSON documents, one after another."""
    decoder = json.JSONDecoder(parse_constant=_no_constants)
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return
        value, i = decoder.raw_decode(text, i)
        yield value


class TableSchema:
    """A table's columns, with name lookup that ignores case like the servers do."""

    def __init__(self, columns: list[tuple[str, str]], rules: ConversionRules = STARROCKS_RULES) -> None:
        self.columns = [(name, ColumnType.parse(ctype)) for name, ctype in columns]
        self.raw = [(name, ctype) for name, ctype in columns]
        self.rules = rules
        self._index = {name.lower(): i for i, (name, _) in enumerate(self.columns)}

    def index(self, name: str) -> Optional[int]:
        return self._index.get(name.lower())

    def convert_row(self, values: dict[int, Any], strict: bool) -> list[Any]:
        """Typed row from {column index: raw value}; raises ConversionError if the row is filtered.

        docs/protocol.md, "Common: strict mode": with strict mode off a failed conversion becomes NULL, with it on
        the row is filtered; a NULL (given or produced) in a NOT NULL column is always filtered. Too-long strings
        follow ``ConversionRules.long_string`` when strict mode is off.
        """
        out: list[Any] = []
        for i, (name, ctype) in enumerate(self.columns):
            raw = values.get(i)
            value = None
            if raw is not None:
                try:
                    value = convert_value(raw, ctype, self.rules)
                except _TooLong as exc:
                    if strict or self.rules.long_string == "filter":
                        raise ConversionError(f"column {name}: {exc}") from exc
                    value = exc.truncated if self.rules.long_string == "truncate" else None
                except ConversionError as exc:
                    if strict:
                        raise ConversionError(f"column {name}: {exc}") from exc
            if value is None and not ctype.nullable:
                reason = "NULL value" if raw is None else f"value {raw!r} that did not convert"
                raise ConversionError(f"{reason} in non-nullable column '{name}'")
            out.append(value)
        return out

    def mapping(self, fmt: LoadFormat) -> list[int]:
        """Column indexes the load's fields go to (the `columns` header, else table order)."""
        if fmt.columns is None:
            return list(range(len(self.columns)))
        out = []
        for name in fmt.columns:
            idx = self.index(name)
            if idx is None:
                raise LoadError(f"Unknown column '{name}' in table")
            out.append(idx)
        return out


def _arrow_rows(body: bytes) -> list[dict[str, Any]]:
    """Rows of an Arrow IPC stream (docs/protocol.md, "Doris: Arrow and Parquet loads"), as {field name: value}."""
    if not body:
        return []  # an empty body is an empty load (the Flink connector's probes send none)
    import pyarrow as pa  # lazily: only arrow loads need it

    import pyarrow.compute as pc

    try:
        table = pa.ipc.open_stream(pa.BufferReader(body)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise LoadError(f"failed to read the arrow stream: {exc}") from None
    # A zoned timestamp becomes the DATETIME of its wall time in the BE's fixed zone +08:00, not in
    # the zone it names nor the load's `timezone` (docs/protocol.md, "Doris: Arrow and Parquet loads").
    for index, column in enumerate(table.schema):
        if pa.types.is_timestamp(column.type) and column.type.tz is not None:
            wall = pc.local_timestamp(table.column(index).cast(pa.timestamp(column.type.unit, "+08:00")))
            table = table.set_column(index, column.name, wall)
    return table.to_pylist()


def _map_by_name(obj: dict[str, Any], schema: TableSchema, wanted: list[int]) -> dict[int, Any]:
    lowered = {str(k).lower(): v for k, v in obj.items()}
    return {i: lowered.get(schema.columns[i][0].lower()) for i in wanted}


def parse_payload(body: bytes, fmt: LoadFormat, schema: TableSchema,
                  skip_header: bool = True) -> ParseResult:
    """Parse one load body into typed rows, counting filtered rows instead of failing."""
    result = ParseResult()
    mapping = schema.mapping(fmt)
    wanted = mapping if fmt.columns is not None else list(range(len(schema.columns)))
    if fmt.format == "arrow":  # columns by field name, values by the same rules as JSON values
        for obj in _arrow_rows(body):
            result.total += 1
            try:
                result.rows.append(schema.convert_row(_map_by_name(obj, schema, wanted), fmt.strict_mode))
            except ConversionError as exc:
                result.filtered += 1
                result.errors.append(f"{exc}. Row: {obj!r}"[:400])
        return result
    text = body.decode("utf-8", errors="replace")
    if fmt.format == "csv":
        records = split_csv(text, fmt)
        if skip_header and fmt.skip_header:
            records = records[fmt.skip_header:]
        for record in records:
            result.total += 1
            if len(record) != len(mapping):
                result.filtered += 1
                result.errors.append(
                    f"Value count does not match column count. Expect {len(mapping)}, "
                    f"but got {len(record)}. Row: {record!r}")
                continue
            try:
                result.rows.append(schema.convert_row(dict(zip(mapping, record)), fmt.strict_mode))
            except ConversionError as exc:
                result.filtered += 1
                result.errors.append(f"{exc}. Row: {record!r}")
        return result
    # json: objects mapped to columns by name (no jsonpaths); NaN/Infinity tokens are not JSON
    try:
        documents = list(_iter_json_values(text))
    except ValueError as exc:
        result.total += 1
        result.filtered += 1
        result.errors.append(f"invalid JSON: {exc}")
        return result
    objects: list[Any] = []
    for doc in documents:
        if isinstance(doc, list):
            if not fmt.strip_outer_array:
                result.total += 1
                result.filtered += 1
                result.errors.append("JSON data is an array, strip_outer_array must be set true")
                continue
            objects.extend(doc)
        else:
            objects.append(doc)
    for obj in objects:
        result.total += 1
        if not isinstance(obj, dict):
            result.filtered += 1
            result.errors.append(f"JSON value is not an object: {obj!r}")
            continue
        try:
            result.rows.append(schema.convert_row(_map_by_name(obj, schema, wanted), fmt.strict_mode))
        except ConversionError as exc:
            result.filtered += 1
            result.errors.append(f"{exc}. Row: {json.dumps(obj)[:200]}")
    return result


# --------------------------------------------------------------------------------------------
# Transactions and their persistence
# --------------------------------------------------------------------------------------------

COMMITTED, VISIBLE, ABORTED = "COMMITTED", "VISIBLE", "ABORTED"
FINAL_STATES = frozenset({VISIBLE, ABORTED})
TIMEOUT_REASON = "timeout by txn manager"  # SR-T-prepared_timeout, D-DTM (StarRocks: timeouts)


@dataclass
class Txn:
    """One load transaction as the FE knows it; rows are attached once the data phase ends."""

    txn_id: int
    db: str
    table: str
    label: str
    state: str
    reason: str = ""
    begin_time: float = 0.0
    timeout_s: float = 600.0
    deadline: Optional[float] = None        # abort "timeout by txn manager" when now > deadline
    prepared_timeout_s: Optional[float] = None
    prepare_time: Optional[float] = None
    commit_time: Optional[float] = None
    finish_time: Optional[float] = None
    visible_at: Optional[float] = None      # COMMITTED -> VISIBLE when now >= visible_at
    keep_s: float = 259200.0                # label retention after VISIBLE/ABORTED
    evicted: bool = False
    commit_count: int = 0
    total_rows: int = 0
    loaded_rows: int = 0
    filtered_rows: int = 0
    unselected_rows: int = 0
    load_bytes: int = 0
    visible_seq: Optional[int] = None
    two_phase: bool = True
    error_url: str = ""
    rows: list[list[Any]] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        """The dict ``transactions()`` returns."""
        return {
            "label": self.label, "txn_id": self.txn_id, "db": self.db, "table": self.table,
            "state": self.state, "reason": self.reason, "rows": self.loaded_rows,
            "filtered_rows": self.filtered_rows, "commit_count": self.commit_count,
            "evicted": self.evicted, "two_phase": self.two_phase,
        }


_TXN_META_FIELDS = [f.name for f in fields(Txn) if f.name != "rows"]


class Store:
    """Databases, tables and transactions, mirrored to sqlite3 on every change.

    The in-memory objects are the truth while running; every mutation is written in one SQL
    transaction so that a restarted emulator (``restart()`` or a new process on the same data
    dir) finds PREPARED/PRECOMMITTED txns, visible rows and label history like a real FE.
    Callers hold the emulator lock.
    """

    def __init__(self, path: str, clock: Clock, rules: ConversionRules = STARROCKS_RULES) -> None:
        self.path = path
        self.clock = clock
        self.rules = rules
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE IF NOT EXISTS dbs (name TEXT PRIMARY KEY, id INTEGER);
            CREATE TABLE IF NOT EXISTS tables (db TEXT, name TEXT, columns TEXT,
                                               PRIMARY KEY (db, name));
            CREATE TABLE IF NOT EXISTS txns (txn_id INTEGER PRIMARY KEY, meta TEXT);
            CREATE TABLE IF NOT EXISTS txn_rows (txn_id INTEGER PRIMARY KEY, rows TEXT);
            """)
        self.dbs: dict[str, int] = {}
        self.tables: dict[tuple[str, str], TableSchema] = {}
        self.txns: dict[int, Txn] = {}
        self._live: set[int] = set()  # not evicted
        # Live txns by database, so expiry and eviction never scan the whole history: the running
        # ones (not VISIBLE/ABORTED), and the finished ones in the order they finished (the FE's
        # finished-txn deque, D-DTM / SR-TS).
        self._running: dict[str, set[int]] = {}
        self._finished: dict[str, dict[int, None]] = {}
        self._by_label: dict[tuple[str, str], list[int]] = {}
        self.next_txn_id = 1000
        self.next_db_id = 10001
        self.next_visible_seq = 1
        self._load()

    # -- persistence -------------------------------------------------------------------------

    def _load(self) -> None:
        meta = dict(self._conn.execute("SELECT key, value FROM meta"))
        if "clock" in meta:
            self.clock.set(float(meta["clock"]))
        self.next_txn_id = int(meta.get("next_txn_id", self.next_txn_id))
        self.next_db_id = int(meta.get("next_db_id", self.next_db_id))
        self.next_visible_seq = int(meta.get("next_visible_seq", self.next_visible_seq))
        self.dbs = {name: int(i) for name, i in self._conn.execute("SELECT name, id FROM dbs")}
        for db, name, columns in self._conn.execute("SELECT db, name, columns FROM tables"):
            self.tables[(db, name)] = TableSchema([tuple(c) for c in json.loads(columns)], self.rules)
        rows = dict(self._conn.execute("SELECT txn_id, rows FROM txn_rows"))
        for txn_id, blob in self._conn.execute("SELECT txn_id, meta FROM txns ORDER BY txn_id"):
            txn = Txn(**json.loads(blob))
            schema = self.tables.get((txn.db, txn.table))
            if txn_id in rows and schema is not None:
                txn.rows = [[from_storage(v, ctype) for v, (_, ctype) in zip(row, schema.columns)]
                            for row in json.loads(rows[txn_id])]
            self._index(txn)
        for db, ids in self._finished.items():  # finish order, not txn-id order
            self._finished[db] = dict.fromkeys(
                sorted(ids, key=lambda i: (self.txns[i].finish_time or 0.0, i)))

    def _index(self, txn: Txn) -> None:
        self.txns[txn.txn_id] = txn
        ids = self._by_label.setdefault((txn.db, txn.label), [])
        if txn.txn_id not in ids:
            ids.append(txn.txn_id)
        running = self._running.setdefault(txn.db, set())
        finished = self._finished.setdefault(txn.db, {})
        if txn.evicted:
            self._live.discard(txn.txn_id)
            running.discard(txn.txn_id)
            finished.pop(txn.txn_id, None)
        elif txn.state in FINAL_STATES:
            self._live.add(txn.txn_id)
            running.discard(txn.txn_id)
            finished.setdefault(txn.txn_id, None)
        else:
            self._live.add(txn.txn_id)
            running.add(txn.txn_id)

    def _meta(self) -> list[tuple[str, str]]:
        return [("clock", repr(self.clock.now())), ("next_txn_id", str(self.next_txn_id)),
                ("next_db_id", str(self.next_db_id)),
                ("next_visible_seq", str(self.next_visible_seq))]

    def save(self, txn: Txn, with_rows: bool = False) -> None:
        """Write one txn (and its rows when they were just attached) atomically."""
        self._index(txn)
        meta = json.dumps({k: getattr(txn, k) for k in _TXN_META_FIELDS})
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.execute("INSERT OR REPLACE INTO txns VALUES (?, ?)", (txn.txn_id, meta))
            if with_rows:
                schema = self.tables.get((txn.db, txn.table))
                types = [c for _, c in schema.columns] if schema is not None else []
                self._conn.execute("INSERT OR REPLACE INTO txn_rows VALUES (?, ?)", (
                    txn.txn_id, json.dumps([[encode_cell(v, c) for v, c in zip(r, types)] for r in txn.rows])))
            elif txn.state == ABORTED and txn.rows:
                txn.rows = []
                self._conn.execute("DELETE FROM txn_rows WHERE txn_id = ?", (txn.txn_id,))
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())

    def save_clock(self) -> None:
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())

    def close(self) -> None:
        self._conn.close()

    # -- catalog -----------------------------------------------------------------------------

    def create_database(self, db: str) -> int:
        if db not in self.dbs:
            self.dbs[db] = self.next_db_id
            self.next_db_id += 1
            with self._conn:
                self._conn.execute("BEGIN")
                self._conn.execute("INSERT INTO dbs VALUES (?, ?)", (db, self.dbs[db]))
                self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())
        return self.dbs[db]

    def create_table(self, db: str, table: str, columns: list[tuple[str, str]]) -> None:
        if db not in self.dbs:
            raise KeyError(f"unknown database {db!r}")
        schema = TableSchema(list(columns), self.rules)
        self.tables[(db, table)] = schema
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO tables VALUES (?, ?, ?)",
                               (db, table, json.dumps(schema.raw)))

    def schema(self, db: str, table: str) -> Optional[TableSchema]:
        return self.tables.get((db, table))

    # -- transactions ------------------------------------------------------------------------

    def new_txn(self, **kwargs: Any) -> Txn:
        txn = Txn(txn_id=self.next_txn_id, begin_time=self.clock.now(), **kwargs)
        self.next_txn_id += 1
        self.save(txn)
        return txn

    def live(self) -> list[Txn]:
        return [self.txns[i] for i in sorted(self._live)]

    def label_txns(self, db: str, label: str) -> list[Txn]:
        """Non-evicted txns that used ``label`` in ``db``, oldest first."""
        return [self.txns[i] for i in self._by_label.get((db, label), []) if i in self._live]

    def label_txn(self, db: str, label: str) -> Optional[Txn]:
        """The txn a label names: its non-aborted txn if any, else the latest aborted one."""
        txns = self.label_txns(db, label)
        for txn in reversed(txns):
            if txn.state != ABORTED:
                return txn
        return txns[-1] if txns else None

    def evicted_label_txn(self, db: str, label: str) -> Optional[Txn]:
        """The newest evicted txn of a label (for the terminal-state cache)."""
        ids = [i for i in self._by_label.get((db, label), []) if i not in self._live]
        return self.txns[ids[-1]] if ids else None

    def running(self) -> list[Txn]:
        """Live txns that are not VISIBLE/ABORTED yet, every database."""
        return [self.txns[i] for ids in self._running.values() for i in sorted(ids)]

    def finished(self, db: str) -> Iterator[Txn]:
        """Live VISIBLE/ABORTED txns of ``db``, the first finished first (lazily: it may be long)."""
        return (self.txns[i] for i in self._finished.get(db, {}))

    def finished_count(self, db: str) -> int:
        return len(self._finished.get(db, ()))

    def finished_databases(self) -> list[str]:
        return [db for db, ids in self._finished.items() if ids]

    def running_count(self, db: str) -> int:
        return len(self._running.get(db, ()))

    def visible_rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        txns = [t for t in self.txns.values()
                if t.db == db and t.table == table and t.state == VISIBLE]
        txns.sort(key=lambda t: t.visible_seq or 0)
        return [tuple(r) for t in txns for r in t.rows]

    def take_visible_seq(self) -> int:
        seq = self.next_visible_seq
        self.next_visible_seq += 1
        return seq


# --------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------


class Request:
    """One parsed request. The body is read lazily so a 307 never waits for it (Common: redirects)."""

    def __init__(self, handler: "_Handler", role: str) -> None:
        self._h = handler
        self.role = role
        self.method = handler.command
        self.http_version = handler.request_version
        self.raw_path = handler.path
        parts = urlsplit(handler.path)
        self.path = parts.path
        self.query_string = parts.query
        self.query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.segments = [unquote(s) for s in parts.path.split("/") if s]
        self.headers = handler.headers
        self._body: Optional[bytes] = None
        self.expect_continue = (handler.headers.get("Expect", "").strip().lower()
                                == "100-continue")
        te = handler.headers.get("Transfer-Encoding", "").lower()
        self.chunked = "chunked" in te
        self.content_length = int(handler.headers.get("Content-Length") or 0)

    def header(self, name: str, default: str = "") -> str:
        value = self.headers.get(name)
        return default if value is None else str(value).strip()

    def has_header(self, name: str) -> bool:
        return self.headers.get(name) is not None

    @property
    def has_body(self) -> bool:
        return self.chunked or self.content_length > 0

    @property
    def body_read(self) -> bool:
        return self._body is not None or not self.has_body

    def body(self) -> bytes:
        """Read the body, sending ``100 Continue`` first when the client asked for it."""
        if self._body is None:
            if self.expect_continue:
                self._h.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self._h.wfile.flush()
            rfile = self._h.rfile
            if self.chunked:
                parts = []
                while True:
                    line = rfile.readline(65537)
                    if not line:
                        raise ConnectionError("client went away inside a chunked body")
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    parts.append(rfile.read(size))
                    rfile.readline(65537)
                self._body = b"".join(parts)
            else:
                self._body = rfile.read(self.content_length) if self.content_length else b""
        return self._body

    def basic_auth(self) -> Optional[tuple[str, str]]:
        """(user, password) from ``Authorization: Basic``, or None if absent/unparseable."""
        value = self.header("Authorization")
        if not value.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(value[6:].strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
        if ":" not in decoded:
            return None
        user, password = decoded.split(":", 1)
        return user, password


@dataclass
class Response:
    """An answer to send, or an instruction to drop the connection without one."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    drop: bool = False

    @classmethod
    def json(cls, obj: Any, indent: Optional[int] = 4, status: int = 200,
             headers: Optional[dict[str, str]] = None) -> "Response":
        separators = None if indent is not None else (",", ":")
        text = json.dumps(obj, indent=indent, separators=separators, ensure_ascii=False)
        return cls(status=status, body=text.encode("utf-8"),
                   headers={"Content-Type": "application/json", **(headers or {})})

    @classmethod
    def text(cls, text: str, status: int = 200) -> "Response":
        return cls(status=status, body=text.encode("utf-8"),
                   headers={"Content-Type": "text/plain; charset=utf-8"})

    @classmethod
    def dropped(cls) -> "Response":
        return cls(drop=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: tests read state through the API, not logs."""

    def handle_expect_100(self) -> bool:
        """Defer ``100 Continue`` until the body is really wanted (so a 307 skips it)."""
        return True

    def setup(self) -> None:
        super().setup()
        # Without it Nagle's algorithm and delayed ACKs add ~40 ms to every small answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def _dispatch(self) -> None:
        self.server.emulator._serve(self.server.role, self)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _dispatch


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, emulator: "BaseEmulator", role: str) -> None:
        self.emulator = emulator
        self.role = role
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_connections(self) -> None:
        """Cut kept-alive connections so clients see the restart like a real server crash."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def redirect(req: Request, be_port: int, close: bool = False) -> Response:
    """307 to the BE: ``http://127.0.0.1:<be_port><path>?<query>``, empty body (SR-RBA; Common: redirects).

    Like the servers (which build the URI with an empty query then append the original query),
    the Location always carries the ``?`` and keeps path and query byte for byte; it never
    carries credentials, so clients must re-send ``Authorization`` themselves.
    """
    location = f"http://127.0.0.1:{be_port}{req.path}?{req.query_string}"
    return Response(status=307, headers={"Location": location}, close=close)


# --------------------------------------------------------------------------------------------
# The emulator base
# --------------------------------------------------------------------------------------------


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


class BaseEmulator:
    """FE + BE listeners over one ``Store``; subclasses implement ``describe`` and ``route``.

    Expiry (timeouts, publish delay, label retention) is evaluated lazily: at the start of every
    request and by ``tick()``. Generic fault knobs are applied here so both products share them.
    """

    PRODUCT = "base"
    RULES: ConversionRules = STARROCKS_RULES
    EXPIRING_STATES: frozenset[str] = frozenset()
    EXTRA_KNOBS: dict[str, str] = {}

    def __init__(self, data_dir: str, user: str = "root", password: str = "") -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.user = user
        self.password = password
        self.clock = Clock()
        self.faults = Faults({**GENERIC_KNOBS, **self.EXTRA_KNOBS})
        self.lock = threading.RLock()
        self.store = Store(os.path.join(self.data_dir, f"{self.PRODUCT}.sqlite3"), self.clock, self.conversion_rules())
        self.clock.on_change(lambda _now: self._persist_clock())
        self._fe: Optional[_Server] = None
        self._be: Optional[_Server] = None
        self._threads: list[threading.Thread] = []
        self.fe_port = 0
        self.be_port = 0
        self.error_logs: dict[str, list[str]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "BaseEmulator":
        if self._fe is not None:
            return self
        self._fe = _Server(self.fe_port, self, "fe")
        self._be = _Server(self.be_port, self, "be")
        self.fe_port = self._fe.server_address[1]
        self.be_port = self._be.server_address[1]
        self._threads = [self._serve_in_thread(self._fe), self._serve_in_thread(self._be)]
        return self

    def _serve_in_thread(self, server: _Server) -> threading.Thread:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                                  name=f"{self.PRODUCT}-{server.role}", daemon=True)
        thread.start()
        return thread

    @staticmethod
    def _shutdown(servers: list[Optional[_Server]]) -> None:
        """Stop listeners in parallel (each waits up to a poll interval), then cut connections."""
        live = [s for s in servers if s is not None]
        waiters = [threading.Thread(target=s.shutdown, daemon=True) for s in live]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(timeout=5)
        for server in live:
            server.server_close()
            server.close_connections()

    def stop(self) -> None:
        self.faults.release()  # let delayed answers go
        self._shutdown([self._fe, self._be])
        for thread in self._threads:
            thread.join(timeout=5)
        self._fe = self._be = None

    def restart(self) -> None:
        """Whole-cluster restart: same ports and data dir; memory (BE contexts, caches) is lost."""
        self.stop()
        with self.lock:
            self.store.close()
            self.store = Store(self.store.path, self.clock, self.conversion_rules())
            self._reset_memory()
        self.start()

    def restart_be(self) -> None:
        """BE restart: stream contexts are lost, FE state is kept (StarRocks: routing)."""
        self._shutdown([self._be])
        with self.lock:
            self._reset_be_memory()
        self._be = _Server(self.be_port, self, "be")
        self._threads.append(self._serve_in_thread(self._be))

    def close(self) -> None:
        self.stop()
        self.store.close()

    def __enter__(self) -> "BaseEmulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _reset_memory(self) -> None:
        """Forget everything a process keeps only in memory (subclasses extend)."""
        self._reset_be_memory()

    def _reset_be_memory(self) -> None:
        """Forget BE-only memory (subclasses extend)."""

    @property
    def fe_url(self) -> str:
        return f"http://127.0.0.1:{self.fe_port}"

    @property
    def be_url(self) -> str:
        return f"http://127.0.0.1:{self.be_port}"

    # -- catalog and inspection API ----------------------------------------------------------

    def create_database(self, db: str) -> None:
        with self.lock:
            self.store.create_database(db)

    def create_table(self, db: str, table: str, columns: list[tuple[str, str]]) -> None:
        with self.lock:
            if db not in self.store.dbs:
                self.store.create_database(db)
            self.store.create_table(db, table, columns)

    def conversion_rules(self) -> ConversionRules:
        """The product's value-conversion rules (docs/protocol.md, "Common: value conversion")."""
        return self.RULES

    def visible_rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        """Visible rows in commit order, values typed (int, Decimal, float, str, bytes, date, datetime, list,
        dict; JSON columns hold the parsed JSON value; NULL is None)."""
        with self.lock:
            self._tick_locked()
            return self.store.visible_rows(db, table)

    def visible_dicts(self, db: str, table: str) -> list[dict[str, Any]]:
        """``visible_rows`` keyed by column name, for tests that read wide tables."""
        with self.lock:
            schema = self.store.schema(db, table)
            names = [name for name, _ in schema.columns] if schema is not None else []
        return [dict(zip(names, row)) for row in self.visible_rows(db, table)]

    def transactions(self, db: Optional[str] = None) -> list[dict[str, Any]]:
        with self.lock:
            self._tick_locked()
            return [t.public() for t in sorted(self.store.txns.values(), key=lambda t: t.txn_id)
                    if db is None or t.db == db]

    def tick(self) -> None:
        """Evaluate timeouts, publish delays and label retention against the clock now."""
        with self.lock:
            self._tick_locked()

    # -- state transitions shared by both products --------------------------------------------

    def _persist_clock(self) -> None:
        with self.lock:
            self.store.save_clock()

    def _tick_locked(self) -> None:
        now = self.clock.now()
        for txn in self.store.running():
            expired = txn.deadline is not None and now > txn.deadline
            if txn.state in self.EXPIRING_STATES and expired:
                self._abort(txn, TIMEOUT_REASON)
            elif txn.state == COMMITTED and txn.visible_at is not None and now >= txn.visible_at:
                self._publish(txn)
        for db in self.store.finished_databases():
            # StarRocks: label retention / D-DTM isExpired: like the FE, walk the finished txns oldest
            # first and stop at the first one still kept.
            for txn in list(itertools.takewhile(
                    lambda t: t.finish_time is not None and now - t.finish_time > t.keep_s,
                    self.store.finished(db))):
                txn.evicted = True
                self.store.save(txn)
        self._tick_extra(now)

    def _tick_extra(self, now: float) -> None:
        """Product-specific lazy expiry (e.g. BE idle timeouts, label eviction by count)."""

    def _evict_beyond_count(self, limit: int, count_running: bool) -> None:
        """Label eviction by count: while a database holds more than ``limit`` transactions, forget
        its oldest finished (VISIBLE/ABORTED) ones, whatever their age. ``count_running`` says
        whether running transactions count towards the limit (StarRocks) or only finished ones do
        (Doris). The label then reads UNKNOWN and its txn id "not found", as after retention by age."""
        for db in self.store.finished_databases():
            excess = (self.store.finished_count(db) - limit
                      + (self.store.running_count(db) if count_running else 0))
            for txn in list(itertools.islice(self.store.finished(db), max(excess, 0))):
                txn.evicted = True
                self.store.save(txn)

    def _abort(self, txn: Txn, reason: str) -> None:
        txn.state = ABORTED
        txn.reason = reason
        txn.deadline = None
        txn.finish_time = self.clock.now()
        self.store.save(txn)
        self._on_aborted(txn)

    def _on_aborted(self, txn: Txn) -> None:
        """Hook: drop whatever in-memory context belonged to an aborted txn."""

    def _publish(self, txn: Txn) -> None:
        txn.state = VISIBLE
        txn.visible_at = None
        txn.deadline = None
        txn.finish_time = self.clock.now()
        txn.visible_seq = self.store.take_visible_seq()
        self.store.save(txn)

    def _commit(self, txn: Txn, visible_after: Optional[float] = None) -> None:
        """COMMITTED now; VISIBLE now (default) or once the clock reaches the publish delay."""
        txn.state = COMMITTED
        txn.deadline = None
        txn.commit_time = self.clock.now()
        if visible_after is None:
            self._publish(txn)
        else:
            txn.visible_at = self.clock.now() + float(visible_after)
            self.store.save(txn)

    def _attach(self, txn: Txn, parsed: ParseResult, load_bytes: int) -> None:
        txn.rows = parsed.rows
        txn.total_rows = parsed.total
        txn.loaded_rows = len(parsed.rows)
        txn.filtered_rows = parsed.filtered
        txn.unselected_rows = parsed.unselected
        txn.load_bytes = load_bytes
        self.store.save(txn, with_rows=True)

    def _error_url(self, txn_id: int, errors: list[str]) -> str:
        """Keep rejected rows where the returned ErrorURL points (served by the BE)."""
        key = f"error_log_{txn_id}_{uuid.uuid4().hex[:8]}"
        self.error_logs[key] = errors
        return f"{self.be_url}/api/_load_error_log?file={key}"

    def _expire_label(self, db: Optional[str], label: Optional[str]) -> None:
        """``expire_prepared`` knob: as if the prepared/pre-committed timeout had passed."""
        if db is None or label is None:
            return
        for txn in self.store.label_txns(db, label):
            if txn.state in self.EXPIRING_STATES:
                self._abort(txn, TIMEOUT_REASON)

    # -- auth --------------------------------------------------------------------------------

    def credentials_ok(self, req: Request) -> bool:
        return req.basic_auth() == (self.user, self.password)

    # -- request serving ---------------------------------------------------------------------

    def describe(self, role: str, req: Request) -> Call:
        """Classify a request for the knobs (op, label, db). Subclasses override."""
        return Call(op="other", role=role)

    def route(self, role: str, req: Request, call: Call) -> Response:
        raise NotImplementedError

    def _serve(self, role: str, handler: _Handler) -> None:
        req = Request(handler, role)
        try:
            resp = self._handle(role, req)
        except Exception:  # an emulator bug must answer, never hang the client
            resp = Response.text("emulator error:\n" + traceback.format_exc(), status=500)
        self._send(handler, req, resp)

    def _handle(self, role: str, req: Request) -> Response:
        if req.path.startswith("/__emulator/"):
            return self._admin(req) if role == "fe" else Response.text("not found", 404)
        if role == "be" and req.path == "/api/_load_error_log":
            lines = self.error_logs.get(req.query.get("file", ""))
            return Response.text("\n".join(lines) + "\n") if lines is not None else \
                Response.text("not found", 404)
        self.tick()
        call = self.describe(role, req)
        if self.faults.drop_connection_before.take(call) is not None:
            return Response.dropped()
        params = self.faults.http_5xx.take(call)
        if params is not None:
            status = int(params.get("status", 503))
            return Response.text(f"emulated HTTP {status}", status=status)
        if self.faults.expire_prepared.take(call) is not None:
            with self.lock:
                self._expire_label(call.db, call.label)
        resp = self.route(role, req, call)
        if (resp.status != 307 and call.op == "commit"
                and self.faults.drop_connection_after_commit.take(call) is not None):
            return Response.dropped()
        slow = self.faults.slow_response.take(call)
        if slow is not None:
            self.faults.wake.wait(float(slow.get("seconds", 1.0)))
        return resp

    def _send(self, h: _Handler, req: Request, resp: Response) -> None:
        if resp.drop:
            h.close_connection = True
            try:
                if not req.body_read and not req.expect_continue:
                    req.body()  # so the close is a clean FIN, not a RST
            except (OSError, ValueError):
                pass
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        unread = not req.body_read
        close = resp.close or unread
        try:
            h.send_response(resp.status)
            for name, value in resp.headers.items():
                h.send_header(name, value)
            h.send_header("Content-Length", str(len(resp.body)))
            if close:
                h.send_header("Connection", "close")
            h.end_headers()
            if req.method != "HEAD":
                h.wfile.write(resp.body)
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return
        if close:
            h.close_connection = True
        if unread:
            self._linger(h)

    @staticmethod
    def _linger(h: _Handler) -> None:
        """Half-close, then drain what the client still sends, so it reads our answer, not RST."""
        try:
            h.connection.shutdown(socket.SHUT_WR)
            h.connection.settimeout(2.0)
            while h.rfile.read1(65536):
                pass
        except (OSError, ValueError):
            pass

    # -- admin API (for other processes) ------------------------------------------------------

    def _admin(self, req: Request) -> Response:
        """JSON admin endpoints under ``/__emulator/`` on the FE (no auth, no knobs)."""
        parts = req.segments[1:]
        try:
            payload = json.loads(req.body() or b"{}") if req.method in ("POST", "PUT") else {}
        except json.JSONDecodeError:
            return Response.json({"error": "body must be JSON"}, status=400)
        if parts == ["rows"] and req.method == "GET":
            rows = self.visible_rows(req.query["db"], req.query["table"])
            schema = self.store.schema(req.query["db"], req.query["table"])
            types = [c for _, c in schema.columns] if schema is not None else []
            return Response.json({"rows": [[to_storage(v, c) for v, c in zip(r, types)] for r in rows]})
        if parts == ["transactions"] and req.method == "GET":
            return Response.json({"transactions": self.transactions(req.query.get("db"))})
        if parts == ["clock"] and req.method == "GET":
            return Response.json({"now": self.clock.now()})
        if parts == ["clock", "advance"] and req.method == "POST":
            now = self.clock.advance(float(payload.get("seconds", 0)))
            self.tick()
            return Response.json({"now": now})
        if parts == ["tick"] and req.method == "POST":
            self.tick()
            return Response.json({"now": self.clock.now()})
        if parts == ["databases"] and req.method == "POST":
            self.create_database(payload["db"])
            return Response.json({"ok": True})
        if parts == ["tables"] and req.method == "POST":
            self.create_table(payload["db"], payload["table"],
                              [tuple(c) for c in payload["columns"]])
            return Response.json({"ok": True})
        if parts == ["faults"] and req.method == "GET":
            return Response.json({"knobs": {n: getattr(self.faults, n).__doc__
                                            for n in self.faults.names()}})
        if parts == ["faults", "reset"] and req.method == "POST":
            self.faults.reset()
            return Response.json({"ok": True})
        if parts == ["faults", "release"] and req.method == "POST":
            self.faults.release()
            return Response.json({"ok": True})
        if len(parts) == 2 and parts[0] == "faults" and req.method == "POST":
            try:
                knob = getattr(self.faults, parts[1])
            except AttributeError as exc:
                return Response.json({"error": str(exc)}, status=404)
            knob.arm(times=int(payload.get("times", 1)), label=payload.get("label"),
                     op=payload.get("op"), role=payload.get("role"),
                     **payload.get("params", {}))
            return Response.json({"ok": True})
        if parts == ["restart_be"] and req.method == "POST":
            threading.Thread(target=self.restart_be, daemon=True).start()
            return Response.json({"ok": True})
        return Response.json({"error": f"unknown admin endpoint {req.path}"}, status=404)


# --------------------------------------------------------------------------------------------
# A plain client for the emulator tests
# --------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """The final response of a request and every hop it took (307s included)."""

    response: Any  # requests.Response
    hops: list[Any]

    @property
    def json(self) -> Any:
        return self.response.json()

    @property
    def redirected(self) -> bool:
        return len(self.hops) > 1


def send(method: str, url: str, *, auth: Optional[tuple[str, str]] = ("root", ""),
         headers: Optional[dict[str, str]] = None, data: Any = b"", follow: bool = True,
         timeout: float = 10.0, max_hops: int = 3) -> Exchange:
    """Send with ``requests``, following 307s by hand and re-sending auth and body (Common: redirects).

    ``requests`` would drop ``Authorization`` on the FE->BE hop (docs/protocol.md, Common: redirects).
    """
    import requests  # imported lazily: the emulators themselves need only the stdlib

    hops = []
    for _ in range(max_hops):
        resp = requests.request(method, url, auth=auth, headers=headers or {}, data=data,
                                allow_redirects=False, timeout=timeout)
        hops.append(resp)
        if not follow or resp.status_code != 307:
            return Exchange(resp, hops)
        url = resp.headers["Location"]
    raise RuntimeError(f"too many redirects: {[h.url for h in hops]}")


def run_main(factory: Callable[..., BaseEmulator], argv: Optional[Iterable[str]] = None) -> None:
    """Run an emulator as a process: prints one JSON line with the URLs, serves until killed."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=f"run the {factory.__name__}")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--user", default="root")
    parser.add_argument("--password", default="")
    parser.add_argument("--fe-port", type=int, default=0)
    parser.add_argument("--be-port", type=int, default=0)
    parser.add_argument("--profile", default="{}", help="JSON object of profile settings")
    args = parser.parse_args(list(argv) if argv is not None else None)
    emu = factory(args.data_dir, user=args.user, password=args.password,
                  **json.loads(args.profile))
    emu.fe_port, emu.be_port = args.fe_port, args.be_port
    emu.start()
    print(json.dumps({"fe_url": emu.fe_url, "be_url": emu.be_url, "pid": os.getpid()}),
          flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    emu.close()


def profile_fields(cls: type, overrides: dict[str, Any]) -> Any:
    """Build a profile dataclass, rejecting unknown settings (typos must not pass silently)."""
    known = {f.name for f in fields(cls)}
    unknown = set(overrides) - known
    if unknown:
        raise TypeError(f"unknown {cls.__name__} settings: {sorted(unknown)}; "
                        f"known: {sorted(known)}")
    return cls(**overrides)


__all__ = [
    "ABORTED", "COMMITTED", "VISIBLE", "FINAL_STATES", "TIMEOUT_REASON", "BaseEmulator", "Call",
    "Clock", "ColumnType", "ConversionError", "ConversionRules", "DORIS_RULES", "Exchange", "Faults", "Knob",
    "LoadError", "LoadFormat", "STARROCKS_RULES", "from_storage", "to_storage", "parse_json_text", "schema_type_name",
    "ParseResult", "Request", "Response", "Store", "TableSchema", "Txn",
    "convert_value", "parse_payload", "profile_fields", "redirect", "run_main", "send",
    "split_csv",
    "version_tuple",
]
