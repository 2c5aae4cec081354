"""The ClickHouse HTTP front answers as the engine does (issue 15, item 1).

Every statement the ClickHouse target sends is run through the front with clickhouse-connect over
HTTP and directly in chdb on a twin path (another process), and the answers must be equal: values,
column names and types, error codes. Then the HTTP details the client relies on (errors, settings,
sessions, compression), concurrent writers (threads and processes), the real target over HTTP, and
each fault knob once.
"""
from __future__ import annotations

import gzip
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import pyarrow as pa
import pytest
import urllib3
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from streaming_sink.committable import TxnRef
from streaming_sink.labels import make_label
from streaming_sink.targets import target_from_url
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseError, ClickHouseTarget
from streaming_sink.targets.clickhouse.engines import DATABASE_FACTS_QUERY, FACTS_QUERY
from streaming_sink.targets.clickhouse.insert_commit import INSERT_SETTINGS
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.doubles.clickhouse_front.twin import Twin, outcome

DB, TABLE = "analytics", "orders"
STAGING = "ss_job_q_7_orders_0_e1w0t0_0123456789ab"


def http_client(front: ClickHouseFront, **kwargs: Any) -> Any:
    return clickhouse_connect.get_client(host=front.host, port=front.port, **kwargs)


def orders(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "name": [f"n{i}" for i in ids]})


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    twin = Twin(str(tmp_path_factory.mktemp("twin") / "ch"))
    yield twin
    twin.close()


