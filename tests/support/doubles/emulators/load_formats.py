"""Load bodies as the BE reads them: the format headers, CSV / JSON / Arrow parsing, rows typed per table.

One Stream Load request carries its data format in headers (docs/protocol.md, "StarRocks: load formats";
"Doris: Arrow and Parquet loads"). ``LoadFormat`` reads those headers, ``parse_payload`` turns a body into
typed rows of a ``TableSchema`` and counts the rows it filters instead of failing, as the servers report
them (``ParseResult``). A failure of the whole load (bad headers, unknown columns) is a ``LoadError``.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.doubles.emulators.column_types import ColumnType
from tests.support.doubles.emulators.conversion import (
    STARROCKS_RULES,
    ConversionError,
    ConversionRules,
    TooLong,
    convert_value,
    reject_json_constant,
)
from tests.support.doubles.emulators.key_models import DELETE_SIGN, SEQUENCE_COL, UNIQUE_KEYS, KeyModel


class LoadError(Exception):
    """A load that fails as a whole (bad headers, unknown columns), not row by row."""


def _unescape_separator(text: str) -> str:
    r"""Separators may be given as hex (``\x01``); other text is literal (STREAM_LOAD docs)."""
    if text.lower().startswith("\\x") and re.fullmatch(r"(?:\\[xX][0-9a-fA-F]{2})+", text):
        return bytes.fromhex(text.replace("\\x", "").replace("\\X", "")).decode("latin-1")
    return text


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() == "true"


@dataclass
class LoadFormat:
    """The data-format headers of one load request."""

    format: str = "csv"
    column_separator: str = "\t"
    row_delimiter: str = "\n"
    enclose: str | None = None
    escape: str | None = None
    skip_header: int = 0
    trim_space: bool = False
    columns: list[str] | None = None
    strip_outer_array: bool = False
    read_json_by_line: bool = False
    max_filter_ratio: float = 0.0
    strict_mode: bool = False
    merge_type: str = "APPEND"  # Doris: APPEND, DELETE or MERGE (D-DEL)
    sequence_col: str | None = None  # Doris: header function_column.sequence_col (D-SEQ)
    delete_on: tuple[str, str] | None = None  # Doris MERGE: the `delete` condition as (source column, literal)

    @classmethod
    def from_headers(cls, headers: Any, formats: tuple[str, ...] = ("csv", "json")) -> LoadFormat:
        """``formats``: what the emulated product and version accept (Doris 2.1+ adds arrow)."""
        def get(name: str) -> str | None:
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
        merge_type = (get("merge_type") or "APPEND").strip().upper()
        if merge_type not in ("APPEND", "DELETE", "MERGE"):
            raise LoadError(f"unknown merge type {merge_type}")
        out.merge_type = merge_type
        out.delete_on = _delete_condition(get("delete"), merge_type)
        out.sequence_col = (get("function_column.sequence_col") or "").strip() or None
        return out


_CONDITION = re.compile(r"\s*`?(\w+)`?\s*=\s*(-?\d+|'[^']*')\s*")


def _delete_condition(text: str | None, merge_type: str) -> tuple[str, str] | None:
    """Doris' `delete` header: with `merge_type: MERGE`, a row is a delete where the condition holds (the planner
    sets the delete sign to it: `ImportColumnDesc.newDeleteSignImportColumnDesc`, apache/doris
    fe/.../datasource/LoadScanProvider.java `initColumns`). The emulator reads `<column> = <literal>` only; the
    refusals of a missing or misplaced condition follow StreamLoadTask/DataDescription (wording UNCONFIRMED)."""
    text = (text or "").strip()
    if merge_type == "MERGE" and not text:
        raise LoadError("Excepted DELETE ON clause when merge type is MERGE.")
    if not text:
        return None
    if merge_type != "MERGE":
        raise LoadError("not support DELETE ON clause when merge type is not MERGE.")
    match = _CONDITION.fullmatch(text)
    if match is None:
        raise LoadError(f"emulator: only `column = literal` delete conditions are supported, got {text!r}")
    return match.group(1), match.group(2).strip("'")


@dataclass
class ParseResult:
    """Rows that converted, plus the counters the servers report."""

    rows: list[list[Any]] = field(default_factory=list)
    total: int = 0
    filtered: int = 0
    unselected: int = 0
    errors: list[str] = field(default_factory=list)

    def extend(self, other: ParseResult) -> None:
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


def split_csv(text: str, fmt: LoadFormat) -> list[list[str | None]]:
    """Split CSV text into records honouring separator, delimiter, enclose and escape.

    ``\\N`` (unenclosed) is NULL. Empty lines are skipped. A last record without a trailing
    delimiter is kept (curl -d '1' loads one row in SR-T-prepared_timeout).
    """
    sep, delim = fmt.column_separator, fmt.row_delimiter
    records: list[list[str | None]] = []

    def finish_field(raw: str, quoted: bool) -> str | None:
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
    row: list[str | None] = []
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
    decoder = json.JSONDecoder(parse_constant=reject_json_constant)
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return
        value, i = decoder.raw_decode(text, i)
        yield value


class TableSchema:
    """A table's columns, with name lookup that ignores case like the servers do, and its key model.

    `columns` are the table's own; a keyed table's rows are stored with its hidden columns after them
    (`stored`; key_models.py), which a load fills from its `columns` header or with their defaults.
    """

    def __init__(self, columns: list[tuple[str, str]], rules: ConversionRules = STARROCKS_RULES,
                 model: KeyModel | None = None) -> None:
        self.columns = [(name, ColumnType.parse(ctype)) for name, ctype in columns]
        self.raw = [(name, ctype) for name, ctype in columns]
        self.rules = rules
        self.model = model or KeyModel(product="starrocks")
        self.stored = self.columns + [(name, ColumnType.parse(ctype))
                                      for name, ctype in self.model.hidden_columns(self.raw)]
        self._index = {name.lower(): i for i, (name, _) in enumerate(self.stored)}
        sequence_col = self.model.sequence_col
        self._sequence_from = self.index(sequence_col) if sequence_col is not None else None

    def index(self, name: str) -> int | None:
        return self._index.get(name.lower())

    def convert_row(self, values: dict[int, Any], strict: bool) -> list[Any]:
        """Typed row from {column index: raw value}; raises ConversionError if the row is filtered.

        docs/protocol.md, "Common: strict mode": with strict mode off a failed conversion becomes NULL, with it on
        the row is filtered; a NULL (given or produced) in a NOT NULL column is always filtered. Too-long strings
        follow ``ConversionRules.long_string`` when strict mode is off. A hidden column the load does not fill
        takes its default: 0 for `__op` and the delete sign, the mapped column's value for a Doris sequence
        column mapped to a table column.
        """
        out: list[Any] = []
        for i, (name, ctype) in enumerate(self.stored):
            raw = values.get(i)
            value = None
            if i >= len(self.columns) and i not in values:
                out.append(self._hidden_default(name, out))
                continue
            if raw is not None:
                try:
                    value = convert_value(raw, ctype, self.rules)
                except TooLong as exc:
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

    def _hidden_default(self, name: str, row: list[Any]) -> Any:
        """A hidden column the load left out: the sequence is its mapped column's value (the FE refused the load if
        nothing maps it); `__op` and the delete sign are 0, an upsert."""
        if name != SEQUENCE_COL:
            return 0
        return row[self._sequence_from] if self._sequence_from is not None else None

    def mapping(self, fmt: LoadFormat) -> list[int | None]:
        """Stored-column indexes the load's fields go to (the `columns` header, else the table's own columns in
        order); None for a field that goes nowhere. Refuses what the FE refuses when it plans the load."""
        self._check_key_headers(fmt)
        if fmt.columns is None:
            return list(range(len(self.columns)))
        out: list[int | None] = []
        for name in fmt.columns:
            idx = self.index(name)
            if idx is None and fmt.sequence_col is not None and name.lower() == fmt.sequence_col.lower():
                idx = self.index(SEQUENCE_COL)  # Doris: the header maps this source column to the sequence
            if idx is None and self.model.drops_load_column(name):
                out.append(None)
                continue
            if idx is None:
                raise LoadError(f"Unknown column '{name}' in table")
            out.append(idx)
        return out

    def _check_key_headers(self, fmt: LoadFormat) -> None:
        """Doris' planner checks of `merge_type` and `function_column.sequence_col` (D-SEQ, D-DEL)."""
        model = self.model
        if fmt.merge_type != "APPEND" and model.keys_type != UNIQUE_KEYS:
            raise LoadError("load by MERGE or DELETE is only supported in unique tables.")
        if fmt.merge_type != "APPEND" and not model.delete_sign:
            raise LoadError("load by MERGE or DELETE need to upgrade table to support batch delete.")
        sources = [c.lower() for c in fmt.columns] if fmt.columns is not None else [n.lower() for n, _ in self.columns]
        if fmt.delete_on is not None and fmt.delete_on[0].lower() not in sources:
            raise LoadError(f"Unknown column '{fmt.delete_on[0]}' in the delete condition (emulator wording)")
        mapped = model.sequence_col is not None
        if model.has_sequence and not mapped and fmt.sequence_col is None:
            raise LoadError("Table has sequence column, need to specify the sequence column")
        if fmt.sequence_col is not None and not model.has_sequence:
            raise LoadError("There is no sequence column in the table")
        if fmt.sequence_col is not None and not mapped and (
                fmt.columns is None or fmt.sequence_col.lower() not in (c.lower() for c in fmt.columns)):
            raise LoadError(f"The source sequence column [{fmt.sequence_col}] is not in the load's columns "
                            "(emulator wording)")

    def loaded(self, row: list[Any], fmt: LoadFormat, source: dict[str, Any]) -> list[Any]:
        """A converted row as stored: `merge_type: DELETE` marks every row deleted (D-DEL), MERGE the rows whose
        `source` fields (by lower-case name) meet the `delete` condition; a NULL never meets it."""
        sign = self.index(DELETE_SIGN)
        if fmt.merge_type == "DELETE" and sign is not None:
            row[sign] = 1
        if fmt.delete_on is not None and sign is not None:
            name, literal = fmt.delete_on
            value = source.get(name.lower())
            row[sign] = int(value is not None and str(value).strip() == literal)
        return row


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


