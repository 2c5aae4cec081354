"""Arrow tables -> the text wire formats of Stream Load: CSV (enclose/escape) and JSON.

Rows never become Python objects on the common path: every flat column is rendered to a string
array with `pyarrow.compute` (cast, escape, enclose), the columns are joined element-wise, and the
result is the values buffer of one string array. Nested types (lists, structs, maps) are rendered
by `_json_texts`: leaves are rendered vectorised, then each container is assembled cell by cell
from its children's texts (exact, slower).

`encode_chunks` slices a table so that each encoded piece is about `chunk_bytes`, which keeps a
writer's memory bounded by its flush size plus one piece, whatever the table size.

Every value arrives exactly as sent or is refused with an `EncodingError` naming the column;
nothing is altered silently. Conventions, chosen to round-trip through StarRocks and Doris parsing:
* NULL is `\\N`, never enclosed; a string that is literally `\\N` is enclosed (and its backslash
  escaped), so it stays a string;
* strings are always enclosed; inside them the escape character and the enclose character are
  prefixed with the escape character (both servers document this use of `escape`);
* string columns must be valid UTF-8 (Spark does not check), binary columns too in the text formats;
* timestamps with a zone are written as their UTC wall time (DATETIME has no zone; rendering in
  the Arrow zone, i.e. Spark's session zone, made the value depend on the driver's configuration and
  merged the two instants of a DST fall-back hour); timestamps without a zone are written as they are;
* sub-second digits are kept to the column's unit; nanoseconds are accepted only when they are whole
  microseconds (DATETIME holds microseconds), otherwise refused;
* dates and timestamps must lie in 0000-01-01 .. 9999-12-31 (the DATE/DATETIME range);
* floats use the shortest representation that round-trips; NaN and infinities are refused, nested
  ones too;
* nested values are JSON: lists -> arrays, structs -> objects, maps -> objects keyed by the key's
  text (duplicate keys refused), decimals as exact JSON numbers, dates/timestamps as strings
  rendered as at top level; binary inside a nested value is refused;
* Doris' Arrow IPC format is in streamload/doris_arrow.py: it writes no text, but checks values
  with the helpers here, so the choice of wire format never changes what lands.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import EncodingError  # noqa: F401  moved to streaming_sink/errors.py

Tabular: TypeAlias = pa.Table | pa.RecordBatch

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024

# 0000-01-01T00:00:00 and 9999-12-31T24:00:00 in seconds from the epoch: the DATE/DATETIME range of
# StarRocks and Doris.
_MIN_EPOCH_S = -719_528 * 86_400
_END_EPOCH_S = 2_932_897 * 86_400
PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

# Characters the encoder writes outside enclosure: numbers, booleans, dates, times (a separator made
# of one of them would split those values).
_UNENCLOSED_CHARS = frozenset("0123456789.-+: eE") | frozenset("truefals")


@dataclass(frozen=True)
class CsvFormat:
    """CSV as Stream Load reads it with the `column_separator`/`row_delimiter`/`enclose`/`escape` headers."""

    column_separator: str = ","
    row_delimiter: str = "\n"
    enclose: str | None = '"'
    escape: str | None = "\\"
    null: str = "\\N"

    def __post_init__(self) -> None:
        """Refuse option combinations the servers would parse differently from how the encoder writes."""
        sep, row = self.column_separator, self.row_delimiter
        if not sep or not row:
            raise ValueError("CSV column_separator and row_delimiter must not be empty")
        for name in ("enclose", "escape"):
            value = getattr(self, name)
            if value is not None and len(value.encode("utf-8")) != 1:
                raise ValueError(f"CSV {name} must be a single byte, got {value!r}")
        if sep == row or sep in row or row in sep:
            raise ValueError(f"CSV column_separator {sep!r} and row_delimiter {row!r} must differ and neither contain the other")
        if self.enclose is not None and self.enclose == self.escape:
            # The servers read `escape` as "the next byte is literal", so an escape that is also the
            # enclose makes the closing enclose escape the separator after it.
            raise ValueError(
                f"CSV enclose and escape must differ (both {self.enclose!r}); to double the enclose inside "
                "values instead, set escape=None"
            )
        forbidden = _UNENCLOSED_CHARS | set(self.null)
        for option, text in (("column_separator", sep), ("row_delimiter", row)):
            for name in ("enclose", "escape"):
                special = getattr(self, name)
                if special is not None and special in text:
                    raise ValueError(f"CSV {option} {text!r} contains the {name} character {special!r}")
            clash = sorted(set(text) & forbidden)
            if clash:
                raise ValueError(
                    f"CSV {option} {text!r} contains {''.join(clash)!r}, which occurs in values written without "
                    f"enclosure (numbers, dates, booleans, the NULL marker {self.null!r}); choose another"
                )

    def headers(self) -> dict[str, str]:
        """The Stream Load headers that describe this format (the same names on StarRocks and Doris)."""
        headers = {"format": "csv"}
        if self.column_separator != "\t":  # the servers' default; omitted, as hex is the only safe spelling
            headers["column_separator"] = _header_text(self.column_separator)
        if self.row_delimiter != "\n":
            headers["row_delimiter"] = _header_text(self.row_delimiter)
        if self.enclose is not None:
            headers["enclose"] = self.enclose
        if self.escape is not None:
            headers["escape"] = self.escape
        return headers

    def encode(self, data: Tabular) -> bytes:
        return encode_csv(data, self)


@dataclass(frozen=True)
class JsonFormat:
    """JSON objects keyed by column name: one array (`lines=False`) or one object per line."""

    lines: bool = False

    def encode(self, data: Tabular) -> bytes:
        return encode_json(data, lines=self.lines)


class WireFormat(Protocol):
    """A Stream Load body format: each slice of rows encoded as one complete piece (CSV and JSON here, Doris'
    Arrow IPC in streamload/doris_arrow.py)."""

    def encode(self, data: Tabular) -> bytes: ...




def header_safe(name: str) -> bool:
    """Whether a column name can travel in the `columns` header (printable ASCII: headers are latin-1)."""
    return name.isascii() and name.isprintable()


def check_header_names(schema: pa.Schema, fmt: WireFormat) -> None:
    """Refuse, before any data moves, column names the wire format cannot send; call at start-up.

    CSV needs the `columns` header to map fields to columns. JSON and Arrow bodies carry the names,
    so with them a target sends `columns` only when every name is `header_safe`.
    """
    if isinstance(fmt, CsvFormat):
        columns_header(schema)


def columns_header(schema: pa.Schema) -> str:
    """The `columns` header value: back-quoted names in the order the encoders write them."""
    bad = [name for name in schema.names if not header_safe(name)]
    if bad:
        raise EncodingError(
            f"column names {bad!r} are not printable ASCII, and the `columns` header (HTTP, latin-1) cannot "
            "carry them: rename the columns (e.g. with an alias in the query) or use the JSON format, "
            "whose body carries the names itself"
        )
    return ",".join("`" + name.replace("`", "``") + "`" for name in schema.names)


def columns_entry(schema: pa.Schema, fmt: WireFormat) -> dict[str, str]:
    """The `columns` header a load sends: always for CSV, which needs it to map fields to columns; for JSON and
    Arrow bodies, which name their columns themselves, only when every name can travel in it."""
    if isinstance(fmt, CsvFormat) or all(header_safe(name) for name in schema.names):
        return {"columns": columns_header(schema)}
    return {}


def encode_chunks(data: Tabular, fmt: WireFormat, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Encode `data` in row slices of about `chunk_bytes` (Arrow size) each; every piece is complete.

    Each piece is whole records (CSV, JSON lines), a whole JSON array or a whole Arrow IPC stream,
    so a piece can be one load request, or pieces can be concatenated (CSV, JSON lines, Arrow) into
    one streamed body.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    batches = data.to_batches() if isinstance(data, pa.Table) else [data]
    for batch in batches:
        if batch.num_rows == 0:
            continue
        rows_per_piece = max(1, int(batch.num_rows * chunk_bytes / max(1, batch.nbytes)))
        for start in range(0, batch.num_rows, rows_per_piece):
            yield fmt.encode(batch.slice(start, rows_per_piece))


# -- CSV -------------------------------------------------------------------------------------------


def encode_csv(data: Tabular, fmt: CsvFormat = CsvFormat()) -> bytes:
    """Every row of `data` as CSV records, each ending with the row delimiter."""
    if data.num_rows == 0:
        return b""
    columns = [_csv_column(name, column, fmt) for name, column in named_columns(data)]
    return _join_rows(columns, fmt.column_separator, fmt.row_delimiter)


def _csv_column(name: str, column: pa.Array, fmt: CsvFormat) -> pa.Array:
    if _is_string_like(column.type) or _is_nested(column.type):
        text = _nested_as_json(name, column) if _is_nested(column.type) else as_utf8(name, column)
        text = _csv_escape(name, text, fmt)
        if fmt.enclose is not None:
            text = pc.binary_join_element_wise(fmt.enclose, text, fmt.enclose, "")
    else:
        text = _scalar_text(name, column)
    return pc.fill_null(text, fmt.null)


def _csv_escape(name: str, text: pa.Array, fmt: CsvFormat) -> pa.Array:
    escape, enclose = fmt.escape, fmt.enclose
    if escape is not None:
        text = pc.replace_substring(text, escape, escape + escape)
        specials = [enclose] if enclose is not None else [fmt.column_separator, fmt.row_delimiter]
        for special in specials:
            text = pc.replace_substring(text, special, escape + special)
        return text
    if enclose is not None:
        return pc.replace_substring(text, enclose, enclose + enclose)  # doubled enclose is literal
    for special in (fmt.column_separator, fmt.row_delimiter):
        if pc.any(pc.match_substring(text, special)).as_py():
            raise EncodingError(
                f"column {name!r} has values containing {special!r}, which this CSV format can neither "
                "enclose nor escape; set `enclose` (and `escape`) or use JSON"
            )
    return text


# -- JSON ------------------------------------------------------------------------------------------


_JSON_CONTROL = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def encode_json(data: Tabular, lines: bool = False) -> bytes:
    """Rows as JSON objects keyed by column name: a JSON array, or one object per line."""
    if data.num_rows == 0:
        return b"" if lines else b"[]"
    parts: list[pa.Array | str] = []
    for index, (name, column) in enumerate(named_columns(data)):
        parts.append(("{" if index == 0 else ",") + _json_key(name) + ":")
        parts.append(pc.fill_null(_json_value(name, column), "null"))
    parts.append("}")
    objects = pc.binary_join_element_wise(*parts, "")
    if lines:
        return _join_rows([objects], "", "\n")
    body = _join_rows([objects], "", ",")
    return b"[" + body[:-1] + b"]"


def _json_key(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def _json_value(name: str, column: pa.Array) -> pa.Array:
    kind = column.type
    if _is_nested(kind):
        return _nested_as_json(name, column)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return _scalar_text(name, column)
    text = as_utf8(name, column) if _is_string_like(kind) else _scalar_text(name, column)
    return pc.binary_join_element_wise('"', _json_escape(text), '"', "")


def _json_escape(text: pa.Array) -> pa.Array:
    text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
        for code in range(0x20):
            char = chr(code)
            text = pc.replace_substring(text, char, _JSON_CONTROL.get(char, f"\\u{code:04x}"))
    return text


# -- nested values as JSON -------------------------------------------------------------------------


def _nested_as_json(name: str, column: pa.Array) -> pa.Array:
    """Lists, structs and maps as JSON text, one string per cell (NULL stays NULL)."""
    return pa.array(_json_texts(name, name, column), pa.string())


def _json_texts(name: str, path: str, array: pa.Array) -> list[str | None]:
    """The JSON text of every element of `array` (None for NULL); `path` locates it in column `name`."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _json_texts(name, path, array.dictionary_decode())
    if pa.types.is_map(kind):
        return _json_map(name, path, array)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _json_list(name, path, array)
    if _is_nested(kind) and not pa.types.is_struct(kind):
        try:  # list views and the like: a plain list holds the same values
            return _json_list(name, path, pc.cast(array, pa.large_list(kind.value_type)))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, AttributeError):
            raise EncodingError(f"{column_at(name, path)} has type {kind}, which has no JSON rendering here") from None
    if pa.types.is_struct(kind):
        return _json_struct(name, path, array)
    rendered: list[str | None] = _json_leaf(name, path, array).to_pylist()
    return rendered


