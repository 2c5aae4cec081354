"""Arrow -> CSV/JSON wire formats, checked by parsing the bytes back the way the servers do.

The CSV side is parsed by the emulators' Stream Load parser (tests/support/doubles/emulators/load_formats.py, written
from protocol.md and the STREAM_LOAD docs, not from this encoder), the JSON side by `json`.
"""
from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import random

import pyarrow as pa
import pytest

from streaming_sink.targets.encoding import (
    CsvFormat,
    EncodingError,
    JsonFormat,
    check_header_names,
    columns_header,
    encode_chunks,
    encode_csv,
    encode_json,
    header_safe,
)
from streaming_sink.targets.streamload.doris_arrow import ArrowFormat, encode_arrow
from tests.support.doubles.emulators.load_formats import LoadFormat, split_csv

NASTY = ["plain", "", "a,b", 'say "hi"', "back\\slash", "two\nlines", "cr\rlf\r\n", "\\N", "tab\there", "ünïcødé ✓",
         '"', "\\", '\\"', ",\n", "  padded  "]


def server_format(fmt: CsvFormat) -> LoadFormat:
    """The emulator's view of the headers the encoder says to send."""
    return LoadFormat.from_headers(fmt.headers())


def test_csv_strings_null_and_empty_round_trip_through_the_stream_load_parser() -> None:
    fmt = CsvFormat()
    values = NASTY + [None]
    table = pa.table({"i": list(range(len(values))), "s": values})
    records = split_csv(encode_csv(table, fmt).decode(), server_format(fmt))
    assert records == [[str(i), v] for i, v in enumerate(values)]


@pytest.mark.parametrize(
    "fmt",
    [CsvFormat(), CsvFormat("\t", "\n"), CsvFormat("|", "\n", "'", "\\"), CsvFormat(",", "\n", '"', None),
     CsvFormat("\x01", "\x02", '"', "\\"), CsvFormat("||", "\n")],
    ids=["default", "tab", "pipe-single-quote", "no-escape", "control-chars", "multi-char-separator"],
)
def test_random_strings_round_trip_for_each_csv_format(fmt: CsvFormat) -> None:
    rng = random.Random(7)
    alphabet = list('ab,"\\\n\r\t\'|\x01\x02 N') + ["é", "✓"]
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(400)]
    values[::17] = [None] * len(values[::17])
    table = pa.table({"s": values, "n": list(range(len(values)))})
    records = split_csv(encode_csv(table, fmt).decode(), server_format(fmt))
    assert records == [[v, str(i)] for i, v in enumerate(values)]


def test_csv_renders_types_the_way_datetime_and_decimal_columns_parse_them() -> None:
    table = pa.table({
        "i": pa.array([1, None, -3], pa.int64()),
        "f": [0.1, 1 / 3, 1e20],
        "b": [True, False, None],
        "d": pa.array([decimal.Decimal("1.20"), None, decimal.Decimal("-3.05")], pa.decimal128(5, 2)),
        "day": [dt.date(2024, 2, 29), None, dt.date(1970, 1, 1)],
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), None, dt.datetime(2024, 1, 1)], pa.timestamp("ns")),
        "tz": pa.array([dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone.utc)] * 3, pa.timestamp("us", "Europe/Paris")),
    })
    rows = split_csv(encode_csv(table).decode(), server_format(CsvFormat()))
    # the zoned column is written as UTC wall time, not in its zone (Europe/Paris would be 13:00)
    assert rows[0] == ["1", "0.1", "true", "1.20", "2024-02-29", "2024-01-02 03:04:05.000006", "2024-01-01 12:00:00.000000"]
    assert rows[1] == [None, "0.3333333333333333", "false", None, None, None, "2024-01-01 12:00:00.000000"]
    assert float(rows[2][1]) == 1e20 and rows[2][2] is None


