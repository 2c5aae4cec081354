"""Doris' Arrow IPC load format (`format: arrow`, Doris 2.1+): Arrow tables in the types Doris' arrow reader takes.

Doris-only: StarRocks loads no Arrow. The values are checked with the text formats' own helpers
(targets/encoding.py), so the choice of wire format never changes what lands.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import EncodingError
from ..encoding import (
    PER_SECOND,
    Tabular,
    as_utf8,
    check_date_range,
    check_finite,
    column_at,
    is_view,
    named_columns,
    wall_time,
)


@dataclass(frozen=True)
class ArrowFormat:
    """An Arrow IPC *stream* per piece, for Doris Stream Load `format: arrow`.

    What Doris' arrow reader does (read in apache/doris, be/src/vec/exec/format/arrow/
    arrow_stream_reader.cpp and be/src/vec/data_types/serde/*_serde.cpp, 2.1-3.x, and the newer
    be/src/format/arrow/arrow_stream_reader.cpp + be/src/core/data_type_serde/):
    * it opens one IPC stream reader after another until the body ends, so pieces that are each a
      complete stream can be concatenated into one body (encoding.py `encode_chunks`);
    * it matches body columns to the load's columns by name (older) or by position with a name check
      (newer), so the body's columns are the `columns` header's, in its order;
    * numbers and decimals are copied as raw buffers into the table column's C type: the Arrow type
      must have the table type's width (int32 for INT, int64 for BIGINT...) and a decimal the table's
      scale, or the values are silently wrong. Pass the table's types as `schema` and the columns are
      cast to them first (refused when a value does not fit);
    * strings: only `string`/`binary`/`fixed_size_binary` are read (large, view and dictionary
      variants are not), so they are normalised to `string`/`binary`; dates: only `date32`;
      lists: `list`;
    * DATETIME from `timestamp`: every unit is accepted; a timestamp with a zone is rendered in the
      fixed zone `+08:00` (`TimezoneUtils::default_time_zone`; the load's `timezone` header is not
      used), a zone-less one in `+08:00` too on older versions (in UTC on newer ones), and older
      versions read the value as *unsigned* (negative values break). So every timestamp is sent with
      zone `+08:00` holding the instant whose `+08:00` wall time is the value the text formats write
      (the UTC wall time, or the zone-less value), which lands the same DATETIME on every version;
      values before 1970-01-01 08:00:00 are refused (use JSON or CSV for them).
    There are no unsigned, float16, time, duration or interval columns in Doris tables; they are
    refused unless `schema` casts them. NaN/infinity are refused as in the text formats, so the
    choice of wire format never changes what lands.
    """

    schema: pa.Schema | None = None

    def headers(self) -> dict[str, str]:
        return {"format": "arrow"}

    def encode(self, data: Tabular) -> bytes:
        return encode_arrow(data, self)


_DORIS_ARROW_ZONE = "+08:00"  # TimezoneUtils::default_time_zone, which Doris' arrow reader renders in
_DORIS_ARROW_ZONE_S = 8 * 3600


def encode_arrow(data: Tabular, fmt: ArrowFormat = ArrowFormat()) -> bytes:
    """`data` as one Arrow IPC stream (schema, one record batch, end of stream), normalised for Doris."""
    if data.num_rows == 0:
        return b""
    names, arrays = [], []
    for name, column in named_columns(data):
        if fmt.schema is not None and name in fmt.schema.names:
            target = fmt.schema.field(name).type
            try:
                column = pc.cast(column, target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise EncodingError(f"column {name!r} of type {column.type} does not fit the table type {target}: {error}") from None
        names.append(name)
        arrays.append(_readable(name, name, column))
    batch = pa.RecordBatch.from_arrays(arrays, names=names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    stream: bytes = sink.getvalue().to_pybytes()
    return stream


def _readable(name: str, path: str, array: pa.Array) -> pa.Array:
    """`array` in the Arrow types Doris' reader reads as the value sent (see `ArrowFormat`)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _readable(name, path, array.dictionary_decode())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_view(kind, "string"):
        return as_utf8(name, array, path)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or is_view(kind, "binary"):
        return pc.cast(array, pa.binary())
    if pa.types.is_fixed_size_binary(kind) or pa.types.is_boolean(kind) or pa.types.is_decimal(kind):
        return array
    if pa.types.is_signed_integer(kind) or pa.types.is_float32(kind) or pa.types.is_float64(kind):
        if pa.types.is_floating(kind):
            check_finite(name, array, path)
        return array
    if pa.types.is_date(kind):
        check_date_range(name, array, path)
        return pc.cast(array, pa.date32())
    if pa.types.is_timestamp(kind):
        wall = wall_time(name, array, path)
        unit = wall.type.unit
        shifted = pc.subtract(wall.view(pa.int64()), _DORIS_ARROW_ZONE_S * PER_SECOND[unit])
        if pc.any(pc.less(shifted, 0)).as_py():
            raise EncodingError(
                f"{column_at(name, path)} has timestamps before 1970-01-01 08:00:00, which Doris' arrow reader "
                "cannot take (it reads the value as unsigned); use the JSON or CSV format for this table"
            )
        return shifted.view(pa.timestamp(unit, _DORIS_ARROW_ZONE))
    if pa.types.is_map(kind):
        entries = array.view(pa.list_(pa.struct([kind.key_field, kind.item_field]))).flatten()
        offsets = _offsets(array.view(pa.list_(entries.type)))
        keys = _readable(name, path + "{key}", entries.field(0))
        items = _readable(name, path + "{}", entries.field(1))
        return pa.MapArray.from_arrays(offsets, keys, items, mask=array.is_null())
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        values = _readable(name, path + "[]", array.flatten())
        return pa.ListArray.from_arrays(_offsets(array), values, mask=array.is_null())
    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        children = [_readable(name, f"{path}.{field.name}", child) for field, child in zip(fields, array.flatten(), strict=True)]
        return pa.StructArray.from_arrays(
            children, fields=[pa.field(f.name, c.type, f.nullable) for f, c in zip(fields, children, strict=True)], mask=array.is_null()
        )
    raise EncodingError(
        f"{column_at(name, path)} has Arrow type {kind}, which no Doris column reads as sent; cast it in the query "
        "or pass the table's types as ArrowFormat(schema=...)"
    )


def _offsets(array: pa.Array) -> pa.Array:
    """int32 offsets of a list array's flattened (NULL-free) values."""
    lengths = pc.fill_null(pc.list_value_length(array), 0)
    return pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(lengths, pa.int64()))]).cast(pa.int32())


_ARROW_TYPES = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(), "BIGINT": pa.int64(),
    "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "DATE": pa.date32(), "CHAR": pa.string(), "VARCHAR": pa.string(),
    "STRING": pa.string(),
}


def table_arrow_type(spelling: str) -> pa.DataType | None:
    """The Arrow type whose buffers Doris reads as a column of this type (None: send the value's own)."""
    base = spelling.removesuffix(" NOT NULL")
    decimal = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", base)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    return _ARROW_TYPES.get(base)
