"""A whole database from a pattern (issue 26, item 3): topics matched by kafka.topic_pattern, each routed by
routing.topic_table to the table its name gives, the columns read from the target's own table; a topic with no
table, or one the regex does not match, goes to the dead letters with the reason while the others load exactly,
through a kill and a restart; a topic created while the job runs is a dead letter saying so, until a restart."""
from __future__ import annotations

import datetime as dt
import json
import signal
from pathlib import Path

import pytest

from streaming_sink.config import resolve_config
from streaming_sink.frame import ROUTE_COLUMN, build_frame, table_slots
from streaming_sink.records import BatchState
from streaming_sink.routing import Router
from streaming_sink.state import open_store
from streaming_sink.target_tables import JobTables
from tests.support.jobs import ConfigJob, job_toml, local_spark
from tests.support.pipeline import open_target, row_checksum

pytestmark = pytest.mark.slow

JOB = "demo-ingest"  # ConfigJob's job id, whose process handling and state reading this test borrows
DEAD = "dead_letters"
#: the tables that exist in the target before the job starts; the job takes their columns from there
TARGET_TABLES = {
    "orders": "id Int64, name Nullable(String), amount Nullable(Float64), kafka_partition Int32, kafka_offset Int64",
    "customers": "id Int64, email String, born Nullable(Date32), kafka_partition Int32, kafka_offset Int64",
    "late": "id Int64, kafka_partition Int32, kafka_offset Int64",
}
COLUMNS = {"orders": "id, name, amount, kafka_partition, kafka_offset",
           "customers": "id, email, born, kafka_partition, kafka_offset",
           "payments": "id, cents, kafka_offset", "late": "id, kafka_partition, kafka_offset",
           DEAD: "raw_value, topic, partition, offset, reason"}
NO_TABLE = ("the target database 'default' has no such table the job can load (create it, or list it under [tables] "
            "with a schema on a target that creates tables)")


def _topics(prefix: str) -> dict[str, str]:
    return {name: f"{prefix}.public.{name}" for name in ("orders", "customers", "payments", "refunds", "late")}


def _config(job: ConfigJob, prefix: str, **overrides: object) -> str:
    return job_toml(
        job_id=JOB, data_dir="data",
        kafka={"bootstrap_servers": job.bootstrap, "topic_pattern": rf"^{prefix}\..+$", "max_offsets_per_trigger": 150},
        routing={"topic_table": rf"^{prefix}\.public\.(.+)$"},
        tables={"payments": {"schema": "id BIGINT NOT NULL, amount DOUBLE",
                             "select": "id, CAST(amount * 100 AS BIGINT) AS cents, kafka_offset"}},
        dead_letters={"table": DEAD}, spark=local_spark(), **overrides,
    )


def _produce(broker, topic: str, messages: list[tuple[int, str]]) -> None:
    for partition in (0, 1):
        broker.produce(topic, [raw for p, raw in messages if p == partition], partition=partition)


def _expected(topic: str, count: int, row, expected: dict[str, list[tuple]], table: str | None,
              bad: tuple[str, str] | None = None) -> list[tuple[int, str]]:
    """`count` messages per partition of `topic`; every 9th is `bad` (raw, reason) when given. Returns (partition, raw)."""
    messages = []
    for partition in (0, 1):
        for offset in range(count):
            ident = partition * 1_000_000 + offset
            if bad is not None and offset % 9 == 8:
                raw, reason = bad
                expected[DEAD].append((raw, topic, partition, offset, reason))
            else:
                body, values = row(ident)
                raw = json.dumps(body)
                if table is None:
                    expected[DEAD].append((raw, topic, partition, offset, values))
                else:
                    expected[table].append((*values, *((partition, offset) if table != "payments" else (offset,))))
            messages.append((partition, raw))
    return messages


def _verify(job: ConfigJob, expected: dict[str, list[tuple]]) -> None:
    for table, want in expected.items():
        got = sorted(job.read_embedded(table, COLUMNS[table]))
        assert len(got) == len(want), f"{table}: {len(got)} rows, source says {len(want)}"
        assert row_checksum(got) == row_checksum(sorted(want)) and got == sorted(want), f"{table}: rows differ"
    store = open_store(job.state_url)
    for key in store.batch_keys(JOB):
        record = store.get_batch(JOB, *key)
        assert record is not None and record.state is BatchState.COMMITTED, f"batch {key}: {record}"
        assert record.records_in == sum(c.rows for c in record.live_committables()), f"batch {key} does not reconcile"