def _json_leaf(name: str, path: str, array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_null(kind):
        return pa.nulls(len(array), pa.string())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind) or is_view(kind, "binary"):
        raise EncodingError(
            f"{column_at(name, path)} holds binary inside a nested value, which JSON cannot carry as bytes: "
            "encode it explicitly (e.g. base64 into a string field) before the sink"
        )
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_view(kind, "string"):
        text = as_utf8(name, array, path)
        return pc.binary_join_element_wise('"', _json_escape(text), '"', "")
    if pa.types.is_decimal(kind):
        return _decimal_text(array)  # exact digits: a JSON number with no float rounding
    text = _scalar_text(name, array, path)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return text
    return pc.binary_join_element_wise('"', _json_escape(text), '"', "")


def _json_list(name: str, path: str, array: pa.Array) -> list[str | None]:
    items = [("null" if text is None else text) for text in _json_texts(name, path + "[]", array.flatten())]
    lengths = pc.list_value_length(array).to_pylist()
    out: list[str | None] = []
    position = 0
    for length in lengths:
        if length is None:
            out.append(None)
            continue
        out.append("[" + ",".join(items[position:position + length]) + "]")
        position += length
    return out


def _json_struct(name: str, path: str, array: pa.Array) -> list[str | None]:
    kind = array.type
    names = [kind.field(i).name for i in range(kind.num_fields)]
    if len(set(names)) != len(names):
        raise EncodingError(f"{column_at(name, path)} is a struct with duplicate field names {names}, which a JSON object cannot hold")
    children = array.flatten()  # the parent's NULLs merged in: values under them are not looked at
    fields = [
        [_json_key(field) + ":" + ("null" if text is None else text) for text in _json_texts(name, f"{path}.{field}", child)]
        for field, child in zip(names, children, strict=True)
    ]
    valid = array.is_valid().to_pylist()
    if not fields:
        return ["{}" if ok else None for ok in valid]
    return ["{" + ",".join(members) + "}" if ok else None for ok, members in zip(valid, zip(*fields, strict=True), strict=True)]