def test_nested_values_become_json_text() -> None:
    table = pa.table({"l": [[1, 2], None, []], "m": [{"k": "v,\""}, {"k": None}, None]})
    rows = split_csv(encode_csv(table).decode(), server_format(CsvFormat()))
    assert rows == [['[1,2]', '{"k":"v,\\""}'], [None, '{"k":null}'], ["[]", None]]


def test_dictionary_columns_are_decoded() -> None:
    table = pa.table({"s": pa.array(["x", "y", "x"]).dictionary_encode()})
    assert encode_csv(table) == b'"x"\n"y"\n"x"\n'


def test_values_the_text_formats_cannot_carry_are_refused_with_the_column_named() -> None:
    with pytest.raises(EncodingError, match="column 'f' has NaN or infinite values"):
        encode_csv(pa.table({"f": [1.0, float("nan")]}))
    with pytest.raises(EncodingError, match="column 'raw' holds bytes that are not UTF-8"):
        encode_json(pa.table({"raw": pa.array([b"\xff\xfe"], pa.binary())}))
    with pytest.raises(EncodingError, match="column 's' has values containing ','"):
        encode_csv(pa.table({"s": ["a,b"]}), CsvFormat(",", "\n", None, None))


def test_json_round_trips_strings_with_every_control_character() -> None:
    text = "".join(chr(c) for c in range(0x20)) + '"\\/é✓'
    table = pa.table({"s": [text, None, ""], "i": [1, 2, None], "b": [True, None, False],
                      "l": [[1], None, [2, 3]], 'odd "name"': [1.5, None, 2.0]})
    expected = [
        {"s": text, "i": 1, "b": True, "l": [1], 'odd "name"': 1.5},
        {"s": None, "i": 2, "b": None, "l": None, 'odd "name"': None},
        {"s": "", "i": None, "b": False, "l": [2, 3], 'odd "name"': 2.0},
    ]
    assert json.loads(encode_json(table)) == expected
    assert [json.loads(line) for line in encode_json(table, lines=True).decode().splitlines()] == expected


def test_empty_tables_encode_to_nothing() -> None:
    empty = pa.table({"a": pa.array([], pa.int64())})
    assert encode_csv(empty) == b"" and encode_json(empty) == b"[]" and encode_json(empty, lines=True) == b""
    assert list(encode_chunks(empty, CsvFormat())) == []


@pytest.mark.parametrize("fmt", [CsvFormat(), JsonFormat(lines=True), JsonFormat(lines=False)], ids=["csv", "jsonl", "json"])
def test_chunks_are_bounded_complete_and_add_up_to_the_whole(fmt) -> None:
    table = pa.table({"id": range(20_000), "s": [f"name-{i}" * 3 for i in range(20_000)]})
    pieces = list(encode_chunks(table, fmt, chunk_bytes=64 * 1024))
    assert len(pieces) > 5
    whole = fmt.encode(table)
    if isinstance(fmt, JsonFormat) and not fmt.lines:
        assert sum((json.loads(p) for p in pieces), []) == json.loads(whole)  # each piece a complete array
    else:
        assert b"".join(pieces) == whole
    largest_rows = max(p.count(b"\n") if fmt != JsonFormat(False) else p.count(b"{") for p in pieces)
    assert largest_rows <= 20_000 * 64 * 1024 // table.nbytes + 1


def test_chunks_of_a_multi_batch_table_keep_row_order() -> None:
    batches = [pa.record_batch({"id": pa.array(range(i * 10, i * 10 + 10))}) for i in range(5)]
    table = pa.Table.from_batches(batches)
    assert b"".join(encode_chunks(table, CsvFormat(), chunk_bytes=32)) == encode_csv(table)


def test_headers_describe_the_format_and_columns_are_back_quoted() -> None:
    assert CsvFormat().headers() == {"format": "csv", "column_separator": ",", "enclose": '"', "escape": "\\"}
    assert CsvFormat("\t", "\n", None, None).headers() == {"format": "csv"}  # the servers' defaults
    assert CsvFormat("\x01", "\x02").headers()["column_separator"] == "\\x01"
    assert CsvFormat("\x01", "\x02").headers()["row_delimiter"] == "\\x02"
    assert columns_header(pa.schema([("id", pa.int64()), ("we`ird", pa.string())])) == "`id`,`we``ird`"
    with pytest.raises(ValueError, match="single byte"):
        CsvFormat(enclose="««")