def test_a_whole_database_by_pattern_through_a_kill(tmp_path, kafka_broker):
    prefix = f"wd{tmp_path.name[-6:].replace('_', '')}"
    topics = _topics(prefix)
    job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, topics["orders"])
    job.config_path.write_text(_config(job, prefix))
    with open_target(job.data_dir / "clickhouse", "default") as target:
        for table in ("orders", "customers"):
            target.client().command(f"CREATE TABLE default.{table} ({TARGET_TABLES[table]}) ENGINE = MergeTree ORDER BY id")
    expected: dict[str, list[tuple]] = {"orders": [], "customers": [], "payments": [], "late": [], DEAD: []}
    born = dt.date(1990, 1, 1)
    plan = {
        "orders": (lambda i: ({"id": i, "name": f"n{i}", "amount": i / 8}, (i, f"n{i}", i / 8)), "orders",
                   ('{"id": "seven"}', "not valid JSON for the schema of orders: field 'id' holds seven, which does not "
                                      "parse as BIGINT (column type Int64)")),
        "customers": (lambda i: ({"id": i, "email": f"c{i}@x", "born": "1990-01-01"}, (i, f"c{i}@x", born)), "customers",
                      ('{"id": 5, "born": null}', "required field 'email' of customers is missing or null")),
        "payments": (lambda i: ({"id": i, "amount": i / 4}, (i, int(i * 25))), "payments", None),
        "refunds": (lambda i: ({"id": i}, f"topic {topics['refunds']} maps to table refunds: {NO_TABLE}"), None, None),
    }
    for name, (row, table, bad) in plan.items():
        kafka_broker.create_topic(topics[name], 2)
        _produce(kafka_broker, topics[name], _expected(topics[name], 120, row, expected, table, bad))
    audit = f"{prefix}.audit.log"  # matched by the pattern, not by routing.topic_table
    kafka_broker.create_topic(audit, 1)
    kafka_broker.produce(audit, ['{"id": 1}'], partition=0)
    expected[DEAD].append(('{"id": 1}', audit, 0, 0,
                           f"topic {audit} does not match routing.topic_table '^{prefix}\\.public\\.(.+)$'"))

    assert job.run(0, crash_at="after-prepared-record@2") == -signal.SIGKILL, job.log_tail(0)
    record, done = job.batch(2)
    assert record.state.value == "PREPARED" and not done

    # a topic and its table created while the job is down: the restart resolves it
    with open_target(job.data_dir / "clickhouse", "default") as target:
        target.client().command(f"CREATE TABLE default.late ({TARGET_TABLES['late']}) ENGINE = MergeTree ORDER BY id")
    kafka_broker.create_topic(topics["late"], 2)
    _produce(kafka_broker, topics["late"], _expected(topics["late"], 30, lambda i: ({"id": i}, (i,)), expected, "late"))

    assert job.run(1) == 0, job.log_tail(1)
    _verify(job, expected)
    assert "table refunds: its topics' messages go to the dead letters" in (job.logs / "driver-1.log").read_text()