def _json_map(name: str, path: str, array: pa.Array) -> list[str | None]:
    kind = array.type
    entries_type = pa.list_(pa.struct([kind.key_field, kind.item_field]))
    as_list = array.view(entries_type)  # the same layout: a list of key/value structs
    entries = as_list.flatten()
    keys = entries.field(0)
    key_kind = keys.type
    if pa.types.is_dictionary(key_kind):
        keys, key_kind = keys.dictionary_decode(), key_kind.value_type
    if _is_nested(key_kind):
        raise EncodingError(f"{column_at(name, path)} is a map with keys of type {key_kind}; JSON object keys must be text")
    if keys.null_count:
        raise EncodingError(f"{column_at(name, path)} is a map with a NULL key, which a JSON object cannot hold")
    if pa.types.is_string(key_kind) or pa.types.is_large_string(key_kind) or is_view(key_kind, "string"):
        key_texts = as_utf8(name, keys, path + "{key}")
    elif _is_string_like(key_kind) or pa.types.is_fixed_size_binary(key_kind):
        _json_leaf(name, path + "{key}", keys)  # refuses binary, with the reason
        raise AssertionError("binary map keys were not refused")
    else:  # numbers, dates, timestamps...: their text, as at top level
        key_texts = _scalar_text(name, keys, path + "{key}")
    raw_keys = key_texts.to_pylist()
    quoted = pc.binary_join_element_wise('"', _json_escape(key_texts), '"', "").to_pylist()
    values = [("null" if text is None else text) for text in _json_texts(name, path + "{}", entries.field(1))]
    out: list[str | None] = []
    position = 0
    for length in pc.list_value_length(as_list).to_pylist():
        if length is None:
            out.append(None)
            continue
        end = position + length
        if len(set(raw_keys[position:end])) != length:
            duplicates = sorted({k for k in raw_keys[position:end] if raw_keys[position:end].count(k) > 1})
            raise EncodingError(
                f"{column_at(name, path)} has a map with duplicate keys {duplicates!r}; a JSON object keeps only one "
                "of them (which one is up to the parser), so the map is refused: de-duplicate it before the sink"
            )
        out.append("{" + ",".join(k + ":" + v for k, v in zip(quoted[position:end], values[position:end], strict=True)) + "}")
        position = end
    return out