# The target's statements, in the order a commit runs them (streaming_sink/targets/clickhouse/), each as
# (client method, args, kwargs). Both sides start empty and run the same list, so every answer must match.
TABLES_Q = "SELECT name, engine FROM system.tables WHERE database = {db:String} ORDER BY name"
TARGET_STATEMENTS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("command", ("SELECT version(), timezone()",), {}),
    ("command", (f"CREATE DATABASE IF NOT EXISTS {DB}",), {}),
    ("query", ("SELECT count() FROM system.databases WHERE name = {db:String}",), {"parameters": {"db": DB}}),
    ("command", (f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id",), {}),
    ("command", (f"CREATE TABLE IF NOT EXISTS `{DB}`.`{LEDGER_TABLE}` (label String, target_table String, rows UInt64, "
                 "state String DEFAULT 'committed', committed_at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY label",), {}),
    ("command", (f"ALTER TABLE `{DB}`.`{LEDGER_TABLE}` ADD COLUMN IF NOT EXISTS state String DEFAULT 'committed'",), {}),
    ("query", ("SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",),
     {"parameters": {"db": DB, "t": LEDGER_TABLE}}),
    ("query", (TABLES_Q,), {"parameters": {"db": DB}}),
    ("query", (DATABASE_FACTS_QUERY + " ORDER BY name",), {"parameters": {"db": DB}}),  # engine checks (ordered to compare)
    ("query", (FACTS_QUERY,), {"parameters": {"db": DB, "t": TABLE}}),
    ("query", ("SELECT name FROM system.settings WHERE has({names:Array(String)}, name) ORDER BY name",),  # commit_mode insert
     {"parameters": {"names": list(INSERT_SETTINGS)}}),
    ("query", ("SELECT value FROM system.merge_tree_settings WHERE name = {n:String}",),
     {"parameters": {"n": "non_replicated_deduplication_window"}}),
    ("query", ("SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",),
     {"parameters": {"db": DB, "t": TABLE}}),
    ("command", (f"CREATE TABLE `{DB}`.`{STAGING}` AS `{DB}`.`{TABLE}`",), {}),
    ("command", (f"CREATE TABLE `{DB}`.`{STAGING}` AS `{DB}`.`{TABLE}`",), {}),  # a second writer's CREATE fails alike
    ("insert_arrow", (f"`{STAGING}`", orders(range(0, 10))), {"database": DB}),
    ("insert", (f"{DB}.{STAGING}", [[10, "n10"], [11, "n11"]]), {"column_names": ["id", "name"]}),
    ("insert_arrow", (f"`{STAGING}`", orders(range(12, 14))), {"database": DB, "settings": {"insert_deduplication_token": "tok-1"}}),
    # an INSERT's body is data whatever its bytes: chdb, handed it as query text, stops inline data at a blank line
    ("insert_arrow", (f"`{STAGING}`", pa.table({"id": pa.array([14], pa.int64()), "name": ["one line\n\nand another"]})),
     {"database": DB}),
    ("query", (f"SELECT count() FROM `{DB}`.`{STAGING}`",), {}),
    ("command", (f"EXISTS TABLE `{DB}`.`{STAGING}`",), {}),
    ("query", ("SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active "
               "ORDER BY partition_id",), {"parameters": {"db": DB, "t": STAGING}}),
    ("query", (f"SELECT DISTINCT state FROM `{DB}`.`{LEDGER_TABLE}` WHERE label = {{label:String}}",), {"parameters": {"label": STAGING}}),
    ("command", (f"INSERT INTO `{DB}`.`{LEDGER_TABLE}` (label, target_table, rows, state) VALUES "
                 f"('{STAGING}', '{TABLE}', 15, 'moving')",), {}),
    ("command", (f"ALTER TABLE `{DB}`.`{STAGING}` MOVE PARTITION ID '0' TO TABLE `{DB}`.`{TABLE}`",), {}),
    ("command", (f"ALTER TABLE `{DB}`.`{STAGING}` MOVE PARTITION ID '1' TO TABLE `{DB}`.`{TABLE}`",), {}),
    ("query", (f"SELECT count() FROM `{DB}`.`{STAGING}`",), {}),
    ("command", (f"INSERT INTO `{DB}`.`{LEDGER_TABLE}` (label, target_table, rows, state) VALUES "
                 f"('{STAGING}', '{TABLE}', 15, 'committed')",), {}),
    ("query", (f"SELECT DISTINCT state FROM `{DB}`.`{LEDGER_TABLE}` WHERE label = {{label:String}} ORDER BY state",),
     {"parameters": {"label": STAGING}}),
    ("command", (f"DROP TABLE IF EXISTS `{DB}`.`{STAGING}` SYNC",), {}),
    ("command", (f"EXISTS TABLE `{DB}`.`{STAGING}`",), {}),
    ("query", (f"SELECT id, name FROM `{DB}`.`{TABLE}` ORDER BY id",), {}),
    ("query_arrow", (f"SELECT id, name FROM `{DB}`.`{TABLE}` WHERE id < {{n:Int64}} ORDER BY id",), {"parameters": {"n": 3}}),
    ("query", ("SELECT label, target_table, rows, state FROM {db:Identifier}.{t:Identifier} ORDER BY state",),
     {"parameters": {"db": DB, "t": LEDGER_TABLE}}),
    ("query", ("SELECT getSetting('insert_deduplication_token') AS token",), {"settings": {"insert_deduplication_token": "tok-2"}}),
    ("query", ("SELECT getSetting('insert_deduplication_token') AS token",), {}),
    ("query", (f"SELECT * FROM `{DB}`.`nope`",), {}),
    ("command", (f"DROP TABLE `{DB}`.`nope`",), {}),
    ("command", ("SELEC 1",), {}),
    ("query", ("SELECT 1",), {"settings": {"no_such_setting_anywhere": "1"}}),
    ("query", (TABLES_Q,), {"parameters": {"db": DB}}),
]


def test_every_statement_of_the_target_answers_as_the_engine_does(clickhouse_front: ClickHouseFront, twin: Twin) -> None:
    """Values, names, types and error codes through HTTP equal the engine's own, statement by statement."""
    client = http_client(clickhouse_front)
    for method, args, kwargs in TARGET_STATEMENTS:
        assert outcome(client, method, *args, **kwargs) == twin.run(method, *args, **kwargs), (method, args)
    assert client.server_version == twin.run("command", "SELECT version()")[1]


def test_an_unknown_table_is_clickhouse_error_60(clickhouse_front: ClickHouseFront) -> None:
    client = http_client(clickhouse_front)
    with pytest.raises(DatabaseError, match=r"Code: 60\. DB::Exception: .*\(UNKNOWN_TABLE\) \(version [\d.]+\)") as raised:
        client.query("SELECT * FROM default.nope")
    assert raised.value.code == 60 and raised.value.name == "UNKNOWN_TABLE"
    # the wire form: status from the code (404 for unknown objects), the code in its header
    answer = urllib3.request("POST", clickhouse_front.url + "/?database=default", body=b"SELECT * FROM nope")
    assert (answer.status, answer.headers["X-ClickHouse-Exception-Code"]) == (404, "60")
    assert answer.data.decode().startswith("Code: 60. DB::Exception:")
    syntax = urllib3.request("POST", clickhouse_front.url + "/", body=b"SELEC 1")
    assert (syntax.status, syntax.headers["X-ClickHouse-Exception-Code"]) == (400, "62")


def test_query_parameter_body_database_and_headers(clickhouse_front: ClickHouseFront) -> None:
    """The statement is the `query` parameter, a line break and the body; answers carry the headers the client reads."""
    url = clickhouse_front.url
    http_client(clickhouse_front).command("CREATE DATABASE d1")
    urllib3.request("POST", url + "/?database=d1&query=CREATE%20TABLE%20t%20(a%20UInt8)%20ENGINE%3DMemory", body=b"")
    insert = urllib3.request("POST", url + "/?database=d1&query=INSERT%20INTO%20t%20FORMAT%20TSV", body=b"1\n2\n")
    assert insert.status == 200 and "X-ClickHouse-Format" not in insert.headers
    assert insert.headers["X-ClickHouse-Summary"].startswith("{") and '"written_rows":"2"' in insert.headers["X-ClickHouse-Summary"]
    select = urllib3.request("GET", url + "/?database=d1&default_format=JSONEachRow&query=SELECT%20sum(a)%20AS%20s%20FROM%20t&query_id=q1")
    assert select.data == b'{"s":"3"}\n' or select.data == b'{"s":3}\n'
    assert (select.headers["X-ClickHouse-Format"], select.headers["X-ClickHouse-Query-Id"]) == ("JSONEachRow", "q1")
    assert select.headers["X-ClickHouse-Timezone"] == clickhouse_front.engine.timezone
    readonly = urllib3.request("GET", url + "/?database=d1&query=DROP%20TABLE%20t")
    assert (readonly.status, readonly.headers["X-ClickHouse-Exception-Code"]) == (500, "164")
    assert urllib3.request("GET", url + "/ping").data == b"Ok.\n"


def test_settings_apply_to_their_statement_only_and_sessions_keep_set(clickhouse_front: ClickHouseFront) -> None:
    one, other = http_client(clickhouse_front), http_client(clickhouse_front)
    token = "SELECT getSetting('insert_deduplication_token')"
    assert one.command(token, settings={"insert_deduplication_token": "abc"}) == "abc"
    assert one.command(token) == "" and other.command(token) == ""
    one.command("SET max_block_size = 1234")
    assert one.command("SELECT getSetting('max_block_size')") == 1234  # the session keeps it
    assert other.command("SELECT getSetting('max_block_size')") != 1234  # another session does not see it
    with pytest.raises(DatabaseError) as raised:
        one.query("SELECT 1", settings={"no_such_setting_anywhere": "1"})
    assert raised.value.code == 115


def test_a_session_runs_one_statement_at_a_time(clickhouse_front: ClickHouseFront) -> None:
    """A second statement in a busy session gets 373 SESSION_IS_LOCKED; session_check on a missing one 372."""
    entered = threading.Event()

    def held(text: str) -> bool:
        if "held_statement" in text:
            entered.set()
            return True
        return False

    clickhouse_front.faults.delay.arm(held, seconds=30, phase="before")
    url = clickhouse_front.url + "/?session_id=s1"
    first = threading.Thread(target=urllib3.request, args=("POST", url), kwargs={"body": b"SELECT 'held_statement'"})
    first.start()
    assert entered.wait(30)
    second = urllib3.request("POST", url, body=b"SELECT 2")
    clickhouse_front.faults.release()
    first.join()
    assert (second.status, second.headers["X-ClickHouse-Exception-Code"]) == (500, "373")
    missing = urllib3.request("POST", clickhouse_front.url + "/?session_id=nobody&session_check=1", body=b"SELECT 1")
    assert missing.headers["X-ClickHouse-Exception-Code"] == "372"


def test_compressed_requests_and_answers(clickhouse_front: ClickHouseFront) -> None:
    """Request bodies by Content-Encoding; answers when enable_http_compression asks, in ClickHouse's preferred coding."""
    client = http_client(clickhouse_front)
    client.command("CREATE TABLE default.c (a UInt32) ENGINE = MergeTree ORDER BY a")
    client.insert("default.c", [[i] for i in range(100)], column_names=["a"])  # Native, lz4 by default
    assert clickhouse_front.encodings["request", "lz4"] >= 1
    assert client.query("SELECT sum(a) FROM default.c").result_rows == [(4950,)]
    assert clickhouse_front.encodings["response", "zstd"] >= 1  # the client accepts lz4,zstd,...: zstd is preferred
    body = gzip.compress(b"INSERT INTO default.c FORMAT TSV\n1000\n")
    assert urllib3.request("POST", clickhouse_front.url + "/", body=body, headers={"Content-Encoding": "gzip"}).status == 200
    answer = urllib3.request("POST", clickhouse_front.url + "/?enable_http_compression=1", body=b"SELECT count() FROM default.c",
                             headers={"Accept-Encoding": "gzip, deflate"}, decode_content=False)
    assert answer.headers["Content-Encoding"] == "gzip" and gzip.decompress(answer.data) == b"101\n"


def test_threads_insert_at_once_and_all_land(clickhouse_front: ClickHouseFront) -> None:
    http_client(clickhouse_front).command("CREATE TABLE default.many (id Int64, name String) ENGINE = MergeTree ORDER BY id")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            client = http_client(clickhouse_front)
            for k in range(5):
                client.insert_arrow("many", orders(range(n * 1000 + k * 10, n * 1000 + k * 10 + 10)), database="default")
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert http_client(clickhouse_front).query("SELECT count(), uniqExact(id) FROM default.many").result_rows == [(300, 300)]


def _process_writer(host: str, port: int, n: int) -> None:
    client = clickhouse_connect.get_client(host=host, port=port)
    for k in range(3):
        client.insert_arrow("procs", orders(range(n * 100 + k * 10, n * 100 + k * 10 + 10)), database="default")


def test_processes_insert_at_once_and_all_land(clickhouse_front: ClickHouseFront) -> None:
    """Like Spark tasks in their Python workers: separate processes, each its own client."""
    http_client(clickhouse_front).command("CREATE TABLE default.procs (id Int64, name String) ENGINE = MergeTree ORDER BY id")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_process_writer, args=(clickhouse_front.host, clickhouse_front.port, n)) for n in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert http_client(clickhouse_front).query("SELECT count() FROM default.procs").result_rows == [(90,)]


