"""Change rows (upserts and deletes, streaming_sink/changes.py) into ClickHouse ReplacingMergeTree tables, exactly once.

Through `ExactlyOnceSink` on the local Spark, embedded (chdb: writers in the driver) and over HTTP (the test front:
writers in Spark tasks). A driver kill is a `Crash` raised at a named protocol point (streaming_sink/crash.py's
points, reached in this process); the restart is a new sink on the same journal that takes the batch again, as Spark
re-runs it. Each batch holds one change per key (the sink's own dedupe, which `change_key` asks for, keeps them all).
The tables' merges are stopped, so besides `SELECT … FINAL` (the source's current rows, deleted excluded) the raw rows
are compared too: every change loaded exactly once, which FINAL alone could not show (it folds a duplicate away).
"""
from __future__ import annotations

import pyarrow as pa
import pytest

from streaming_sink import ExactlyOnceSink, batch_log, committer, sink
from streaming_sink.changes import DELETE, OP_COLUMN, UPSERT, VERSION_COLUMN
from streaming_sink.state import FileStateStore
from streaming_sink.targets.base import ConfigurationError
from streaming_sink.targets.clickhouse import ClickHouseTarget
from streaming_sink.targets.clickhouse.change_tables import CREATED_DELETED_COLUMN, CREATED_VERSION_COLUMN
from streaming_sink.targets.encoding import EncodingError

pytestmark = pytest.mark.slow

DB = "analytics"
QUERY = "q"
TABLES = ("accounts", "customers")
KEYS = 24
BATCHES = 5
SPARK_SCHEMA = "id BIGINT, name STRING, amount DOUBLE, __op INT, __version BIGINT, __table STRING"
ROW_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
                        (OP_COLUMN, pa.int32()), (VERSION_COLUMN, pa.int64())])


class Crash(BaseException):
    """The driver dies here (a BaseException: nothing in the sink catches it, as nothing outlives a SIGKILL)."""


def changes(batch: int) -> list[tuple]:
    """Batch `batch` of the source: per key at most one change (none, upsert or delete), so across batches keys are
    inserted, updated, deleted and inserted again; versions grow with the batch."""
    rows = []
    for key in range(KEYS):
        action = (key + batch) % 5
        table = TABLES[key % 2]
        version = batch * 1000 + key
        if action == 0:
            continue
        if action == 3:
            rows.append((key, None, None, DELETE, version, table))
        else:
            rows.append((key, f"k{key}b{batch}", key * 1.5 + batch, UPSERT, version, table))
    return rows


def current(batches: range) -> dict[str, list[tuple]]:
    """The source's rows after `batches`, per table: (id, name, amount), deleted keys left out."""
    state: dict[int, tuple] = {}
    for batch in batches:
        for key, name, amount, op, _, _ in changes(batch):
            if op == DELETE:
                state.pop(key, None)
            else:
                state[key] = (key, name, amount)
    return {table: sorted(row for key, row in state.items() if TABLES[key % 2] == table) for table in TABLES}


def loaded(batches: range) -> dict[str, list[tuple]]:
    """Every change of `batches`, once, as the table stores it: (id, name, amount, version, is_deleted)."""
    rows: dict[str, list[tuple]] = {table: [] for table in TABLES}
    for batch in batches:
        for key, name, amount, op, version, table in changes(batch):
            rows[table].append((key, name, amount, version, op))
    return {table: sorted(found, key=repr) for table, found in rows.items()}


def final_rows(target: ClickHouseTarget, table: str) -> list[tuple]:
    result = target.client().query(f"SELECT id, name, amount FROM {DB}.{table} FINAL ORDER BY id")
    return [tuple(r) for r in result.result_rows]


def raw_rows(target: ClickHouseTarget, table: str) -> list[tuple]:
    result = target.client().query(
        f"SELECT id, name, amount, {CREATED_VERSION_COLUMN}, {CREATED_DELETED_COLUMN} FROM {DB}.{table}")
    return sorted((tuple(r) for r in result.result_rows), key=repr)


_OPENED: list[ClickHouseTarget] = []


