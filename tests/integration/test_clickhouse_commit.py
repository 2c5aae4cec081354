"""The ClickHouse commit is one idempotent, verifiable step, whatever interleaves with it (review R3, R6, R7, O4).

The real engine, one data path per test, reached both ways the target reaches ClickHouse (the
`clickhouse_url` fixture): embedded (chdb), and over HTTP through the test front (tests/support/doubles/clickhouse_front),
where every statement and answer crosses clickhouse-connect's HTTP client. Interleavings are injected by
wrapping the target's own helpers or the client's `command`, never by timing.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.labels import make_label
from streaming_sink.targets import target_from_url
from streaming_sink.targets.base import CommitAmbiguousError, CommitOutcome, ConfigurationError, TargetError
from streaming_sink.targets.clickhouse import INSERT_CRASH_POINT, LEDGER_TABLE, ClickHouseTarget
from streaming_sink.targets.clickhouse import target as clickhouse_module
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.tls import issue_certificates

DB, TABLE, ROWS = "analytics", "orders", 10
# Two partitions, so a commit moves twice and can be cut between the moves.
TABLE_DDL = f"CREATE TABLE {DB}.{{name}} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
LEGACY_LEDGER_DDL = (  # what versions before the in-progress row created
    f"CREATE TABLE {DB}.{LEDGER_TABLE} (label String, target_table String, rows UInt64, committed_at DateTime DEFAULT now()) "
    "ENGINE = MergeTree ORDER BY label TTL committed_at + INTERVAL 30 DAY"
)


class Crash(BaseException):
    """A kill -9 at the injection point: nothing after it runs."""


def make_target(url: str, legacy_ledger: bool = False) -> ClickHouseTarget:
    target = ClickHouseTarget(url, database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    client.command(TABLE_DDL.format(name=TABLE))
    if legacy_ledger:
        client.command(LEGACY_LEDGER_DDL)
    target.routable_tables()
    return target


@pytest.fixture
def target(clickhouse_url):
    target = make_target(clickhouse_url)
    yield target
    target.close()


def ref(job: str = "job", partition: int = 0, attempt: str = "e1w0t0") -> TxnRef:
    return TxnRef("clickhouse", DB, TABLE, make_label(job, "query-1", 7, TABLE, partition, attempt), partition, attempt)


def prepare(target: ClickHouseTarget, txn: TxnRef, rows: int = ROWS) -> Committable:
    """A staging table holding `rows` rows over both partitions, prepared by the target's own transaction."""
    transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    transaction.write(pa.table({"id": pa.array(range(rows), pa.int64()), "name": [f"n{i}" for i in range(rows)]}))
    [part] = transaction.prepare()
    return part.committable("checksum")


def visible(target: ClickHouseTarget) -> list[int]:
    return sorted(r[0] for r in target.client().query(f"SELECT id FROM {DB}.{TABLE}").result_rows)


def drop(target: ClickHouseTarget, table: str) -> None:
    target.client().command(f"DROP TABLE IF EXISTS {DB}.`{table}` SYNC")


def wrap_command(monkeypatch, target: ClickHouseTarget, after: Callable[[str], None]) -> list[str]:
    """Run `after(sql)` after each command the client runs; returns the list of commands run."""
    client = target.client()
    original = client.command
    seen: list[str] = []

    def command(sql: str, *args: Any, **kwargs: Any) -> Any:
        result = original(sql, *args, **kwargs)
        seen.append(sql)
        after(sql)
        return result

    monkeypatch.setattr(client, "command", command)
    return seen


def test_a_commit_moves_every_row_once_and_repeats_harmlessly(target):
    committable = prepare(target, ref())
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert visible(target) == list(range(ROWS)) and target.staging_tables() == []


def test_staging_dropped_right_after_the_existence_check_is_never_committed(target, monkeypatch):
    committable = prepare(target, ref())
    engine_of_staging = target._engine_of_staging  # the commit's existence check

    def there_then_dropped(table: str) -> str | None:
        answer = engine_of_staging(table)
        if answer and table == committable.label:
            drop(target, table)  # a fenced driver's abort, between the check and the listing
        return answer

    monkeypatch.setattr(target, "_engine_of_staging", there_then_dropped)
    assert target.commit(committable) is CommitOutcome.ABORTED  # nothing ever moved: replay is safe
    assert target.commit(committable) is CommitOutcome.ABORTED
    assert visible(target) == []