def test_a_topic_created_while_the_job_runs_is_a_dead_letter_saying_so(tmp_path, spark_session):
    """Tables are resolved when the job starts; Spark reads a topic the pattern matches later, and each of its
    messages becomes a dead letter naming the topic, its table and what to do (the frame, as the job builds it)."""
    spec = resolve_config({
        "job_id": "wd", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"}, "dead_letters": {"table": DEAD},
        "sink": {"metadata_columns": False}}, Path(tmp_path))
    records = spark_session.createDataFrame(
        [(None, b'{"id": 1}', topic, 0, 7, dt.datetime(2026, 1, 1), 0)
         for topic in ("pg.public.orders", "pg.public.later", "pg.public.refunds")],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestampType INT")
    resolved = JobTables({"orders": "id BIGINT NOT NULL"}, {"refunds": NO_TABLE})
    frame = build_frame(records, spec, resolved.tables, None, resolved.unavailable)
    rows = _rows_by_table(frame, spec, resolved.tables)
    assert rows["orders"] == [{"id": 1}]
    assert {row["topic"]: row["reason"] for row in rows[DEAD]} == {
        "pg.public.later": "topic pg.public.later maps to table later: it was not among the tables of the topics "
                           "read when the job started (a topic created since): restart the job to load it",
        "pg.public.refunds": f"topic pg.public.refunds maps to table refunds: {NO_TABLE}",
    }


def _rows_by_table(frame, spec, tables: dict[str, str]) -> dict[str, list[dict]]:
    """The frame's rows as the sink's writers take them: split by the Router, each table under its own columns."""
    router = Router(None, table_column=ROUTE_COLUMN, table_slots=table_slots(spec, tables))
    rows: dict[str, list[dict]] = {}
    for batch in frame.toArrow().to_batches():
        for table, part in router.split(batch):
            rows.setdefault(table, []).extend(part.to_pylist())
    return rows


@pytest.mark.extended  # a 300-table frame takes minutes to plan here; CI builds one of 60 tables (the width test below)
def test_three_hundred_tables_make_a_frame_that_routes_each_message(tmp_path, spark_session):
    """A whole database is hundreds of tables: the frame must still build (a CASE nested once per table overflowed
    Spark's stack at 300) and put each message in its own table only."""
    spec = resolve_config({
        "job_id": "wd", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"}, "dead_letters": {"table": DEAD}}, Path(tmp_path))
    tables = {f"t{n:03d}": "id BIGINT NOT NULL, name STRING" for n in range(300)}
    records = spark_session.createDataFrame(
        [(None, json.dumps({"id": n, "name": f"n{n}"}).encode(), f"pg.public.t{n:03d}", 0, n, dt.datetime(2026, 1, 1), 0)
         for n in range(0, 300, 7)],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestampType INT")
    frame = build_frame(records, spec, tables)
    rows = _rows_by_table(frame, spec, tables)
    assert {table: [(row["id"], row["name"]) for row in part] for table, part in rows.items()} == {
        f"t{n:03d}": [(n, f"n{n}")] for n in range(0, 300, 7)}


def test_doctor_resolves_the_tables_as_run_does(tmp_path, kafka_broker):
    """For a whole-database job, `doctor` finds the same tables `run` would (from the topics the pattern matches now
    and the target's tables) and names the topics whose messages would go to the dead letters, and why."""
    import subprocess
    import sys

    from tests.support.jobs import write_job_toml

    prefix = f"doc{tmp_path.name[-6:].replace('_', '')}"
    topics = _topics(prefix)
    for name in ("orders", "refunds"):
        kafka_broker.create_topic(topics[name], 1)
    with open_target(tmp_path / "ch", "shop") as target:
        client = target.client()
        client.command("CREATE DATABASE shop")
        client.command(f"CREATE TABLE shop.orders ({TARGET_TABLES['orders']}) ENGINE = MergeTree ORDER BY id")
        client.command("CREATE TABLE shop.dead_letters (raw_value Nullable(String), topic Nullable(String), partition "
                       "Nullable(Int32), offset Nullable(Int64), kafka_timestamp Nullable(DateTime64(6, 'UTC')), "
                       "reason Nullable(String)) ENGINE = MergeTree ORDER BY tuple()")
    config = write_job_toml(
        tmp_path, job_id="doc", tables=None, routing={"topic_table": rf"^{prefix}\.public\.(.+)$"},
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "topic_pattern": rf"^{prefix}\..+$"},
        dead_letters={"table": DEAD}, target={"url": f"chdb://{tmp_path / 'ch'}", "database": "shop"},
        state={"url": f"file://{tmp_path / 'state'}"})
    proc = subprocess.run([sys.executable, "-m", "streaming_sink.cli", "doctor", "--config", str(config),
                           "--outage-tolerance", "6 hours", "--json"], capture_output=True, text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert proc.returncode == 0, checks
    assert checks["tables"]["verdict"] == "OK"
    assert checks["tables"]["detail"] == (
        f"tables ['{DEAD}', 'orders'] exist with every column the job writes; table refunds: its topics' messages go "
        f"to the dead letters: {NO_TABLE.replace('default', 'shop')}")
    assert f"pattern matches 2 topic(s) now ['{topics['orders']}', '{topics['refunds']}']" in checks["kafka"]["detail"]


def _wide_database(tmp_path: Path, spark_session, count: int):
    """`count` tables of a few shapes (the widest: id, name, amount, born, note), a message to every seventh, and a
    frame over them: what the packaged job ships to its writers."""
    spec = resolve_config({
        "job_id": "wd", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"^pg\..+$"},
        "routing": {"topic_table": r"^pg\.public\.(.+)$"}, "dead_letters": {"table": DEAD}}, Path(tmp_path))
    shapes = ["id BIGINT NOT NULL, name STRING", "id BIGINT NOT NULL, amount DOUBLE, born DATE",
              "id BIGINT NOT NULL, name STRING, amount DOUBLE, born DATE, note STRING"]
    tables = {f"t{n:03d}": shapes[n % len(shapes)] for n in range(count)}
    messages = [(None, json.dumps({"id": n, "name": f"n{n}", "amount": n / 2, "born": "2026-01-02", "note": "x"}
                                  if n % 3 == 2 else {"id": n, "name": f"n{n}"} if n % 3 == 0 else
                                  {"id": n, "amount": n / 2, "born": "2026-01-02"}).encode(),
                 f"pg.public.t{n:03d}", 0, n, dt.datetime(2026, 1, 1), 0) for n in range(0, count, 7)]
    messages.append((None, b"not json", "pg.public.t000", 0, 10_000, dt.datetime(2026, 1, 1), 0))
    records = spark_session.createDataFrame(
        messages, "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestampType INT")
    return spec, tables, build_frame(records, spec, tables)


MANY = 60


def test_the_frame_is_as_wide_as_its_widest_table_not_as_all_its_tables(tmp_path, spark_session):
    """Every row shipped to the writers as Arrow used to carry every table's columns (a struct per table, null but
    allocated): 300 tables cost ~12 KB a message. The frame's width must follow the widest table, whatever the count
    (60 tables here: a frame of a struct per table would have 62 columns; a 300-table frame takes minutes to plan on CI's
    two cores, and test_three_hundred_tables_make_a_frame_that_routes_each_message builds one in the extended suite)."""
    widths = {}
    for count in (3, MANY):
        _, _, frame = _wide_database(tmp_path, spark_session, count)
        arrow = frame.toArrow()
        widths[count] = (len(frame.columns), arrow.nbytes / arrow.num_rows)
    (columns_few, bytes_few), (columns_many, bytes_many) = widths[3], widths[MANY]
    # the route, the widest table's 5 columns and the dead letters' 6 share slots by type: at most 1 + 5 + 6 columns
    assert columns_many == columns_few <= 12, widths
    # Arrow bytes per message: those of the few-table frame, give or take the route names' length and buffer padding
    assert bytes_many < 2 * bytes_few, widths


def test_each_table_takes_its_own_columns_back_from_the_shared_slots(tmp_path, spark_session):
    """Tables of different shapes share the slots of each type: every table gets back its own columns, names, types
    and values, and a message no table can parse is a dead letter."""
    spec, tables, frame = _wide_database(tmp_path, spark_session, 30)
    rows = _rows_by_table(frame, spec, tables)
    born = dt.date(2026, 1, 2)
    expected = {f"t{n:03d}": [{"id": n, "name": f"n{n}", "amount": n / 2, "born": born, "note": "x"} if n % 3 == 2
                              else {"id": n, "name": f"n{n}"} if n % 3 == 0 else {"id": n, "amount": n / 2, "born": born}]
                for n in range(0, 30, 7)}
    meta = {"kafka_partition": 0}
    assert {table: [{k: v for k, v in row.items() if not k.startswith("kafka_")} for row in part]
            for table, part in rows.items() if table != DEAD} == expected
    assert all(row.items() >= meta.items() for table, part in rows.items() if table != DEAD for row in part)
    [dead] = rows[DEAD]
    assert (dead["raw_value"], dead["offset"], dead["reason"]) == ("not json", 10_000, "not valid JSON for the schema of t000")