@pytest.fixture(autouse=True)
def close_targets():
    """Every target a test opened is closed after it (a process opens one chdb path at a time)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def make_target(url: str, mode: str = "move") -> ClickHouseTarget:
    target = ClickHouseTarget(url, database=DB, commit_mode=mode)
    _OPENED.append(target)
    return target


def create_change_tables(url: str, mode: str = "move") -> None:
    target = make_target(url, mode)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for table in TABLES:
        target.create_table(table, ROW_SCHEMA, key=("id",))
        target.client().command(f"SYSTEM STOP MERGES {DB}.{table}")  # raw rows stay one per change loaded


def make_sink(target: ClickHouseTarget, tmp_path) -> ExactlyOnceSink:
    return ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="cdc",
                           table_column="__table", heartbeat_seconds=None, change_key=("id",))


def frame(spark, batch: int):
    return spark.createDataFrame(changes(batch), SPARK_SCHEMA).repartition(2)


def crash_at(monkeypatch, point: str, batch: int) -> None:
    """The driver dies at protocol point `point` of batch `batch` (streaming_sink/crash.py names the points)."""
    def crash_point(name: str, batch_id: int) -> None:
        if name == point and batch_id == batch:
            raise Crash(f"{point}@{batch}")

    for module in (sink, batch_log, committer):
        monkeypatch.setattr(module, "crash_point", crash_point)


def assert_exact(target: ClickHouseTarget, batches: range) -> None:
    assert target.staging_tables() == []
    for table in TABLES:
        assert final_rows(target, table) == current(batches)[table], table
        assert raw_rows(target, table) == loaded(batches)[table], table


@pytest.mark.parametrize("point", ["after-writers-prepared", "after-prepared-record", "after-first-commit",
                                   "after-committed-record"])
def test_changes_killed_at_a_protocol_point_and_restarted_end_exact(spark, clickhouse_url, tmp_path, monkeypatch, point):
    """Inserts, updates, deletes and re-inserts over five batches, the driver killed at `point` of batch 2 and
    restarted: FINAL is the source's current rows, and every change is in the table exactly once."""
    create_change_tables(clickhouse_url)
    crash_at(monkeypatch, point, 2)
    first = make_sink(make_target(clickhouse_url), tmp_path)
    for batch in range(2):
        first.process(frame(spark, batch), batch, QUERY)
    with pytest.raises(Crash):
        first.process(frame(spark, 2), 2, QUERY)
    monkeypatch.undo()
    target = make_target(clickhouse_url)
    restarted = make_sink(target, tmp_path)
    for batch in range(2, BATCHES):  # Spark re-runs the batch it has no commit for, then goes on
        restarted.process(frame(spark, batch), batch, QUERY)
    assert_exact(target, range(BATCHES))


@pytest.mark.parametrize("point", ["after-prepared-record", "clickhouse-after-insert"])
def test_changes_in_insert_mode_killed_and_restarted_end_exact(spark, tmp_path, monkeypatch, point):
    """commit_mode "insert" (INSERT … SELECT, deduplicated by token): the same, the kill also between the INSERTs and
    the ledger's `committed` row (the repeated INSERT is dropped by the table's deduplication window)."""
    url = f"chdb://{tmp_path / 'ch'}"
    create_change_tables(url, "insert")
    first = make_sink(make_target(url, "insert"), tmp_path)
    for batch in range(2):
        first.process(frame(spark, batch), batch, QUERY)
    if point == "clickhouse-after-insert":
        from streaming_sink.targets.clickhouse import target as clickhouse_target

        def crash_point(name: str, batch_id: int) -> None:
            if name == point:
                raise Crash(point)

        monkeypatch.setattr(clickhouse_target, "crash_point", crash_point)
    else:
        crash_at(monkeypatch, point, 2)
    with pytest.raises(Crash):
        first.process(frame(spark, 2), 2, QUERY)
    monkeypatch.undo()
    target = make_target(url, "insert")
    restarted = make_sink(target, tmp_path)
    for batch in range(2, BATCHES):
        restarted.process(frame(spark, batch), batch, QUERY)
    assert_exact(target, range(BATCHES))


def test_a_replay_of_older_changes_never_brings_a_lower_version_back(spark, clickhouse_url, tmp_path):
    """A new checkpoint that reads the source again from its start (the at-least-once replay a reset causes) loads
    batches 0-2 again after batch 4: every key keeps its newest change; a deleted key stays deleted."""
    create_change_tables(clickhouse_url)
    target = make_target(clickhouse_url)
    driver = make_sink(target, tmp_path)
    for batch in range(BATCHES):
        driver.process(frame(spark, batch), batch, QUERY)
    for batch in range(3):
        driver.process(frame(spark, batch), batch, "q-reset")
    for table in TABLES:
        assert final_rows(target, table) == current(range(BATCHES))[table]
    # and where a delete is the newest change, an older upsert loaded after it stays hidden
    deleted = [key for key, _, _, op, _, _ in changes(BATCHES - 1) if op == DELETE]
    assert deleted and not any(row[0] in deleted for table in TABLES for row in final_rows(target, table))