def test_listing_partitions_of_a_missing_staging_table_fails(target):
    with pytest.raises(TargetError, match="does not exist"):
        target.connection.partition_sizes(ref().label)


def test_staging_dropped_between_two_moves_is_ambiguous_never_lost(target, monkeypatch):
    committable = prepare(target, ref())
    moves: list[str] = []

    def drop_after_first_move(sql: str) -> None:
        if "MOVE PARTITION" in sql:
            moves.append(sql)
            if len(moves) == 1:
                drop(target, committable.label)

    wrap_command(monkeypatch, target, drop_after_first_move)
    with pytest.raises(CommitAmbiguousError, match="ClickHouse commit interrupted") as first:
        target.commit(committable)
    assert committable.label in str(first.value) and f"{ROWS} rows" in str(first.value)
    monkeypatch.undo()
    with pytest.raises(CommitAmbiguousError):  # a retry, too, must not call it LOST (a replay would duplicate)
        target.commit(committable)
    assert 0 < len(visible(target)) < ROWS and len(moves) == 1


# per partition a `moving` row and its move, then the final row and the drop of staging
STEPS = ["INSERT", "ALTER", "INSERT", "ALTER", "INSERT", "DROP"]


@pytest.mark.parametrize("step", range(len(STEPS)))
def test_commit_repeated_after_a_crash_at_every_step_lands_every_row_once(target, monkeypatch, step):
    txn = ref()
    committable = prepare(target, txn)

    def writes() -> list[str]:
        return [sql for sql in seen if not sql.startswith("EXISTS")]

    def crash_at_step(sql: str) -> None:
        if len(writes()) == step + 1 and not sql.startswith("EXISTS"):
            raise Crash(sql)

    seen = wrap_command(monkeypatch, target, crash_at_step)
    with pytest.raises(Crash):
        target.commit(committable)
    monkeypatch.undo()
    assert [sql.split()[0] for sql in writes()] == STEPS[: step + 1]
    with pytest.raises(TargetError, match=txn.label):  # an abort arriving now must not destroy a begun commit
        target.abort(txn)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert visible(target) == list(range(ROWS)) and target.staging_tables() == []


def test_a_move_commit_begun_by_an_older_version_is_finished_from_the_listing(target):
    """A label whose one `moving` row an older version wrote (no row per partition) may have moved some partitions:
    the staging table's listing (one server's, so exact) says which are left, as it did then."""
    committable = prepare(target, ref())
    target.ledger.write(committable, "moving")
    target.client().command(f"ALTER TABLE {DB}.`{committable.label}` MOVE PARTITION ID '0' TO TABLE {DB}.{TABLE}")
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert visible(target) == list(range(ROWS)) and target.staging_tables() == []


def test_abort_refuses_a_committed_label_and_ignores_one_never_begun(target):
    committed, begun, never = ref(partition=0), ref(partition=1), ref(partition=2)
    target.commit(prepare(target, committed))
    with pytest.raises(TargetError, match="committed"):
        target.abort(committed)
    prepare(target, begun)
    target.abort(begun)
    target.abort(never)
    assert target.staging_tables() == [] and visible(target) == list(range(ROWS))


def test_staging_gone_without_a_ledger_row_is_aborted_on_a_ledger_that_keeps_rows(target):
    committable = prepare(target, ref())
    drop(target, committable.label)
    assert target.commit(committable) is CommitOutcome.ABORTED
    assert ledger_limit(target) is None


def test_a_legacy_ledger_with_a_ttl_is_upgraded_and_says_lost(clickhouse_url):
    old = ref(partition=5)
    target = ClickHouseTarget(clickhouse_url, database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE {DB}")
    client.command(LEGACY_LEDGER_DDL)
    client.command(f"INSERT INTO {DB}.{LEDGER_TABLE} (label, target_table, rows) VALUES ('{old.label}', '{TABLE}', 3)")
    target.close()
    target = make_target(clickhouse_url)  # the upgrade happens here
    try:
        columns = target.table_columns(LEDGER_TABLE)
        assert "state" in columns
        committable = prepare(target, ref())
        drop(target, committable.label)
        assert target.commit(committable) is CommitOutcome.LOST  # its row may have expired: cannot say ABORTED
        assert target.commit(replace(committable, label=old.label)) is CommitOutcome.COMMITTED
        assert ledger_limit(target) == 30 * 86400.0
    finally:
        target.close()


def test_a_losing_writer_never_drops_the_winners_staging_table(target):
    txn = ref()
    winner = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    loser = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)  # same label: a reused attempt string
    chunk = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]})
    winner.write(chunk)
    with pytest.raises(Exception, match="already exists"):
        loser.write(chunk)
    loser.abort()
    assert target.staging_tables() == [txn.label]
    [part] = winner.prepare()
    assert part.rows == 2


