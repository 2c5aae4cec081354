"""The ClickHouse commit is one idempotent, verifiable step, whatever interleaves with it (review R3, R6, R7, O4).

Real embedded ClickHouse (chdb), one path per test. Interleavings are injected by wrapping the
target's own helpers or the client's `command`, never by timing.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pyarrow as pa
import pytest

from streaming_sink.committable import Committable, TxnRef, make_label
from streaming_sink.targets.base import CommitAmbiguousError, CommitOutcome, TargetError
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseTarget

DB, TABLE, ROWS = "analytics", "orders", 10
# Two partitions, so a commit moves twice and can be cut between the moves.
TABLE_DDL = f"CREATE TABLE {DB}.{{name}} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
LEGACY_LEDGER_DDL = (  # what versions before the in-progress row created
    f"CREATE TABLE {DB}.{LEDGER_TABLE} (label String, target_table String, rows UInt64, committed_at DateTime DEFAULT now()) "
    "ENGINE = MergeTree ORDER BY label TTL committed_at + INTERVAL 30 DAY"
)


class Crash(BaseException):
    """A kill -9 at the injection point: nothing after it runs."""


def make_target(tmp_path, legacy_ledger: bool = False) -> ClickHouseTarget:
    target = ClickHouseTarget(f"chdb://{tmp_path / 'ch'}", database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    client.command(TABLE_DDL.format(name=TABLE))
    if legacy_ledger:
        client.command(LEGACY_LEDGER_DDL)
    target.routable_tables()
    return target


@pytest.fixture
def target(tmp_path):
    target = make_target(tmp_path)
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
    exists = target._exists

    def exists_then_dropped(table: str) -> bool:
        answer = exists(table)
        if answer and table == committable.label:
            drop(target, table)  # a fenced driver's abort, between the check and the listing
        return answer

    monkeypatch.setattr(target, "_exists", exists_then_dropped)
    assert target.commit(committable) is CommitOutcome.ABORTED  # nothing ever moved: replay is safe
    assert target.commit(committable) is CommitOutcome.ABORTED
    assert visible(target) == []


def test_listing_partitions_of_a_missing_staging_table_fails(target):
    with pytest.raises(TargetError, match="does not exist"):
        target._partitions(ref().label)


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


STEPS = ["INSERT", "ALTER", "ALTER", "INSERT", "DROP"]  # in-progress row, two moves, final row, drop of staging


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


def test_a_legacy_ledger_with_a_ttl_is_upgraded_and_says_lost(tmp_path):
    old = ref(partition=5)
    target = ClickHouseTarget(f"chdb://{tmp_path / 'ch'}", database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE {DB}")
    client.command(LEGACY_LEDGER_DDL)
    client.command(f"INSERT INTO {DB}.{LEDGER_TABLE} (label, target_table, rows) VALUES ('{old.label}', '{TABLE}', 3)")
    target.close()
    target = make_target(tmp_path)  # the upgrade happens here
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