def test_a_delete_lands_its_nulls_as_defaults_and_an_upsert_with_a_null_is_refused(spark, clickhouse_url, tmp_path):
    """A user's ReplacingMergeTree whose non-key columns are not Nullable: a delete (key only, NULLs elsewhere) is
    loaded, its NULLs as the columns' defaults, and FINAL leaves the key out; an upsert with a NULL there is refused."""
    target = make_target(clickhouse_url)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    client.command(f"CREATE TABLE {DB}.people (id Int64, name String, amount Float64, ver UInt64, gone UInt8) "
                   "ENGINE = ReplacingMergeTree(ver, gone) ORDER BY id")
    driver = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="cdc", table="people",
                             heartbeat_seconds=None, change_key=("id",))
    schema = "id BIGINT, name STRING, amount DOUBLE, __op INT, __version BIGINT"
    driver.process(spark.createDataFrame([(1, "a", 1.0, UPSERT, 1), (2, "b", 2.0, UPSERT, 1)], schema), 0, QUERY)
    driver.process(spark.createDataFrame([(1, None, None, DELETE, 2)], schema), 1, QUERY)
    assert [tuple(r) for r in client.query(f"SELECT id, name, amount FROM {DB}.people FINAL").result_rows] == [(2, "b", 2.0)]
    assert (1, "", 0.0, 2, 1) in [tuple(r) for r in client.query(f"SELECT * FROM {DB}.people").result_rows]
    with pytest.raises(EncodingError, match="'name' of analytics.people has NULLs"):
        driver.process(spark.createDataFrame([(3, None, 3.0, UPSERT, 3)], schema), 2, QUERY)


@pytest.mark.parametrize("engine, refused", [
    ("MergeTree ORDER BY id", "not a ReplacingMergeTree with a version and an is-deleted column"),
    ("ReplacingMergeTree(ver) ORDER BY id", "not a ReplacingMergeTree with a version and an is-deleted column"),
    ("ReplacingMergeTree(ver, gone) PARTITION BY name ORDER BY id", r"its PARTITION BY reads \['name'\]"),
    ("ReplacingMergeTree(ver, gone) ORDER BY (id, name)", r"its key column\(s\) \['name'\] are not among"),
])
def test_change_rows_into_a_table_that_cannot_take_them_are_refused_before_data_moves(clickhouse_url, engine, refused):
    target = make_target(clickhouse_url)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    name_column = "name String" if "name" in engine else "label String"
    target.client().command(f"CREATE TABLE {DB}.t (id Int64, {name_column}, ver UInt64, gone UInt8) ENGINE = {engine}")
    schema = pa.schema([("id", pa.int64()), ("label", pa.string()), (OP_COLUMN, pa.int32()), (VERSION_COLUMN, pa.int64())])
    target.routable_tables()
    with pytest.raises(ConfigurationError, match=refused) as refusal:
        target.check_schema("t", schema)
    assert "\n" not in str(refusal.value) and "ReplacingMergeTree(__version, __is_deleted)" in str(refusal.value)
    target.check_schema("t", pa.schema([("id", pa.int64()), ("label", pa.string())]))  # appended rows: as before


def test_created_change_tables_are_replacing_merge_trees_ordered_by_their_key(clickhouse_url):
    create_change_tables(clickhouse_url)
    target = make_target(clickhouse_url)
    target.create_table("plain", pa.schema([("id", pa.int64())]))
    engine_full, comment = target.client().query(
        f"SELECT engine_full, comment FROM system.tables WHERE database = '{DB}' AND name = 'accounts'").result_rows[0]
    assert engine_full.startswith("ReplacingMergeTree(__version, __is_deleted) ORDER BY (id)")
    assert "PARTITION BY" not in engine_full and comment.startswith("created by streaming-sink")
    assert target.table_columns("accounts") == {"id": "Int64", "name": "Nullable(String)", "amount": "Nullable(Float64)",
                                                "__version": "UInt64", "__is_deleted": "UInt8"}
    assert target.table_key("accounts") == ("id",) and target.table_key("plain") is None
    target.check_schema("accounts", ROW_SCHEMA)
    with pytest.raises(ConfigurationError, match="needs its key"):
        target.create_table("keyless", ROW_SCHEMA)
    with pytest.raises(ConfigurationError, match=r"\['__is_deleted'\], which the sink's ReplacingMergeTree keeps"):
        target.create_table("clash", ROW_SCHEMA.append(pa.field("__is_deleted", pa.int8())), key=("id",))


def test_a_replacing_table_of_appended_rows_takes_two_rows_of_one_key_in_one_batch(spark, clickhouse_url, tmp_path):
    """Appended rows into a user's ReplacingMergeTree: two rows of one key in one writer's insert are both staged
    (no folding at insert, so prepare counts what was written) and the table's merge keeps the newer."""
    target = make_target(clickhouse_url)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    target.client().command(f"CREATE TABLE {DB}.latest (id Int64, ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY id")
    driver = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="app", table="latest",
                             heartbeat_seconds=None)
    driver.process(spark.createDataFrame([(1, 1), (1, 2), (2, 1)], "id BIGINT, ver BIGINT").coalesce(1), 0, QUERY)
    assert [tuple(r) for r in target.client().query(f"SELECT id, ver FROM {DB}.latest FINAL ORDER BY id").result_rows] \
        == [(1, 2), (2, 1)]