# -- shared by every format, Doris' Arrow IPC too (streamload/doris_arrow.py) ----------------------


def named_columns(data: Tabular) -> list[tuple[str, pa.Array]]:
    """(name, column) of every column, dictionaries decoded: what an encoder walks."""
    batch = data.combine_chunks().to_batches()[0] if isinstance(data, pa.Table) else data
    return [(name, _decoded(batch.column(i))) for i, name in enumerate(batch.schema.names)]


def _decoded(column: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        return column.dictionary_decode()
    return column


def is_view(kind: pa.DataType, which: str) -> bool:
    check: Callable[[pa.DataType], bool] = getattr(pa.types, f"is_{which}_view", lambda _: False)
    return check(kind)


def _is_string_like(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or is_view(kind, "string")
        or is_view(kind, "binary")
    )


def _is_nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_nested(kind))


def column_at(name: str, path: str) -> str:
    """Where a value is, for messages: the column, and inside a nested one the path to it."""
    return f"column {name!r}" if path == name else f"column {name!r} (at {path})"


def as_utf8(name: str, column: pa.Array, path: str | None = None) -> pa.Array:
    """The column as `string`, refusing bytes that are not UTF-8 (Spark does not check string columns)."""
    where = column_at(name, path or name)
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type) or is_view(column.type, "binary"):
        try:
            return pc.cast(column, pa.string())  # validates UTF-8
        except pa.ArrowInvalid:
            raise EncodingError(
                f"{where} holds bytes that are not UTF-8 text; the text wire formats cannot carry "
                "them: cast the column to a string (e.g. base64) before the sink"
            ) from None
    try:
        column.validate(full=True)
    except pa.ArrowInvalid as error:
        raise EncodingError(
            f"{where} is a string column holding bytes that are not UTF-8 ({error}); "
            "fix or dead-letter those rows before the sink"
        ) from None
    return column if pa.types.is_string(column.type) else pc.cast(column, pa.string())


