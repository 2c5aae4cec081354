"""Which target engines the ClickHouse sink refuses at start (streaming_sink/targets/clickhouse/engines.py), on the
real engine: for every engine the embedded engine (chdb) can create, the verdict on the real system.tables row,
checked against what the real engine does when the sink's move commit is tried on it (staging `AS` the table,
rows in, partitions moved). chdb opens one data path per process, so the real tables live in a subprocess.
The verdicts on rows as a server shows them are in tests/unit/test_clickhouse_engines.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from streaming_sink.targets.clickhouse.engines import (
    DATABASE_FACTS_QUERY,
    FACTS_QUERY,
    INSERT,
    MOVE,
    TableFacts,
    engine_refusal,
)

MODES = (MOVE, INSERT)


# -- the real engine (chdb) ----------------------------------------------------------------------

# name -> (CREATE body after `CREATE TABLE db.<name>`, or a whole statement; rows to load, as a SELECT)
_REAL = {
    "mt": ("(a Int32, p Int32) ENGINE = MergeTree PARTITION BY p ORDER BY a", "SELECT number, number % 3 FROM numbers(9)"),
    "rmt": ("(a Int32, p Int32) ENGINE = ReplacingMergeTree PARTITION BY p ORDER BY a", "SELECT number, number % 2 FROM numbers(8)"),
    "smt": ("(a Int32, x Int64) ENGINE = SummingMergeTree ORDER BY a", "SELECT number, 1 FROM numbers(5)"),
    "amt": ("(a Int32, x AggregateFunction(sum, Int64)) ENGINE = AggregatingMergeTree ORDER BY a",
            "SELECT toInt32(number), sumState(toInt64(number)) FROM numbers(4) GROUP BY number"),
    "cmt": ("(a Int32, s Int8) ENGINE = CollapsingMergeTree(s) ORDER BY a", "SELECT number, 1 FROM numbers(6)"),
    "vcmt": ("(a Int32, s Int8, v UInt32) ENGINE = VersionedCollapsingMergeTree(s, v) ORDER BY a", "SELECT number, 1, 1 FROM numbers(6)"),
    "comt": ("(a Int32, x Nullable(Int64)) ENGINE = CoalescingMergeTree ORDER BY a", "SELECT number, number FROM numbers(5)"),
    "ttl": ("(a Int32, d DateTime) ENGINE = MergeTree PARTITION BY toYYYYMM(d) ORDER BY a TTL d + INTERVAL 10 YEAR",
            "SELECT number, now() FROM numbers(5)"),
    "proj": ("(a Int32, b Int32, PROJECTION pb (SELECT * ORDER BY b)) ENGINE = MergeTree PARTITION BY a % 2 ORDER BY a",
             "SELECT number, number FROM numbers(6)"),
    "log": ("(a Int32) ENGINE = Log", "SELECT number FROM numbers(3)"),
    "tinylog": ("(a Int32) ENGINE = TinyLog", "SELECT number FROM numbers(3)"),
    "stripelog": ("(a Int32) ENGINE = StripeLog", "SELECT number FROM numbers(3)"),
    "memory": ("(a Int32) ENGINE = Memory", "SELECT number FROM numbers(3)"),
    "null": ("(a Int32) ENGINE = Null", "SELECT number FROM numbers(3)"),
    "buffer": ("AS {db}.mt ENGINE = Buffer({db}, mt, 1, 10, 100, 10000, 1000000, 10000000, 100000000)",
               "SELECT number, 0 FROM numbers(3)"),
    "set": ("(a Int32) ENGINE = Set", "SELECT number FROM numbers(3)"),
    "join": ("(a Int32) ENGINE = Join(ANY, LEFT, a)", "SELECT number FROM numbers(3)"),
    "merge": ("AS {db}.mt ENGINE = Merge({db}, '^mt$')", "SELECT number, 0 FROM numbers(3)"),
    "file": ("(a Int32) ENGINE = File(CSV)", "SELECT number FROM numbers(3)"),
    "rocks": ("(a Int32) ENGINE = EmbeddedRocksDB PRIMARY KEY a", "SELECT number FROM numbers(3)"),
    "view": ("CREATE VIEW {db}.view AS SELECT * FROM {db}.mt", ""),
    "mview": ("CREATE MATERIALIZED VIEW {db}.mview ENGINE = MergeTree ORDER BY a AS SELECT a FROM {db}.mt", ""),
    "dict": ("CREATE DICTIONARY {db}.dict (a Int32, p Int32) PRIMARY KEY a SOURCE(CLICKHOUSE(TABLE 'mt' DB '{db}')) "
             "LIFETIME(0) LAYOUT(FLAT())", ""),
}

# Runs in its own process: creates each table, reads its facts with FACTS_QUERY, then tries the sink's
# move commit on it (a staging table AS it, the rows in, every partition moved) and reports what happened.
_PROBE = r"""
import atexit, json, shutil, sys, tempfile
import clickhouse_connect
spec, query, all_query = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
path = tempfile.mkdtemp(prefix="ch-engines-")
atexit.register(shutil.rmtree, path, True)
client = clickhouse_connect.get_client(dsn="chdb://" + path)
db = "engines"
client.command(f"CREATE DATABASE {db}")
out = {}
def first_line(error):
    return str(error).strip().splitlines()[0][:300]