# -- issue 12: every value arrives exactly as sent, or is refused naming the column ------------------


def parse_default_csv(body: str) -> list[list[str | None]]:
    """A small parser for CsvFormat() output (enclose `"`, escape `\\`, `\\N` unenclosed is NULL), independent of the emulator."""
    records: list[list[str | None]] = []
    row: list[str | None] = []
    i = 0
    while i < len(body):
        if body[i] == '"':
            i += 1
            field = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                field.append(body[i])
                i += 1
            i += 1
            row.append("".join(field))
        else:
            end = min(j for j in (body.find(",", i), body.find("\n", i)) if j >= 0)
            raw = body[i:end]
            row.append(None if raw == "\\N" else raw)
            i = end
        if body[i] == "\n":
            records.append(row)
            row = []
        i += 1
    return records


def json_cells(table: pa.Table) -> list[dict]:
    """The table through the JSON encoder and back, decimals parsed exactly."""
    return json.loads(encode_json(table), parse_float=decimal.Decimal)


def test_maps_become_json_objects_keyed_by_the_keys_text() -> None:  # old: [["k",1]]
    table = pa.table({
        "m": pa.array([[("k", 1), ("é\"\\", None)], None, []], pa.map_(pa.string(), pa.int64())),
        "mi": pa.array([[(1, "a"), (-2, "b")], [], None], pa.map_(pa.int32(), pa.string())),
        "md": pa.array([[(dt.date(2024, 1, 2), 1.5)], None, None], pa.map_(pa.date32(), pa.float64())),
    })
    expected = [
        {"m": {"k": 1, "é\"\\": None}, "mi": {"1": "a", "-2": "b"}, "md": {"2024-01-02": 1.5}},
        {"m": None, "mi": {}, "md": None},
        {"m": {}, "mi": None, "md": None},
    ]
    assert json.loads(encode_json(table)) == expected
    rows = parse_default_csv(encode_csv(table).decode())
    assert [[None if cell is None else json.loads(cell) for cell in row] for row in rows] == [list(r.values()) for r in expected]


def test_maps_with_duplicate_keys_are_refused() -> None:  # old: [["k",1],["k",2]]
    table = pa.table({"m": pa.array([[("a", 0)], [("k", 1), ("k", 2)]], pa.map_(pa.string(), pa.int64()))})
    with pytest.raises(EncodingError, match=r"column 'm' has a map with duplicate keys \['k'\]"):
        encode_json(table)
    with pytest.raises(EncodingError, match="duplicate keys"):
        encode_csv(table)


def test_nested_decimals_are_exact_json_numbers() -> None:  # old: "1.50" (a string)
    big = decimal.Decimal("12345678901234567890.123456789")
    table = pa.table({
        "l": pa.array([[decimal.Decimal("1.50"), big, None]], pa.list_(pa.decimal128(38, 9))),
        "s": pa.array([{"d": decimal.Decimal("-0.05")}], pa.struct([("d", pa.decimal128(4, 2))])),
    })
    cells = json_cells(table)[0]
    assert cells["l"] == [decimal.Decimal("1.500000000"), big, None] and str(cells["l"][0]) == "1.500000000"
    assert cells["s"] == {"d": decimal.Decimal("-0.05")} and b'{"d":-0.05}' in encode_json(table)