def check_finite(name: str, column: pa.Array, path: str | None = None) -> None:
    if pc.any(pc.and_kleene(pc.invert(pc.is_finite(column)), pc.is_valid(column))).as_py():
        raise EncodingError(
            f"{column_at(name, path or name)} has NaN or infinite values, which StarRocks/Doris cannot load from text; "
            "filter or replace them before the sink"
        )


def _check_range(name: str, path: str, values: pa.Array, low: int, high: int, what: str) -> None:
    """Refuse `values` (int64 counts of a unit) outside [low, high)."""
    if not len(values):
        return
    bounds: dict[str, int | None] = pc.min_max(values).as_py()
    smallest, largest = bounds["min"], bounds["max"]
    if smallest is not None and largest is not None and (smallest < low or largest >= high):
        raise EncodingError(
            f"{column_at(name, path)} has {what} outside 0000-01-01 .. 9999-12-31 (e.g. a negative year), which "
            "DATE/DATETIME cannot hold; filter or fix them before the sink"
        )


def check_date_range(name: str, column: pa.Array, path: str) -> None:
    if pa.types.is_date32(column.type):
        _check_range(name, path, column.view(pa.int32()).cast(pa.int64()), _MIN_EPOCH_S // 86_400, _END_EPOCH_S // 86_400, "dates")
    else:
        _check_range(name, path, column.view(pa.int64()), _MIN_EPOCH_S * 1000, _END_EPOCH_S * 1000, "dates")


def wall_time(name: str, column: pa.Array, path: str) -> pa.Array:
    """A zone-less timestamp: UTC wall time for a zoned one, at most microseconds, range checked."""
    kind = column.type
    if kind.tz is not None:
        column = column.view(pa.timestamp(kind.unit))  # the stored value is the UTC instant
    if kind.unit == "ns":
        try:
            column = pc.cast(column, pa.timestamp("us"))  # safe cast: refuses to drop non-zero nanoseconds
        except pa.ArrowInvalid:
            raise EncodingError(
                f"{column_at(name, path)} has timestamps with nanoseconds, which DATETIME (microseconds) cannot hold; "
                "truncate or round them to microseconds before the sink"
            ) from None
    per_second = PER_SECOND[column.type.unit]
    _check_range(name, path, column.view(pa.int64()), _MIN_EPOCH_S * per_second, _END_EPOCH_S * per_second, "timestamps")
    return column


def _decimal_text(column: pa.Array) -> pa.Array:
    """Decimals in plain notation with all their scale (`0.0000000000`, never `0E-10`).

    Arrow writes an exponent where the value is small next to its scale (as Python's `str(Decimal)`
    does), which a server's DECIMAL parser need not read; such a column is rendered value by value.
    """
    text = pc.cast(column, pa.string())
    if not pc.any(pc.match_substring(text, "E")).as_py():
        return text
    return pa.array([None if value is None else format(value, "f") for value in column.to_pylist()], pa.string())


def _scalar_text(name: str, column: pa.Array, path: str | None = None) -> pa.Array:
    kind = column.type
    path = path or name
    if pa.types.is_floating(kind):
        check_finite(name, column, path)
        text = pc.cast(column, pa.string())
        return pc.if_else(pc.equal(text, "-0"), "-0.0", text)  # "-0" would parse as the integer 0, losing the sign
    if pa.types.is_timestamp(kind):
        column = wall_time(name, column, path)
    elif pa.types.is_date(kind):
        check_date_range(name, column, path)
    elif pa.types.is_decimal(kind):
        return _decimal_text(column)
    elif pa.types.is_null(kind):
        return pa.nulls(len(column), pa.string())
    elif pa.types.is_duration(kind) or pa.types.is_interval(kind):
        raise EncodingError(f"{column_at(name, path)} of type {kind} has no StarRocks/Doris column type; cast it in the query")
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as error:
        raise EncodingError(f"{column_at(name, path)} of type {kind} cannot be written as text: {error}") from None


def _join_rows(columns: list[pa.Array], separator: str, delimiter: str) -> bytes:
    """Join columns element-wise with `separator`, end every row with `delimiter`, return the bytes.

    The values buffer of a string array with no nulls is exactly its values back to back, so the
    body is one slice of it: no per-row Python work.
    """
    rows = pc.binary_join_element_wise(*columns, separator) if len(columns) > 1 else columns[0]
    rows = pc.binary_join_element_wise(rows, delimiter, "")
    if rows.null_count:
        raise AssertionError("a row rendered to NULL: a column escaped the NULL fill")
    offsets = pa.Array.from_buffers(pa.int32(), len(rows) + 1, [None, rows.buffers()[1]], offset=rows.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    body: bytes = rows.buffers()[2].slice(start, end - start).to_pybytes()
    return body


def _header_text(separator: str) -> str:
    r"""Separators that are control characters go as `\xNN` hex in headers (HTTP headers cannot carry them)."""
    if all(ch.isprintable() and ch not in "\t" for ch in separator):
        return separator
    return "".join(f"\\x{byte:02x}" for byte in separator.encode("utf-8"))
