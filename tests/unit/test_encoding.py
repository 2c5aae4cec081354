"""Arrow -> CSV/JSON wire formats, checked by parsing the bytes back the way the servers do.

The CSV side is parsed by the emulators' Stream Load parser (tests/emulators/common.py, written
from protocol.md and the STREAM_LOAD docs, not from this encoder), the JSON side by `json`.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import random

import pyarrow as pa
import pytest

from streaming_sink.encoding import (
    CsvFormat, EncodingError, JsonFormat, columns_header, encode_chunks, encode_csv, encode_json,
)
from tests.emulators.common import LoadFormat, split_csv

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
    assert rows[0] == ["1", "0.1", "true", "1.20", "2024-02-29", "2024-01-02 03:04:05.000006", "2024-01-01 13:00:00.000000"]
    assert rows[1] == [None, "0.3333333333333333", "false", None, None, None, "2024-01-01 13:00:00.000000"]
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