def test_user_tables_named_ss_are_routable_and_staging_tables_are_not(target):
    target.client().command(TABLE_DDL.format(name="ss_orders"))
    prepare(target, ref())
    assert target.routable_tables() == {TABLE, "ss_orders"}
    assert target.staging_tables() == [ref().label]


def test_leftover_transactions_lists_staging_tables_of_one_job(target):
    ours, theirs = ref("job"), ref("jobber")
    prepare(target, ours)
    prepare(target, theirs)
    target.client().command(TABLE_DDL.format(name="ss_job_orders"))
    assert target.leftover_transactions("ss_job_") == [ours.label]
    assert target.leftover_transactions("ss_jobber_") == [theirs.label]
    assert target.leftover_transactions("ss_other_") == []


def ledger_limit(target: ClickHouseTarget) -> float | None:
    (limit,) = [e.seconds for e in target.expiry_limits() if e.what == "commit ledger"]
    return limit


def test_https_options_reach_the_client_and_are_refused_without_https(monkeypatch):
    import clickhouse_connect

    from streaming_sink.targets.base import ConfigurationError
    from streaming_sink.targets.clickhouse import ClickHouseTarget

    seen: dict = {}
    monkeypatch.setattr(clickhouse_connect, "get_client", lambda **kwargs: seen.update(kwargs) or object())
    ClickHouseTarget("https://ch:8443", ca_bundle="/etc/ca.pem").client()
    assert (seen["secure"], seen["verify"], seen["ca_cert"], seen["port"]) == (True, True, "/etc/ca.pem", 8443)
    with pytest.raises(ConfigurationError, match="verify and ca_bundle are for https"):
        ClickHouseTarget("http://ch:8123", verify=False)


def test_over_https_a_ca_bundle_trusts_the_server_the_system_cas_do_not_and_verify_false_skips_the_check(tmp_path):
    """The TLS options on a real TLS connection: the front serves HTTPS with a certificate of a test CA. A target made
    from the job's `clickhouses://` URL with `ca_bundle` writes (pickled, as a Spark task gets it) and commits; one
    checking against the system's CAs is refused by its client; `verify = false` connects without checking."""
    from clickhouse_connect.driver.exceptions import OperationalError

    from streaming_sink.targets.clickhouse import ClickHouseError

    ca, cert, key = issue_certificates(tmp_path)
    with ClickHouseFront(tmp_path / "ch", tls=(cert, key)) as front:
        target = target_from_url(front.target_url, DB, {"ca_bundle": ca})
        assert isinstance(target, ClickHouseTarget) and target.url == front.url and front.url.startswith("https://")
        target.client().command(f"CREATE DATABASE {DB}")
        target.client().command(TABLE_DDL.format(name=TABLE))
        target.routable_tables()
        writer = pickle.loads(pickle.dumps(target))
        committable = prepare(writer, ref())
        writer.close()
        assert target.commit(committable) is CommitOutcome.COMMITTED and visible(target) == list(range(ROWS))
        untrusted = ClickHouseTarget(front.url, database=DB, connect_timeout_s=5)
        with pytest.raises(ClickHouseError, match="CERTIFICATE_VERIFY_FAILED") as refused:
            untrusted.routable_tables()
        assert isinstance(refused.value.__cause__, OperationalError)
        unchecked = ClickHouseTarget(front.url, database=DB, verify=False)
        assert visible(unchecked) == list(range(ROWS))
        for each in (target, untrusted, unchecked):
            each.close()


# -- materialized views and commit_mode "insert" (review R8) ------------------------------------------------------

WINDOW = "SETTINGS non_replicated_deduplication_window = 1000"
TOTALS_DDL = f"CREATE TABLE {DB}.orders_totals (k UInt8, n UInt64, s Int64) ENGINE = SummingMergeTree ORDER BY k"
VIEW_DDL = f"CREATE MATERIALIZED VIEW {DB}.orders_mv TO {DB}.orders_totals AS SELECT 0 AS k, count() AS n, sum(id) AS s FROM {DB}.{TABLE}"