# -- columns added upstream -------------------------------------------------------------------------------------------

EMAIL = pa.field("email", pa.string())
WIDER_SPARK_SCHEMA = SPARK_SCHEMA + ", email STRING"


def wider_frame(spark, batch: int):
    rows = [(*row[:5], None if row[3] == DELETE else f"{row[0]}@b{batch}", row[5]) for row in changes(batch)]
    return spark.createDataFrame(rows, "id BIGINT, name STRING, amount DOUBLE, __op INT, __version BIGINT, email STRING, "
                                       "__table STRING").repartition(2)


def emails(target: ClickHouseTarget, table: str) -> list[tuple]:
    return [tuple(r) for r in target.client().query(f"SELECT id, email FROM {DB}.{table} FINAL ORDER BY id").result_rows]


def expected_emails(table: str, last_batch: int, with_email: set[int]) -> list[tuple]:
    """(id, email) after batches 0..last_batch, email set by the batches in `with_email`."""
    state: dict[int, str | None] = {}
    for batch in range(last_batch + 1):
        for key, _, _, op, _, row_table in changes(batch):
            if row_table != table:
                continue
            if op == DELETE:
                state.pop(key, None)
            else:
                state[key] = f"{key}@b{batch}" if batch in with_email else None
    return sorted(state.items())


@pytest.mark.parametrize("point", [None, "after-prepared-record", "after-first-commit"])
def test_a_column_added_before_the_batch_that_carries_it_is_loaded_exactly(spark, clickhouse_url, tmp_path, monkeypatch,
                                                                           point):
    """The driver adds `email` to the job's tables before batch 2, whose rows carry it; killed between the ALTER and
    the commit (at `point`) and restarted (which adds the column again: a no-op), the tables end exact."""
    create_change_tables(clickhouse_url)
    first = make_sink(make_target(clickhouse_url), tmp_path)
    for batch in range(2):
        first.process(frame(spark, batch), batch, QUERY)
    for table in TABLES:
        first.target.add_columns(table, [EMAIL])
    if point:
        crash_at(monkeypatch, point, 2)
        with pytest.raises(Crash):
            first.process(wider_frame(spark, 2), 2, QUERY)
        monkeypatch.undo()
        target = make_target(clickhouse_url)
        for table in TABLES:
            target.add_columns(table, [EMAIL])
        driver = make_sink(target, tmp_path)
    else:
        target, driver = first.target, first
    for batch in range(2, BATCHES):
        driver.process(wider_frame(spark, batch), batch, QUERY)
    assert_exact(target, range(BATCHES))
    for table in TABLES:
        assert emails(target, table) == expected_emails(table, BATCHES - 1, set(range(2, BATCHES)))


def test_a_column_added_while_a_batch_is_prepared_reaches_its_staging_table_at_commit(spark, clickhouse_url, tmp_path,
                                                                                        monkeypatch):
    """Batch 2 (without the column) is prepared when the driver dies; the next driver adds the column before it rolls
    batch 2 forward: its staging tables, made before the ALTER, get the column at commit, and every row lands once."""
    create_change_tables(clickhouse_url)
    first = make_sink(make_target(clickhouse_url), tmp_path)
    for batch in range(2):
        first.process(frame(spark, batch), batch, QUERY)
    crash_at(monkeypatch, "after-prepared-record", 2)
    with pytest.raises(Crash):
        first.process(frame(spark, 2), 2, QUERY)
    monkeypatch.undo()
    target = make_target(clickhouse_url)
    for table in TABLES:
        target.add_columns(table, [EMAIL])
    driver = make_sink(target, tmp_path)
    driver.process(frame(spark, 2), 2, QUERY)
    for batch in range(3, BATCHES):
        driver.process(wider_frame(spark, batch), batch, QUERY)
    assert_exact(target, range(BATCHES))
    for table in TABLES:
        assert emails(target, table) == expected_emails(table, BATCHES - 1, set(range(3, BATCHES)))


def test_columns_are_added_only_to_tables_the_job_created(clickhouse_url):
    target = make_target(clickhouse_url)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    target.client().command(f"CREATE TABLE {DB}.theirs (id Int64) ENGINE = MergeTree ORDER BY id")
    with pytest.raises(ConfigurationError, match=r"analytics`?\.`?theirs`? was not created by the job.*\['email'\]"):
        target.add_columns("theirs", [EMAIL])
    assert target.table_columns("theirs") == {"id": "Int64"}
    target.create_table("ours", pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    target.add_columns("ours", [EMAIL, pa.field("score", pa.float64(), nullable=False)])
    target.add_columns("ours", [EMAIL])
    assert target.table_columns("ours") == {"id": "Int64", "email": "Nullable(String)", "score": "Nullable(Float64)"}