def test_nested_floats_round_trip_exactly() -> None:
    values = [0.1, 1 / 3, 1e-7, 5e-324, 1.7976931348623157e308, -0.0, 1e20, 123456789.125]
    table = pa.table({"l": [values], "f32": pa.array([[0.1, 3.4028234663852886e38]], pa.list_(pa.float32()))})
    cells = json.loads(encode_json(table))[0]
    assert cells["l"] == values and math.copysign(1, cells["l"][5]) == -1
    assert pa.array(cells["f32"], pa.float32()).to_pylist() == table["f32"][0].as_py()
    assert encode_csv(pa.table({"f": [-0.0, 0.0]})) == b"-0.0\n0\n"  # old: "-0", which parses as the integer 0


@pytest.mark.parametrize("encode", [encode_csv, encode_json], ids=["csv", "json"])
def test_nan_and_infinity_are_refused_inside_nested_values_naming_the_column(encode) -> None:  # old: NaN/Infinity in the body
    with pytest.raises(EncodingError, match=r"column 'l' \(at l\[\]\) has NaN or infinite"):
        encode(pa.table({"l": [[1.0, float("nan")]]}))
    with pytest.raises(EncodingError, match=r"column 's' \(at s.x\) has NaN or infinite"):
        encode(pa.table({"s": [{"x": float("-inf")}]}))
    with pytest.raises(EncodingError, match=r"column 'm' \(at m\{\}\) has NaN or infinite"):
        encode(pa.table({"m": pa.array([[("k", float("inf"))]], pa.map_(pa.string(), pa.float64()))}))
    with pytest.raises(EncodingError, match="column 'f' has NaN or infinite"):
        encode(pa.table({"f": [float("inf")]}))


def test_values_under_a_null_parent_are_not_rendered() -> None:
    structs = pa.StructArray.from_arrays([pa.array([float("nan"), 1.0])], names=["x"], mask=pa.array([True, False]))
    assert json.loads(encode_json(pa.table({"s": structs}))) == [{"s": None}, {"s": {"x": 1.0}}]


@pytest.mark.parametrize("encode", [encode_csv, encode_json], ids=["csv", "json"])
def test_binary_inside_nested_values_is_refused(encode) -> None:  # old: Python repr b'\x00\xff'
    table = pa.table({"s": pa.array([{"b": b"\x00\xff"}], pa.struct([("b", pa.binary())]))})
    with pytest.raises(EncodingError, match=r"column 's' \(at s.b\) holds binary inside a nested value.*base64"):
        encode(table)


def test_nested_dates_and_timestamps_are_rendered_as_at_top_level() -> None:  # old: "2024-01-01 00:00:00+00:00"
    instant = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    kind = pa.struct([("t", pa.timestamp("us", "America/New_York")), ("n", pa.timestamp("ns")), ("d", pa.date32())])
    table = pa.table({
        "s": pa.array([{"t": instant, "n": dt.datetime(2024, 5, 6, 7, 8, 9, 10), "d": dt.date(2024, 2, 29)}], kind),
        "t": pa.array([instant], pa.timestamp("us", "America/New_York")),
        "n": pa.array([dt.datetime(2024, 5, 6, 7, 8, 9, 10)], pa.timestamp("ns")),
        "d": [dt.date(2024, 2, 29)],
    })
    cells = json.loads(encode_json(table))[0]
    assert cells["s"] == {"t": "2024-01-01 00:00:00.000000", "n": "2024-05-06 07:08:09.000010", "d": "2024-02-29"}
    assert (cells["t"], cells["n"], cells["d"]) == tuple(cells["s"].values())


def test_nested_strings_are_json_escaped_and_keep_utf8() -> None:
    text = "".join(chr(c) for c in range(0x20)) + '"\\/é✓😀\u2028'
    table = pa.table({"l": [[text, None, ""]], "s": [{"k\n\"": text}]})
    body = encode_json(table)
    assert "😀".encode() in body and b"\\ud83d" not in body  # 4-byte UTF-8 stays UTF-8
    assert json.loads(body) == [{"l": [text, None, ""], "s": {"k\n\"": text}}]
    rows = parse_default_csv(encode_csv(table).decode())
    assert json.loads(rows[0][0]) == [text, None, ""] and json.loads(rows[0][1]) == {"k\n\"": text}