def _named_fields(schema: TableSchema, fmt: LoadFormat, mapping: list[int | None]) -> list[tuple[str, int]]:
    """(field name, stored-column index) for the bodies that name their fields (JSON, Arrow): the `columns`
    header's names where it is given (a Doris sequence source keeps its own name), else the table's columns."""
    if fmt.columns is None:
        return [(schema.columns[i][0].lower(), i) for i in range(len(schema.columns))]
    return [(name.lower(), i) for name, i in zip(fmt.columns, mapping) if i is not None]


def _lowered(obj: dict[str, Any]) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in obj.items()}


def _map_by_name(obj: dict[str, Any], fields: list[tuple[str, int]]) -> dict[int, Any]:
    lowered = _lowered(obj)
    return {i: lowered.get(name) for name, i in fields}


def parse_payload(body: bytes, fmt: LoadFormat, schema: TableSchema,
                  skip_header: bool = True) -> ParseResult:
    """Parse one load body into typed rows, counting filtered rows instead of failing."""
    result = ParseResult()
    mapping = schema.mapping(fmt)
    fields = _named_fields(schema, fmt, mapping)
    if fmt.format == "arrow":  # columns by field name, values by the same rules as JSON values
        for obj in _arrow_rows(body):
            result.total += 1
            try:
                result.rows.append(schema.loaded(schema.convert_row(_map_by_name(obj, fields), fmt.strict_mode), fmt,
                                                 _lowered(obj)))
            except ConversionError as exc:
                result.filtered += 1
                result.errors.append(f"{exc}. Row: {obj!r}"[:400])
        return result
    text = body.decode("utf-8", errors="replace")
    if fmt.format == "csv":
        names = [c.lower() for c in fmt.columns] if fmt.columns is not None else [n.lower() for n, _ in schema.columns]
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
                values = {i: v for i, v in zip(mapping, record) if i is not None}
                result.rows.append(schema.loaded(schema.convert_row(values, fmt.strict_mode), fmt,
                                                 dict(zip(names, record))))
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
            result.rows.append(schema.loaded(schema.convert_row(_map_by_name(obj, fields), fmt.strict_mode), fmt,
                                             _lowered(obj)))
        except ConversionError as exc:
            result.filtered += 1
            result.errors.append(f"{exc}. Row: {json.dumps(obj)[:200]}")
    return result
