"""Wide integers and decimals at their edges on the whole-database path (issue 26): a table the job does not list is
parsed with the types the target's columns give (target_tables.py), and every value of its column's range reaches the
table as it came, while a value the column cannot hold (out of range, a fraction in an integer, places a decimal would
round away) is a dead letter naming the column, never wrapped, rounded or truncated. The frame as the packaged job
builds it, split as the sink's writers take it.
"""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.config import resolve_config
from streaming_sink.frame import build_frame
from streaming_sink.target_tables import _schema_from_columns
from streaming_sink.targets import USER_ENV, descriptor_for
from tests.integration.test_whole_database import _rows_by_table

pytestmark = pytest.mark.slow

DEAD = "dead_letters"
U64, I64 = 2**64 - 1, 2**63 - 1
UNPARSED = "not valid JSON for the schema of t: field "  # a value Spark's JSON parser cannot read as the field's type


def _load(tmp_path: Path, spark: Any, url: str, columns: dict[str, str], messages: list[dict[str, Any]]):
    """(rows of table t, {id: reason} of the dead letters) for `messages` into a table t of `columns` not listed."""
    spec = resolve_config({
        "job_id": "wide", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"}, "dead_letters": {"table": DEAD},
        "target": {"url": url, "database": "db"}, "sink": {"metadata_columns": False}}, tmp_path)
    ddl, why = _schema_from_columns(spec, descriptor_for(url).columns, "t", columns)
    assert why is None and ddl is not None
    records = spark.createDataFrame(
        [(None, json.dumps(m).encode(), "pg.public.t", 0, n, dt.datetime(2026, 1, 1), 0) for n, m in enumerate(messages)],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestampType INT")
    rows = _rows_by_table(build_frame(records, spec, {"t": ddl}, {"t": columns}), spec, {"t": ddl})
    return (sorted(rows.get("t", []), key=lambda row: row["id"]),
            {json.loads(row["raw_value"])["id"]: row["reason"] for row in rows.get(DEAD, [])})


def test_clickhouse_unsigned_and_128_bit_integers_at_their_edges(tmp_path, spark_session):
    columns = {"id": "Int64", "u64": "Nullable(UInt64)", "u32": "Nullable(UInt32)", "i128": "Nullable(Int128)"}
    good = [{"id": 1, "u64": U64, "u32": 2**32 - 1, "i128": 10**38 - 1}, {"id": 2, "u64": 0, "u32": 0, "i128": -(10**38 - 1)},
            {"id": I64, "u64": 2**63}, {"id": -I64 - 1, "u64": 1.0}]
    bad = {3: ({"u64": U64 + 1}, "column 'u64' of t (Nullable(UInt64)): integer out of range [0, 18446744073709551615]"),
           4: ({"u64": -1}, "column 'u64' of t (Nullable(UInt64)): integer out of range [0, 18446744073709551615]"),
           5: ({"u64": 1.5}, "column 'u64' of t (Nullable(UInt64)): not an integer"),
           6: ({"u64": 10**20}, f"{UNPARSED}'u64' holds {10**20}, which does not parse as DECIMAL(20,0) (column type "
                                "Nullable(UInt64))"),  # beyond DECIMAL(20,0): Spark's parser refuses it
           7: ({"u32": 2**32}, "column 'u32' of t (Nullable(UInt32)): integer out of range [0, 4294967295]"),
           8: ({"u32": -1}, "column 'u32' of t (Nullable(UInt32)): integer out of range [0, 4294967295]"),
           9: ({"i128": 10**38}, f"{UNPARSED}'i128' holds {10**38}, which does not parse as DECIMAL(38,0) (column type "
                                  "Nullable(Int128))"),  # 39 digits: more than Spark's DECIMAL(38) holds
           10: ({"u32": 0.5}, f"{UNPARSED}'u32' holds 0.5, which does not parse as BIGINT (column type Nullable(UInt32))"),
           11: ({"i128": 2.5}, "column 'i128' of t (Nullable(Int128)): not an integer")}
    rows, dead = _load(tmp_path, spark_session, "clickhouse://127.0.0.1:8123", columns,
                       good + [{"id": ident, **change} for ident, (change, _) in bad.items()])
    assert dead == {ident: reason for ident, (_, reason) in bad.items()}
    assert [(r["id"], r["u64"], r["u32"], r["i128"]) for r in rows] == sorted(
        (m["id"], None if "u64" not in m else Decimal(m["u64"]), m.get("u32"),
         None if "i128" not in m else Decimal(m["i128"])) for m in good)


def test_starrocks_bigint_largeint_and_decimal_at_their_edges(tmp_path, spark_session, monkeypatch):
    monkeypatch.setenv(USER_ENV, "root")
    columns = {"id": "BIGINT", "big": "LARGEINT", "d": "DECIMAL(10,2)", "wide": "DECIMAL(38,10)"}
    good = [{"id": I64, "big": 10**38 - 1, "d": 99999999.99, "wide": "9999999999999999999999999999.9999999999"},
            {"id": 9, "big": "12"}, {"id": 10, "big": -7.0}, {"id": 11, "big": 1e3, "wide": "1.100000000000"},  # 1e3 is written 1000.0
            {"id": -I64 - 1, "big": -(10**38 - 1), "d": -99999999.99, "wide": "-0.0000000001"},
            {"id": 1, "d": "0.1"}]
    where = "column 'd' of t (DECIMAL(10,2))"
    bad = {2: ({"d": 1.234}, f"{where}: more than 2 decimal places, would be rounded"),
           3: ({"d": 12345678.915}, f"{where}: more than 2 decimal places, would be rounded"),
           # 9 integer digits, more than the column's 8 (the value as Spark's JSON reader writes it back)
           4: ({"d": 123456789.5}, f"{UNPARSED}'d' holds 1.234567895E8, which does not parse as DECIMAL(10,2) (column type "
                                   "DECIMAL(10,2))"),
           5: ({"big": 2**127 - 1}, f"{UNPARSED}'big' holds {2**127 - 1}, which does not parse as DECIMAL(38,0) (column "
                                    "type LARGEINT)"),  # LARGEINT past 38 digits: beyond Spark
           6: ({"big": 1.5}, "column 'big' of t (LARGEINT): not an integer"),  # DECIMAL(38,0) would round it to 2
           7: ({"big": "-2.5"}, "column 'big' of t (LARGEINT): not an integer"),
           8: ({"wide": "0.00000000001"}, "column 'wide' of t (DECIMAL(38,10)): more than 10 decimal places, would be "
                                          "rounded")}  # DECIMAL(38,10): no place to parse it wider
    rows, dead = _load(tmp_path, spark_session, "starrocks://127.0.0.1:8030", columns,
                       good + [{"id": ident, **change} for ident, (change, _) in bad.items()])
    assert dead == {ident: reason for ident, (_, reason) in bad.items()}
    assert [(r["id"], r["big"], r["d"], r["wide"]) for r in rows] == sorted(
        (m["id"], None if "big" not in m else Decimal(m["big"]),
         None if "d" not in m else Decimal(str(m["d"])).quantize(Decimal("0.01")),
         None if "wide" not in m else Decimal(m["wide"])) for m in good)