def make_view_target(url: str, mode: str = "insert", table_window: bool = True, totals_window: bool = True) -> ClickHouseTarget:
    """`orders` (two partitions) feeding `orders_mv`, which sums into `orders_totals`."""
    target = ClickHouseTarget(url, database=DB, commit_mode=mode)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    client.command(TABLE_DDL.format(name=TABLE) + (f" {WINDOW}" if table_window else ""))
    client.command(TOTALS_DDL + (f" {WINDOW}" if totals_window else ""))
    client.command(VIEW_DDL)
    target.routable_tables()
    return target


@pytest.fixture
def insert_target(clickhouse_url):
    target = make_view_target(clickhouse_url)
    yield target
    target.close()


def totals(target: ClickHouseTarget) -> tuple[int, int]:
    n, s = target.client().query(f"SELECT sum(n), sum(s) FROM {DB}.orders_totals").result_rows[0]
    return int(n), int(s)


def ledger_states(target: ClickHouseTarget, label: str) -> list[str]:
    rows = target.client().query(f"SELECT state FROM {DB}.{LEDGER_TABLE} WHERE label = '{label}' ORDER BY committed_at, state").result_rows
    return sorted(r[0] for r in rows)


def test_insert_mode_fires_the_view_once_and_a_repeated_commit_changes_nothing(insert_target):
    committable = prepare(insert_target, ref())
    assert insert_target.commit(committable) is CommitOutcome.COMMITTED
    assert ledger_states(insert_target, committable.label) == ["committed", "inserted", "inserted", "inserting"]
    assert insert_target.commit(committable) is CommitOutcome.COMMITTED
    assert visible(insert_target) == list(range(ROWS)) and insert_target.staging_tables() == []
    assert totals(insert_target) == (ROWS, sum(range(ROWS)))


# ledger 'inserting'; per partition its INSERT, then its ledger 'inserted' row; ledger 'committed'; drop
INSERT_STEPS = ["INSERT", "INSERT", "INSERT", "INSERT", "INSERT", "INSERT", "DROP"]


@pytest.mark.parametrize("step", range(len(INSERT_STEPS)))
def test_insert_commit_repeated_after_a_crash_at_every_step_counts_every_row_once_in_table_and_view(insert_target, monkeypatch, step):
    txn = ref()
    committable = prepare(insert_target, txn)

    def writes() -> list[str]:
        return [sql for sql in seen if not sql.startswith("EXISTS")]

    def crash_at_step(sql: str) -> None:
        if len(writes()) == step + 1 and not sql.startswith("EXISTS"):
            raise Crash(sql)

    seen = wrap_command(monkeypatch, insert_target, crash_at_step)
    with pytest.raises(Crash):
        insert_target.commit(committable)
    monkeypatch.undo()
    assert [sql.split()[0] for sql in writes()] == INSERT_STEPS[: step + 1]
    assert "inserting" in ledger_states(insert_target, txn.label)  # journaled before the first INSERT
    with pytest.raises(TargetError, match=txn.label):  # an abort arriving now must not destroy a begun commit
        insert_target.abort(txn)
    assert insert_target.commit(committable) is CommitOutcome.COMMITTED
    assert insert_target.commit(committable) is CommitOutcome.COMMITTED
    assert visible(insert_target) == list(range(ROWS)) and insert_target.staging_tables() == []
    assert totals(insert_target) == (ROWS, sum(range(ROWS)))


def test_staging_gone_after_the_insert_began_is_ambiguous_never_lost(insert_target):
    committable = prepare(insert_target, ref())
    insert_target.ledger.write(committable, "inserting")
    drop(insert_target, committable.label)
    with pytest.raises(CommitAmbiguousError, match="INSERT") as raised:
        insert_target.commit(committable)
    assert "ClickHouse commit interrupted" in str(raised.value)


def test_a_label_whose_insert_began_is_finished_by_insert_in_move_mode_too(clickhouse_url):
    """The ledger, not the current option, says how a begun commit ends (a user switched back to move)."""
    target = make_view_target(clickhouse_url)
    try:
        committable = prepare(target, ref())
        target.ledger.write(committable, "inserting")
        target.close()
        mover = ClickHouseTarget(clickhouse_url, database=DB)  # commit_mode "move"
        assert mover.commit(committable) is CommitOutcome.COMMITTED
        assert visible(mover) == list(range(ROWS)) and totals(mover) == (ROWS, sum(range(ROWS)))
    finally:
        target.close()