def test_deeply_nested_values_round_trip_through_json_and_csv() -> None:
    value = [[{"x": ["a", None], "y": {"z": [1, 2]}}], [], None]
    table = pa.table({"deep": [value, None]})
    assert json.loads(encode_json(table)) == [{"deep": value}, {"deep": None}]
    assert [None if c is None else json.loads(c) for [c] in parse_default_csv(encode_csv(table).decode())] == [value, None]


def test_zoned_timestamps_are_written_as_utc_wall_time_whatever_the_zone() -> None:  # old: wall time in the Arrow zone
    # 05:30Z and 06:30Z are both 01:30 in New York on the DST fall-back night
    instants = [dt.datetime(2024, 11, 3, 5, 30, tzinfo=dt.timezone.utc), dt.datetime(2024, 11, 3, 6, 30, tzinfo=dt.timezone.utc)]
    bodies = {zone: encode_csv(pa.table({"t": pa.array(instants, pa.timestamp("us", zone))}))
              for zone in ("America/New_York", "Asia/Tokyo", "UTC")}
    assert set(bodies.values()) == {b"2024-11-03 05:30:00.000000\n2024-11-03 06:30:00.000000\n"}
    naive = pa.table({"t": pa.array([dt.datetime(2024, 11, 3, 1, 30)], pa.timestamp("ms"))})
    assert encode_csv(naive) == b"2024-11-03 01:30:00.000\n"  # no zone: written as it is


def test_nanoseconds_are_kept_when_whole_microseconds_and_refused_otherwise() -> None:  # old: truncated silently
    whole = pa.table({"t": pa.array([1_000_000_001_000], pa.timestamp("ns"))})
    assert encode_csv(whole) == b"1970-01-01 00:16:40.000001\n"
    for encode in (encode_csv, encode_json, encode_arrow):
        with pytest.raises(EncodingError, match="column 't' has timestamps with nanoseconds"):
            encode(pa.table({"t": pa.array([1_000_000_001_001], pa.timestamp("ns", "UTC"))}))


def test_dates_and_timestamps_outside_year_0_to_9999_are_refused() -> None:  # old: -0221-09-04 written
    first, last = -719_528, (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days  # 0000-01-01 is 719528 days before the epoch
    bounds = pa.table({"d": pa.array([first, last], pa.date32()),
                       "t": pa.array([-62_167_219_200_000_000, 253_402_300_799_999_999], pa.timestamp("us"))})
    assert encode_csv(bounds) == b"0000-01-01,0000-01-01 00:00:00.000000\n9999-12-31,9999-12-31 23:59:59.999999\n"
    too_early = pa.array([-800_000], pa.date32())
    cases = {
        "d": pa.table({"d": too_early}),
        "d64": pa.table({"d64": pa.array([(2_932_897) * 86_400_000], pa.date64())}),
        "t": pa.table({"t": pa.array([253_402_300_800], pa.timestamp("s", "UTC"))}),
        "l": pa.table({"l": pa.array([[-800_000]], pa.list_(pa.date32()))}),
    }
    for name, table in cases.items():
        for encode in (encode_csv, encode_json, encode_arrow):
            with pytest.raises(EncodingError, match=rf"column '{name}'.* outside 0000-01-01 \.\. 9999-12-31"):
                encode(table)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()], ids=["string", "large_string"])
