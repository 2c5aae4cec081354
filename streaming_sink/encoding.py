"""Arrow tables -> the text wire formats of Stream Load (CSV with enclose/escape, JSON), by pyarrow.

Rows never become Python objects on the common path: every column is rendered to a string array
with `pyarrow.compute` (cast, escape, enclose), the columns are joined element-wise, and the
result is the values buffer of one string array. Nested types (lists, structs, maps) are the
exception: they are rendered cell by cell with `json`, which is correct but slower.

`encode_chunks` slices a table so that each encoded piece is about `chunk_bytes`, which keeps a
writer's memory bounded by its flush size plus one piece, whatever the table size.

Conventions, chosen to round-trip through StarRocks and Doris CSV parsing:
* NULL is `\\N`, never enclosed; a string that is literally `\\N` is enclosed (and its backslash
  escaped), so it stays a string;
* strings are always enclosed; inside them the escape character and the enclose character are
  prefixed with the escape character (both servers document this use of `escape`);
* timestamps with a zone are written as wall time in that zone (DATETIME has no zone);
* floats use the shortest representation that round-trips; NaN and infinities are refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, Union

import pyarrow as pa
import pyarrow.compute as pc

from .errors import StreamingSinkError

Tabular = Union[pa.Table, pa.RecordBatch]

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024


class EncodingError(StreamingSinkError, ValueError):
    """Data that cannot be written in the chosen wire format; says which column and what to change."""


@dataclass(frozen=True)
class CsvFormat:
    """CSV as Stream Load reads it with the `column_separator`/`row_delimiter`/`enclose`/`escape` headers."""

    column_separator: str = ","
    row_delimiter: str = "\n"
    enclose: str | None = '"'
    escape: str | None = "\\"
    null: str = "\\N"

    def __post_init__(self) -> None:
        if not self.column_separator or not self.row_delimiter:
            raise ValueError("CSV column_separator and row_delimiter must not be empty")
        for name in ("enclose", "escape"):
            value = getattr(self, name)
            if value is not None and len(value.encode("utf-8")) != 1:
                raise ValueError(f"CSV {name} must be a single byte, got {value!r}")

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


WireFormat = Union[CsvFormat, JsonFormat]


def columns_header(schema: pa.Schema) -> str:
    """The `columns` header value: back-quoted names in the order the encoders write them."""
    return ",".join("`" + name.replace("`", "``") + "`" for name in schema.names)


def encode_chunks(data: Tabular, fmt: WireFormat, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Encode `data` in row slices of about `chunk_bytes` (Arrow size) each; every piece is complete.

    Each piece is whole records (CSV, JSON lines) or a whole JSON array, so a piece can be one
    load request, or pieces can be concatenated (CSV, JSON lines) into one streamed body.
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
    columns = [_csv_column(name, column, fmt) for name, column in _columns(data)]
    return _join_rows(columns, fmt.column_separator, fmt.row_delimiter)


def _csv_column(name: str, column: pa.Array, fmt: CsvFormat) -> pa.Array:
    if _is_string_like(column.type) or _is_nested(column.type):
        text = _nested_as_json(column) if _is_nested(column.type) else _as_utf8(name, column)
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
    for index, (name, column) in enumerate(_columns(data)):
        parts.append(("{" if index == 0 else ",") + json.dumps(name) + ":")
        parts.append(pc.fill_null(_json_value(name, column), "null"))
    parts.append("}")
    objects = pc.binary_join_element_wise(*parts, "")
    if lines:
        return _join_rows([objects], "", "\n")
    body = _join_rows([objects], "", ",")
    return b"[" + body[:-1] + b"]"


def _json_value(name: str, column: pa.Array) -> pa.Array:
    kind = column.type
    if _is_nested(kind):
        return _nested_as_json(column)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return _scalar_text(name, column)
    text = _as_utf8(name, column) if _is_string_like(kind) else _scalar_text(name, column)
    return pc.binary_join_element_wise('"', _json_escape(text), '"', "")


def _json_escape(text: pa.Array) -> pa.Array:
    text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
        for code in range(0x20):
            char = chr(code)
            text = pc.replace_substring(text, char, _JSON_CONTROL.get(char, f"\\u{code:04x}"))
    return text


# -- shared ----------------------------------------------------------------------------------------


def _columns(data: Tabular) -> list[tuple[str, pa.Array]]:
    batch = data.combine_chunks().to_batches()[0] if isinstance(data, pa.Table) else data
    return [(name, _decoded(batch.column(i))) for i, name in enumerate(batch.schema.names)]


def _decoded(column: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        return column.dictionary_decode()
    return column


def _is_string_like(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
        or getattr(pa.types, "is_binary_view", lambda _: False)(kind)
    )


def _is_nested(kind: pa.DataType) -> bool:
    return pa.types.is_nested(kind)


def _as_utf8(name: str, column: pa.Array) -> pa.Array:
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        try:
            return pc.cast(column, pa.string())  # validates UTF-8
        except pa.ArrowInvalid:
            raise EncodingError(
                f"column {name!r} holds bytes that are not UTF-8 text; the text wire formats cannot carry "
                "them: cast the column to a string (e.g. base64) before the sink"
            ) from None
    return pc.cast(column, pa.string())


def _scalar_text(name: str, column: pa.Array) -> pa.Array:
    kind = column.type
    if pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        if pc.any(pc.and_kleene(pc.invert(finite), pc.is_valid(column))).as_py():
            raise EncodingError(
                f"column {name!r} has NaN or infinite values, which StarRocks/Doris cannot load from text; "
                "filter or replace them before the sink"
            )
    if pa.types.is_timestamp(kind):
        if kind.tz is not None:
            column = pc.local_timestamp(column)
        if kind.unit == "ns":
            column = pc.cast(column, pa.timestamp("us"), safe=False)  # DATETIME holds microseconds
    elif pa.types.is_null(kind):
        return pa.nulls(len(column), pa.string())
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as error:
        raise EncodingError(f"column {name!r} of type {kind} cannot be written as text: {error}") from None


def _nested_as_json(column: pa.Array) -> pa.Array:
    """Lists, structs and maps as JSON text (cell by cell: the one slow path)."""

    def default(value: object) -> str:
        return str(value)

    return pa.array(
        [None if value is None else json.dumps(value, default=default, ensure_ascii=False, separators=(",", ":"))
         for value in column.to_pylist()],
        pa.string(),
    )


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
    return rows.buffers()[2].slice(start, end - start).to_pybytes()


def _header_text(separator: str) -> str:
    r"""Separators that are control characters go as `\xNN` hex in headers (HTTP headers cannot carry them)."""
    if all(ch.isprintable() and ch not in "\t" for ch in separator):
        return separator
    return "".join(f"\\x{byte:02x}" for byte in separator.encode("utf-8"))