def test_move_mode_refuses_a_table_that_feeds_a_view_naming_the_view_and_the_option(clickhouse_url):
    target = make_view_target(clickhouse_url, mode="move")
    try:
        assert TABLE in target.routable_tables()  # listed, so a route to it is refused by name, not as unknown
        for check in (target.check_loadable, lambda t: target.check_schema(t, pa.schema([])),
                      lambda t: target.begin(t, ref, lambda r: None)):
            with pytest.raises(ConfigurationError, match=r"orders_mv.*commit_mode = \"insert\""):
                check(TABLE)
    finally:
        target.close()


def test_move_mode_loads_a_table_without_views_beside_one_with_views(clickhouse_url):
    target = make_view_target(clickhouse_url, mode="move")
    try:
        target.client().command(TABLE_DDL.format(name="plain"))
        target.check_loadable("plain")
        assert target.table_columns("plain") == {"id": "Int64", "name": "String"}
    finally:
        target.close()


def test_a_view_created_after_prepare_stops_a_move_commit_before_anything_moves(target):
    committable = prepare(target, ref())
    target.client().command(TOTALS_DDL)
    target.client().command(VIEW_DDL)
    with pytest.raises(ConfigurationError, match="orders_mv"):
        target.commit(committable)
    assert visible(target) == [] and ledger_states(target, committable.label) == []


@pytest.mark.parametrize("table_window, totals_window, culprit", [(False, True, f"{DB}.{TABLE}"), (True, False, f"{DB}.orders_totals")])
def test_insert_mode_refuses_tables_whose_repeated_insert_would_not_be_deduplicated(clickhouse_url, table_window, totals_window, culprit):
    target = make_view_target(clickhouse_url, table_window=table_window, totals_window=totals_window)
    try:
        with pytest.raises(ConfigurationError, match="non_replicated_deduplication_window") as refused:
            target.check_schema(TABLE, pa.schema([]))
        assert culprit in str(refused.value)
        assert "MODIFY SETTING non_replicated_deduplication_window" in str(refused.value)
    finally:
        target.close()


def test_insert_mode_refuses_a_table_whose_rows_cannot_be_sorted(insert_target):
    """A repeated INSERT … SELECT must cut the rows into the same blocks, so it sorts them; ClickHouse cannot compare
    AggregateFunction values, so such a table is refused (an error of another kind is raised as it is)."""
    insert_target.client().command(f"CREATE TABLE {DB}.sums (k Int64, s AggregateFunction(sum, Int64)) "
                                   f"ENGINE = AggregatingMergeTree ORDER BY k {WINDOW}")
    with pytest.raises(ConfigurationError, match=r"sums cannot be loaded .* rows cannot be put in a total order.*ILLEGAL_COLUMN"):
        insert_target.check_loadable("sums")


def test_insert_mode_reports_the_deduplication_window_to_doctor(insert_target):
    (limit,) = [e for e in insert_target.expiry_limits() if "deduplication" in e.what]
    assert limit.count == 1000 and limit.seconds is None


# -- the deduplication window against a resumed insert commit (reliability review 2026-11-24, F1) -----------------

DAILY, DAYS, PER_DAY = "daily", 3, 10  # PARTITION BY day: one INSERT (and one block) per day and label
PREVIOUS_LEDGER_DDL = (  # what versions before the per-partition `inserted` rows created (with `state`, no partition)
    f"CREATE TABLE {DB}.{LEDGER_TABLE} (label String, target_table String, rows UInt64, state String DEFAULT 'committed', "
    "committed_at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY label"
)


def daily_target(url: str, window: int, parallelism: int = 1) -> ClickHouseTarget:
    """An insert-mode target over `daily`, whose deduplication window is `window` blocks."""
    target = ClickHouseTarget(url, database=DB, commit_mode="insert", commit_parallelism=parallelism)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    client.command(f"CREATE TABLE {DB}.{DAILY} (day UInt8, id Int64) ENGINE = MergeTree PARTITION BY day ORDER BY id "
                   f"SETTINGS non_replicated_deduplication_window = {window}")
    target.routable_tables()
    return target