def test_string_columns_with_invalid_utf8_are_refused(kind: pa.DataType) -> None:  # old: the bytes went on the wire
    column = pa.Array.from_buffers(kind, 2, pa.array(["ok", "xx"], kind).buffers()[:2] + [pa.py_buffer(b"ok\xff\xfe")])
    for encode in (encode_csv, encode_json, encode_arrow):
        with pytest.raises(EncodingError, match="column 's' is a string column holding bytes that are not UTF-8"):
            encode(pa.table({"s": column}))
    nested = pa.ListArray.from_arrays(pa.array([0, 2], pa.int32()), column)
    with pytest.raises(EncodingError, match=r"column 'l' \(at l\[\]\) is a string column holding bytes that are not UTF-8"):
        encode_json(pa.table({"l": nested}))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(column_separator="\n", row_delimiter="\n"), "must differ"),
        (dict(column_separator="||", row_delimiter="|"), "neither contain the other"),
        (dict(column_separator='"'), "contains the enclose"),
        (dict(column_separator="\\"), "contains the escape"),
        (dict(row_delimiter="\n'", enclose="'"), "contains the enclose"),
        (dict(enclose='"', escape='"'), "enclose and escape must differ"),
        (dict(column_separator="."), "occurs in values written without enclosure"),
        (dict(column_separator="-"), "occurs in values"),
        (dict(column_separator=":"), "occurs in values"),
        (dict(column_separator=" "), "occurs in values"),
        (dict(column_separator="e"), "occurs in values"),
        (dict(column_separator="1"), "occurs in values"),
        (dict(column_separator="|t|"), "occurs in values"),
        (dict(column_separator="N", escape=None), "occurs in values"),
        (dict(row_delimiter="\n0"), "occurs in values"),
    ],
)
def test_csv_options_are_cross_validated(options: dict, message: str) -> None:  # old: all accepted
    with pytest.raises(ValueError, match=message):
        CsvFormat(**options)


def test_non_ascii_column_names_are_refused_for_the_columns_header() -> None:  # old: UnicodeEncodeError at send time
    schema = pa.schema([("id", pa.int64()), ("名前", pa.string())])
    with pytest.raises(EncodingError, match=r"\['名前'\] are not printable ASCII.*rename the columns.*JSON"):
        columns_header(schema)
    with pytest.raises(EncodingError, match="rename"):
        check_header_names(schema, CsvFormat())
    check_header_names(schema, JsonFormat())  # the body carries the names
    check_header_names(schema, ArrowFormat())
    assert not header_safe("a\r\nlabel: x") and not header_safe("é") and header_safe("we`ird name")
    assert json.loads(encode_json(pa.table({"名前": ["x"]}))) == [{"名前": "x"}]


# -- ArrowFormat -----------------------------------------------------------------------------------


def read_streams(body: bytes) -> pa.Table:
    """Concatenated IPC streams, read one after another as Doris' arrow reader does."""
    source, tables = io.BytesIO(body), []
    while source.tell() < len(body):
        tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables)


def test_arrow_format_headers_and_plain_columns_arrive_unchanged() -> None:
    assert ArrowFormat().headers() == {"format": "arrow"}
    table = pa.table({
        "i8": pa.array([1, None], pa.int8()), "i64": [2**62, -1], "f": [0.1, None], "b": [True, None],
        "d": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(5, 2)), "s": ["é😀\x00", None], "raw": [b"\xff", None],
    })
    assert read_streams(ArrowFormat().encode(table)).equals(table)
    assert encode_arrow(table.slice(0, 0)) == b""


def test_arrow_format_normalises_types_doris_cannot_read() -> None:
    table = pa.table({
        "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
        "large": pa.array(["a", "b", None], pa.large_string()),
        "view": pa.array(["a", "b", None], pa.string_view()),
        "lbin": pa.array([b"a", b"\xff", None], pa.large_binary()),
        "d64": pa.array([dt.date(2024, 1, 1), None, dt.date(1969, 12, 31)], pa.date64()),
        "ll": pa.array([[1], None, []], pa.large_list(pa.int64())),
    })
    read = read_streams(encode_arrow(table))
    assert read.schema == pa.schema([("dict", pa.string()), ("large", pa.string()), ("view", pa.string()), ("lbin", pa.binary()),
                                     ("d64", pa.date32()), ("ll", pa.list_(pa.int64()))])
    assert read.to_pylist() == table.to_pylist()