def _target(front: ClickHouseFront) -> ClickHouseTarget:
    target = target_from_url(front.target_url, database=DB)
    assert isinstance(target, ClickHouseTarget) and target.url == front.url and not target.embedded
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    target.client().command(f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id")
    assert target.routable_tables() == {TABLE}
    return target


def _prepared(target: ClickHouseTarget, partition: int, rows: pa.Table) -> Any:
    txn = TxnRef("clickhouse", DB, TABLE, make_label("job", "query-1", 7, TABLE, partition, "e1w0t0"), partition, "e1w0t0")
    transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    transaction.write(rows)
    [part] = transaction.prepare()
    return part.committable("checksum")


def test_the_target_commits_through_the_front(clickhouse_front: ClickHouseFront) -> None:
    """begin/write/prepare in writer threads (as tasks would), commit in the driver: the rows are exactly those sent."""
    target = _target(clickhouse_front)
    sent = {0: orders(range(0, 50)), 1: orders(range(50, 120))}
    prepared: dict[int, Any] = {}

    def task(partition: int) -> None:
        prepared[partition] = _prepared(target, partition, sent[partition])
        target.close()  # this thread's client

    tasks = [threading.Thread(target=task, args=(p,)) for p in sent]
    for thread in tasks:
        thread.start()
    for thread in tasks:
        thread.join()
    assert sorted(prepared) == [0, 1] and len(target.staging_tables()) == 2
    for committable in prepared.values():
        assert target.commit(committable) is CommitOutcome.COMMITTED
    rows = target.client().query(f"SELECT id, name FROM {DB}.{TABLE} ORDER BY id").result_rows
    assert rows == [(i, f"n{i}") for i in range(120)] and target.staging_tables() == []
    assert target.commit(prepared[0]) is CommitOutcome.COMMITTED  # a repeat is idempotent
    target.close()


def test_drop_after_apply_then_a_repeated_commit_is_exactly_once(clickhouse_front: ClickHouseFront) -> None:
    target = _target(clickhouse_front)
    target.connection.retries = 0  # the commit would repeat itself: here the caller repeats it
    committable = _prepared(target, 0, orders(range(0, 20)))
    clickhouse_front.faults.drop_after_apply.arm("MOVE PARTITION")
    with pytest.raises(ClickHouseError, match="Connection aborted"):  # the transport error, as the sink's own
        target.commit(committable)
    assert clickhouse_front.faults.drop_after_apply.fired == 1
    assert target.count_rows(TABLE) > 0  # the first partition moved, its answer was lost
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.count_rows(TABLE) == 20
    target.close()


def test_fail_before_executes_nothing(clickhouse_front: ClickHouseFront) -> None:
    client = http_client(clickhouse_front)
    client.command("CREATE TABLE default.f (id Int64, name String) ENGINE = MergeTree ORDER BY id")
    clickhouse_front.faults.fail_before.arm(r"INSERT INTO .*`f`", status=503)
    with pytest.raises(OperationalError, match=r"code: 439.*CANNOT_SCHEDULE_TASK"):
        client.insert_arrow("f", orders(range(5)), database="default")
    assert clickhouse_front.faults.fail_before.fired == 1
    assert client.query("SELECT count() FROM default.f").result_rows == [(0,)]


def test_drop_before_is_retried_by_the_client_for_reads_only(clickhouse_front: ClickHouseFront) -> None:
    client = http_client(clickhouse_front)
    clickhouse_front.faults.drop_before.arm(r"SELECT 42")
    assert client.query("SELECT 42").result_rows == [(42,)]  # clickhouse-connect resends a read after a remote close
    clickhouse_front.faults.drop_before.arm(r"CREATE TABLE")
    with pytest.raises(OperationalError):
        client.command("CREATE TABLE default.d (a UInt8) ENGINE = Memory")  # a write is not resent
    assert clickhouse_front.faults.drop_before.fired == 2
    assert client.command("EXISTS TABLE default.d") == 0


def test_delay_makes_the_client_time_out_after_the_statement_applied(clickhouse_front: ClickHouseFront) -> None:
    client = http_client(clickhouse_front, send_receive_timeout=1)
    client.command("CREATE TABLE default.slow (a UInt8) ENGINE = MergeTree ORDER BY a")
    clickhouse_front.faults.delay.arm(r"INSERT INTO default\.slow", seconds=60)
    with pytest.raises(OperationalError, match="(?i)timed out"):
        client.command("INSERT INTO default.slow VALUES (1)")
    clickhouse_front.faults.release()
    assert http_client(clickhouse_front).query("SELECT count() FROM default.slow").result_rows == [(1,)]
    faults = clickhouse_front.faults
    assert faults.delay.fired == 1
    faults.drop_before.arm("never")
    faults.reset()
    assert [(f.fired, f.armed) for f in faults] == [(0, False)] * len(faults.KNOBS)


def test_the_fixture_data_lives_under_tmp_path(clickhouse_front: ClickHouseFront, tmp_path: Path) -> None:
    assert Path(clickhouse_front.path).is_relative_to(tmp_path) and clickhouse_front.port > 0