def prepare_daily(target: ClickHouseTarget, partition: int, first_id: int) -> Committable:
    """A label of DAYS x PER_DAY rows (ids from `first_id`), one staging partition per day."""
    txn = TxnRef("clickhouse", DB, DAILY, make_label("job", "query-1", 7, DAILY, partition, "e1w0t0"), partition, "e1w0t0")
    transaction = target.begin(DAILY, lambda chunk: txn, lambda recorded: None)
    ids = list(range(first_id, first_id + DAYS * PER_DAY))
    transaction.write(pa.table({"day": pa.array([i % DAYS for i in ids], pa.uint8()), "id": pa.array(ids, pa.int64())}))
    [part] = transaction.prepare()
    return part.committable("checksum")


def daily_ids(target: ClickHouseTarget) -> list[int]:
    return sorted(r[0] for r in target.client().query(f"SELECT id FROM {DB}.{DAILY}").result_rows)


def crash_after_the_inserts(monkeypatch) -> None:
    """A kill -9 at INSERT_CRASH_POINT: every INSERT of the commit ran, its `committed` ledger row did not."""
    def crash(name: str, batch_id: int) -> None:
        if name == INSERT_CRASH_POINT:
            raise Crash(name)

    monkeypatch.setattr(clickhouse_module, "crash_point", crash)


@pytest.mark.parametrize("window", [1, 2])
def test_an_insert_commit_with_more_partitions_than_the_window_is_refused_before_anything_is_inserted(clickhouse_url, window):
    """The review's case: 3 partitions, window 1 or 2. A resumed commit would have inserted every partition twice;
    now the first commit step refuses, naming the table, its window and the least it needs, and nothing is inserted."""
    target = daily_target(clickhouse_url, window)
    try:
        target.check_loadable(DAILY)  # one commit at a time: the start floor (1) is met
        committable = prepare_daily(target, 0, 0)
        with pytest.raises(ConfigurationError) as refused:
            target.commit(committable)
        message = str(refused.value)
        assert "\n" not in message and f"{DB}.{DAILY}" in message, message
        assert f"non_replicated_deduplication_window is {window}" in message and "at least 3" in message, message
        assert f"ALTER TABLE `{DB}`.`{DAILY}` MODIFY SETTING non_replicated_deduplication_window = " in message, message
        assert daily_ids(target) == [] and ledger_states(target, committable.label) == []
        assert target.staging_tables() == [committable.label]  # still PREPARED: committed once the window is raised
        target.client().command(f"ALTER TABLE {DB}.{DAILY} MODIFY SETTING non_replicated_deduplication_window = {DAYS}")
        assert target.commit(committable) is CommitOutcome.COMMITTED
        assert daily_ids(target) == list(range(DAYS * PER_DAY))
    finally:
        target.close()


def test_a_resumed_insert_commit_skips_the_partitions_the_ledger_recorded_whatever_the_log_forgot(clickhouse_url, monkeypatch):
    """Window 3 = the label's partitions, so the commit is allowed; but another label of the table (a parallel
    commit) inserts 3 blocks between the crash and the resume, pushing the first label's blocks out of the log.
    The resume must not depend on the log for partitions whose INSERT is known to have finished."""
    target = daily_target(clickhouse_url, window=DAYS)
    try:
        cut, other = prepare_daily(target, 0, 0), prepare_daily(target, 1, 1000)
        crash_after_the_inserts(monkeypatch)
        with pytest.raises(Crash):
            target.commit(cut)
        monkeypatch.undo()
        assert target.commit(other) is CommitOutcome.COMMITTED
        assert target.commit(cut) is CommitOutcome.COMMITTED
        assert daily_ids(target) == list(range(DAYS * PER_DAY)) + list(range(1000, 1000 + DAYS * PER_DAY))
    finally:
        target.close()


def test_insert_mode_refuses_at_start_a_window_below_one_insert_per_parallel_commit(clickhouse_url):
    """Over HTTP `commit_parallelism` commits run at once, each with an INSERT in flight; embedded, one."""
    target = daily_target(clickhouse_url, window=2, parallelism=4)
    try:
        if target.embedded:
            assert target.commit_parallelism == 1
            target.check_loadable(DAILY)
            return
        with pytest.raises(ConfigurationError) as refused:
            target.check_schema(DAILY, pa.schema([]))
        message = str(refused.value)
        assert f"{DB}.{DAILY}" in message and "non_replicated_deduplication_window is 2" in message, message
        assert "at least 4" in message and "commit_parallelism 4" in message and "MODIFY SETTING" in message, message
    finally:
        target.close()