def test_arrow_format_timestamps_land_as_the_text_formats_write_them() -> None:
    instants = [dt.datetime(2024, 11, 3, 5, 30, 0, 123456, tzinfo=dt.timezone.utc), None]
    table = pa.table({"z": pa.array(instants, pa.timestamp("us", "America/New_York")),
                      "n": pa.array([dt.datetime(2024, 1, 1, 1, 2, 3), None], pa.timestamp("ns")),
                      "s": pa.array([{"t": instants[0]}, None], pa.struct([("t", pa.timestamp("ms", "Asia/Tokyo"))]))})
    read = read_streams(encode_arrow(table))
    assert [field.type for field in read.schema][:2] == [pa.timestamp("us", "+08:00")] * 2
    # Doris renders these in +08:00: that wall time must be what CSV writes
    doris = dt.timezone(dt.timedelta(hours=8))
    walls = [read[name][0].as_py().astimezone(doris).replace(tzinfo=None) for name in ("z", "n")]
    assert walls == [dt.datetime(2024, 11, 3, 5, 30, 0, 123456), dt.datetime(2024, 1, 1, 1, 2, 3)]
    csv = parse_default_csv(encode_csv(table.select(["z", "n"])).decode())[0]
    assert [w.isoformat(" ", "microseconds") for w in walls] == csv
    assert read["s"][0].as_py()["t"].astimezone(doris).replace(tzinfo=None) == dt.datetime(2024, 11, 3, 5, 30, 0, 123000)
    assert read["z"][1].as_py() is None and read["s"][1].as_py() is None


def test_arrow_format_refuses_what_doris_would_read_wrongly() -> None:
    with pytest.raises(EncodingError, match="column 't' has timestamps before 1970-01-01 08:00:00"):
        encode_arrow(pa.table({"t": pa.array([dt.datetime(1970, 1, 1, 7, 59)], pa.timestamp("us"))}))
    with pytest.raises(EncodingError, match="column 'f' has NaN"):
        encode_arrow(pa.table({"f": [float("nan")]}))
    with pytest.raises(EncodingError, match="column 'u' has Arrow type uint32"):
        encode_arrow(pa.table({"u": pa.array([1], pa.uint32())}))
    with pytest.raises(EncodingError, match=r"column 'l' \(at l\[\]\) has Arrow type time64"):
        encode_arrow(pa.table({"l": pa.array([[dt.time(1)]], pa.list_(pa.time64("us")))}))


def test_arrow_format_casts_to_the_table_types_when_given_and_refuses_what_does_not_fit() -> None:
    fmt = ArrowFormat(schema=pa.schema([("id", pa.int64()), ("u", pa.int32()), ("d", pa.decimal128(10, 4))]))
    table = pa.table({"id": pa.array([1], pa.int32()), "u": pa.array([7], pa.uint16()),
                      "d": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2)), "other": ["x"]})
    read = read_streams(fmt.encode(table))
    assert read.schema.types[:3] == [pa.int64(), pa.int32(), pa.decimal128(10, 4)]
    assert read.to_pylist() == [{"id": 1, "u": 7, "d": decimal.Decimal("1.2500"), "other": "x"}]
    narrow = ArrowFormat(schema=pa.schema([("d", pa.decimal128(5, 1))]))
    with pytest.raises(EncodingError, match="column 'd' of type decimal128.* does not fit the table type decimal128.5, 1."):
        narrow.encode(table.select(["d"]))


def test_arrow_chunks_are_complete_streams_that_concatenate_to_the_table() -> None:
    table = pa.table({"id": range(5_000), "s": [f"name-{i}" for i in range(5_000)],
                      "m": pa.array([[(str(i), i)] for i in range(5_000)], pa.map_(pa.string(), pa.int64()))})
    pieces = list(encode_chunks(table, ArrowFormat(), chunk_bytes=16 * 1024))
    assert len(pieces) > 3
    assert all(pa.ipc.open_stream(piece).read_all().num_rows > 0 for piece in pieces)
    assert read_streams(b"".join(pieces)).to_pylist() == table.to_pylist()