for name, (body, rows) in spec.items():
    statement = body.format(db=db)
    try:
        client.command(statement if statement.startswith("CREATE ") else f"CREATE TABLE {db}.{name} {statement}")
    except Exception as error:
        out[name] = {"created": False, "error": first_line(error)}
        continue
    result = client.query(query, parameters={"db": db, "t": name})
    entry = {"created": True, "row": dict(zip(result.column_names, result.result_rows[0]))}
    if rows:
        staging = f"ss_{name}_staging"
        try:
            client.command(f"CREATE TABLE {db}.{staging} AS {db}.{name}")
            client.command(f"INSERT INTO {db}.{staging} {rows}")
            loaded = int(client.query(f"SELECT count() FROM {db}.{staging}").result_rows[0][0])
            parts = client.query(
                "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active",
                parameters={"db": db, "t": staging}).result_rows
            if not parts:
                raise RuntimeError("the staging table lists no partitions")
            for (partition_id,) in parts:
                client.command(f"ALTER TABLE {db}.{staging} MOVE PARTITION ID '{partition_id}' TO TABLE {db}.{name}")
            entry["move"] = {"loaded": loaded, "left": int(client.query(f"SELECT count() FROM {db}.{staging}").result_rows[0][0]),
                             "visible": int(client.query(f"SELECT count() FROM {db}.{name}").result_rows[0][0])}
        except Exception as error:
            entry["move"] = {"error": first_line(error)}
    out[name] = entry
for name, engine in (("rmt_default", "ReplicatedMergeTree"), ("rmt_path", "ReplicatedMergeTree('/clickhouse/tables/x', 'r1')")):
    try:
        client.command(f"CREATE TABLE {db}.{name} (a Int32) ENGINE = {engine} ORDER BY a")
        out[name] = {"created": True}
    except Exception as error:
        out[name] = {"created": False, "error": first_line(error)}
# A staging table AS a Buffer table is a Buffer into the same destination: aborting it (DROP) flushes its rows there.
before = int(client.query(f"SELECT count() FROM {db}.mt").result_rows[0][0])
client.command(f"CREATE TABLE {db}.ss_buffer_abort AS {db}.buffer")
client.command(f"INSERT INTO {db}.ss_buffer_abort SELECT number, 0 FROM numbers(4)")
client.command(f"DROP TABLE {db}.ss_buffer_abort SYNC")
out["buffer_abort_leaked"] = int(client.query(f"SELECT count() FROM {db}.mt").result_rows[0][0]) - before
out["database_facts"] = sorted(r[0] for r in client.query(all_query, parameters={"db": db}).result_rows)
out["clusters"] = client.query("SELECT count() FROM system.clusters").result_rows[0][0]
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    argv = [sys.executable, "-c", _PROBE, json.dumps(_REAL), FACTS_QUERY, DATABASE_FACTS_QUERY]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_COMMITTED = {"mt", "rmt", "smt", "amt", "cmt", "vcmt", "comt", "ttl", "proj"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(_REAL))
def test_verdict_on_the_real_engine(real: dict[str, Any], name: str, mode: str) -> None:
    entry = real[name]
    assert entry["created"], entry
    row = TableFacts.from_row(entry["row"])
    assert row.name == name and row.database_engine == "Atomic"
    why = engine_refusal(row, mode)
    if name in _COMMITTED:
        assert why is None, why
    else:
        assert why is not None and why.startswith(f"{row.engine}:"), why


@pytest.mark.parametrize("name", sorted(n for n, (_, rows) in _REAL.items() if rows))
def test_the_real_engine_agrees_with_the_verdict(real: dict[str, Any], name: str) -> None:
    """What the verdict accepts, the real engine commits by moves with every row visible; what it refuses,
    the engine either rejects (no partitions, no move) or does not keep (Null, Buffer's memory, Merge)."""
    move = real[name]["move"]
    if name in _COMMITTED:
        assert "error" not in move, move
        assert move["left"] == 0 and move["visible"] == move["loaded"] > 0, move
    else:
        assert "error" in move or move["visible"] != move["loaded"], move


def test_the_real_engine_cannot_make_replicated_tables_here(real: dict[str, Any]) -> None:
    """Why Replicated verdicts are tested on rows only: no Keeper, no cluster. The `{uuid}` default path is
    refused outside a Replicated database, as the Keeper-path rule says."""
    assert not real["rmt_default"]["created"] and "uuid" in real["rmt_default"]["error"]
    assert not real["rmt_path"]["created"]
    assert real["clusters"] == 0  # so no Distributed table either


def test_an_aborted_buffer_staging_table_writes_into_the_destination(real: dict[str, Any]) -> None:
    """Why Buffer is refused rather than left to fail later: a staging table made AS a Buffer table buffers into
    the same destination, and dropping it (the sink's abort) flushes the rows there: an aborted batch visible."""
    assert real["buffer_abort_leaked"] == 4


def test_the_database_query_lists_every_table(real: dict[str, Any]) -> None:
    """What `routable_tables` would read once for the whole database: every table and view, the staging ones too."""
    assert set(_REAL) <= set(real["database_facts"])