def test_an_insert_commit_is_refused_when_a_views_table_has_a_window_below_its_partitions(insert_target):
    """Two partitions times the commits running at once must fit in the view's table's window too; one less
    passes the start check (one INSERT per parallel commit) and is refused by the commit's first step."""
    committable = prepare(insert_target, ref())  # two partitions
    least = 2 * insert_target.commit_parallelism
    insert_target.client().command(f"ALTER TABLE {DB}.orders_totals MODIFY SETTING non_replicated_deduplication_window = {least - 1}")
    assert insert_target.catalog.refusal(TABLE) is None  # the start check, asked again now
    with pytest.raises(ConfigurationError) as refused:
        insert_target.commit(committable)
    message = str(refused.value)
    assert f"{DB}.orders_totals" in message and f"non_replicated_deduplication_window is {least - 1}," in message, message
    assert f"at least {least} " in message and "refused before anything was inserted" in message, message
    assert visible(insert_target) == [] and totals(insert_target) == (0, 0)
    assert ledger_states(insert_target, committable.label) == []


def test_an_insert_commit_begun_under_a_ledger_without_partition_rows_is_finished_exactly(clickhouse_url):
    """A label whose `inserting` row an older version wrote (no per-partition rows) is finished by repeating
    every INSERT, deduplicated by the log as before."""
    target = ClickHouseTarget(clickhouse_url, database=DB, commit_mode="insert")
    client = target.client()
    client.command(f"CREATE DATABASE {DB}")
    client.command(PREVIOUS_LEDGER_DDL)
    target.close()
    target = daily_target(clickhouse_url, window=1000)
    try:
        committable = prepare_daily(target, 0, 0)
        target.ledger.write(committable, "inserting")
        assert target.commit(committable) is CommitOutcome.COMMITTED
        assert target.commit(committable) is CommitOutcome.COMMITTED
        assert daily_ids(target) == list(range(DAYS * PER_DAY)) and target.staging_tables() == []
    finally:
        target.close()


def test_an_unknown_commit_mode_is_refused():
    with pytest.raises(ConfigurationError, match="commit_mode 'copy'"):
        ClickHouseTarget("chdb:///tmp/never-opened", commit_mode="copy")


# -- engines ---------------------------------------------------------------------------------------


def test_tables_of_engines_a_move_cannot_commit_are_not_routable_and_the_log_says_why(target, caplog):
    target.client().command(f"CREATE TABLE {DB}.events_log (id Int64) ENGINE = Log")
    target.client().command(f"CREATE TABLE {DB}.events_mem (id Int64) ENGINE = Memory")
    with caplog.at_level("WARNING"):
        assert target.routable_tables() == {TABLE}
    assert "events_log cannot be loaded: Log" in caplog.text and "events_mem cannot be loaded: Memory" in caplog.text
    with pytest.raises(ConfigurationError, match="events_log: Log"):
        target.check_loadable("events_log")


def test_a_replacing_staging_table_folds_no_rows_before_prepare_counts_them(clickhouse_url):
    """Rows of equal keys in one batch: a background merge of a ReplacingMergeTree staging table would fold
    them before prepare counts them, failing the batch for nothing. Staging tables of such engines merge
    nothing; the target's own merges apply once the rows are moved."""
    target = ClickHouseTarget(clickhouse_url, database=DB)
    try:
        client = target.client()
        client.command(f"CREATE DATABASE {DB}")
        client.command(f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = ReplacingMergeTree ORDER BY id")
        target.routable_tables()
        txn = ref()
        transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
        for version in range(3):  # three parts with the same keys
            transaction.write(pa.table({"id": pa.array([1, 2], pa.int64()), "name": [f"v{version}", f"v{version}"]}))
        try:  # what a background merge would do now
            client.command(f"OPTIMIZE TABLE {DB}.`{txn.label}` FINAL")
        except Exception as error:  # merges are stopped on the staging table
            assert "ABORTED" in str(error) or "Cancelled" in str(error)
        [part] = transaction.prepare()
        assert part.rows == 6
        assert target.commit(part.committable("checksum")) is CommitOutcome.COMMITTED
        assert client.query(f"SELECT count() FROM {DB}.{TABLE}").result_rows[0][0] == 6
    finally:
        target.close()
