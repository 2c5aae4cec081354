"""ClickHouse behind a load balancer over replicas (issue 23 item 7; conformance review 2026-11-24, C2 and C5).

A replicated cluster cannot run here, so the test front plays one (tests/support/doubles/clickhouse_front/server.py,
"Replicas"): it presents the ledger as a Replicated (or Shared) table over the real engine and keeps one
replica whose replication queue for the ledger stalled. A restarted driver whose session lands there sees
the ledger as it was before the commit, while the staging table the commit dropped is gone everywhere.
Only what a real replica does ends that: `SYSTEM SYNC REPLICA … LIGHTWEIGHT`, or, on SharedMergeTree, a
read with `select_sequential_consistency = 1`. Every test drives the target over HTTP, as a driver does.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.labels import make_label
from streaming_sink.targets.base import CommitOutcome, CommittedNotChosenError, ConfigurationError, TargetError
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseError, ClickHouseTarget
from streaming_sink.targets.clickhouse.readiness import version_refusal
from streaming_sink.targets.clickhouse.target import CommitInterruptedError
from tests.support.doubles.clickhouse_front import ClickHouseFront

DB, TABLE, ROWS = "analytics", "orders", 10
LEDGER = f"{DB}.{LEDGER_TABLE}"
SOURCE = list(range(ROWS))
# Two partitions, so a commit moves twice and can be cut between the moves.
TABLE_DDL = f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
REPLICATED, SHARED = "ReplicatedMergeTree", "SharedMergeTree"


@pytest.fixture
def front(tmp_path: Path) -> Iterator[ClickHouseFront]:
    with ClickHouseFront(tmp_path / "clickhouse") as front:
        yield front


def _setup(front: ClickHouseFront, ledger_engine: str | None = REPLICATED, **options: Any) -> ClickHouseTarget:
    """A target over the front whose ledger the front presents as `ledger_engine` (None: a single server's MergeTree)."""
    if ledger_engine is not None:
        front.replicate(LEDGER, ledger_engine)
    target = ClickHouseTarget(front.url, database=DB, **options)
    target.client().command(f"CREATE DATABASE {DB}")
    target.client().command(TABLE_DDL + (" SETTINGS non_replicated_deduplication_window = 1000"
                                         if options.get("commit_mode") == "insert" else ""))
    target.routable_tables()  # the ledger exists from here
    return target


def _label(attempt: str = "e1w0t0") -> str:
    return make_label("job", "query-1", 7, TABLE, 0, attempt)


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})


def _prepare(target: ClickHouseTarget, attempt: str = "e1w0t0",
             between: Callable[[str], None] | None = None) -> Committable:
    """The source rows in a staging table, prepared by the target's own transaction (one label per attempt); with
    `between`, in two inserts (each part one partition: even ids, then odd), `between(staging)` called after the first."""
    txn = TxnRef("clickhouse", DB, TABLE, _label(attempt), 0, attempt)
    transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    if between is None:
        transaction.write(_rows(SOURCE))
    else:
        transaction.write(_rows(SOURCE[0::2]))
        between(f"{DB}.{txn.label}")
        transaction.write(_rows(SOURCE[1::2]))
    [part] = transaction.prepare()
    return part.committable("checksum")


def _visible(target: ClickHouseTarget) -> list[int]:
    return sorted(r[0] for r in target.client().query(f"SELECT id FROM {DB}.{TABLE}").result_rows)


@pytest.mark.parametrize("ledger_engine", [REPLICATED, SHARED])
def test_a_restarted_driver_on_a_lagging_replica_finds_the_commit_and_replays_nothing(front, ledger_engine):
    """Review divergence 2: the commit wrote `committed` and dropped staging; the driver died before it recorded
    the batch done. The restarted driver's session lands on a replica that has applied the DROP but fetched no
    ledger row of the commit: its verdict must still be COMMITTED, since any other verdict replays the batch."""
    first = _setup(front, ledger_engine)
    committable = _prepare(first)
    front.lag(LEDGER)  # this replica fetches none of the commit's ledger rows
    assert first.commit(committable) is CommitOutcome.COMMITTED
    first.close()  # the driver dies here: the batch is not recorded done
    front.stale_reads.arm(LEDGER_TABLE, times=1000)  # the new session's ledger reads land on the lagging replica

    restarted = ClickHouseTarget(front.url, database=DB)
    outcome = restarted.commit(committable)
    if outcome is not CommitOutcome.COMMITTED:  # recovery replays a batch whose label did not commit
        restarted.commit(_prepare(restarted, attempt="e2w0t0"))
    assert (outcome, _visible(restarted)) == (CommitOutcome.COMMITTED, SOURCE)
    assert front.stale_reads.fired and restarted.staging_tables() == []
    restarted.close()


def test_an_abort_on_a_lagging_replica_never_drops_a_commit_that_began(front):
    """The driver died after the first of two moves; a fenced driver (or an operator) on the lagging replica
    aborts the label. The ledger's `moving` row forbids it; a stale read would drop the rows not yet moved."""
    first = _setup(front, retries=0)
    committable = _prepare(first)
    front.lag(LEDGER)
    front.faults.drop_after_apply.arm("MOVE PARTITION")  # the first move is applied, its answer never comes
    with pytest.raises(ClickHouseError) as lost:  # retries=0: the lost answer ends the commit here
        first.commit(committable)
    assert isinstance(lost.value.__cause__, OperationalError)  # clickhouse-connect's, translated at the target's edge
    first.close()
    front.stale_reads.arm(LEDGER_TABLE, times=1000)

    fenced = ClickHouseTarget(front.url, database=DB)
    with pytest.raises(CommittedNotChosenError):
        fenced.abort(committable)
    assert fenced.commit(committable) is CommitOutcome.COMMITTED  # the restarted driver finishes it
    assert _visible(fenced) == SOURCE
    fenced.close()


@pytest.mark.parametrize("ledger_engine", [None, REPLICATED, SHARED])
def test_moves_wait_for_every_replica_and_verdicts_read_a_synced_ledger(front, ledger_engine):
    """Review divergence 4: each MOVE returns only once every replica executed it (`alter_sync = 2`), so the
    `committed` row never gets ahead of a replica. On a Replicated ledger its rows reach a majority first
    (`insert_quorum = 'auto'`), and every ledger read that decides something first syncs this replica
    (Shared: and reads sequentially consistent). A single server's MergeTree ledger needs neither."""
    target = _setup(front, ledger_engine)
    committable = _prepare(target)
    start = len(front.executed)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    ran = front.executed[start:]

    moves = [settings for text, settings in ran if "MOVE PARTITION" in text]
    assert len(moves) == 2 and all(settings.get("alter_sync") == "2" for settings in moves), moves
    ledger_rows = [settings for text, settings in ran if text.startswith(f"INSERT INTO `{DB}`.`{LEDGER_TABLE}`")]
    assert [settings.get("insert_quorum") for settings in ledger_rows] == [  # `moving` per partition, then `committed`
        "auto" if ledger_engine == REPLICATED else None] * 3
    reads = [(text.split()[0], settings.get("select_sequential_consistency"))
             for text, settings in ran if LEDGER_TABLE in text and not text.startswith("INSERT")]
    synced = [("SYSTEM", None), ("SELECT", "1" if ledger_engine == SHARED else None)]
    assert reads == (synced if ledger_engine else [("SELECT", None)]), reads
    assert _visible(target) == SOURCE
    target.close()


def test_an_insert_commit_into_a_replicated_table_waits_for_a_quorum(front, monkeypatch):
    """Insert mode: each INSERT … SELECT into a Replicated table returns once a majority of its replicas hold it."""
    target = _setup(front, commit_mode="insert")
    committable = _prepare(target)
    # chdb has no Keeper: the table is a MergeTree that the target is told is replicated (a MergeTree ignores the quorum)
    monkeypatch.setattr(target.catalog, "engine_of", lambda table: REPLICATED)
    start = len(front.statements)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    inserts = [text for text in front.statements[start:] if text.startswith(f"INSERT INTO `{DB}`.`{TABLE}`")]
    assert len(inserts) == 2 and all("insert_quorum = 'auto'" in text for text in inserts), inserts
    assert _visible(target) == SOURCE
    target.close()


def test_a_move_that_applied_then_failed_is_not_sent_again_by_the_replica_that_still_holds_it(front):
    """Review divergence 1 (conformance 2026-11-27, C8): the first MOVE applies on replica A, then answers 341
    UNFINISHED (alter_sync waited for an inactive replica); the source's DROP_RANGE was never written, so replica B
    still holds the partition in staging, and the balancer sends the repeated commit there. B must not move it again:
    the target holds each source row once."""
    target = _setup(front, backoff_s=0.01)
    committable = _prepare(target, between=lambda staging: front.replicate(staging))
    front.faults.unfinished.arm("MOVE PARTITION", times=1)
    front.stale_reads.arm(lambda text: front.faults.unfinished.fired > 0, times=1000)  # every statement from then on

    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert _visible(target) == SOURCE
    assert front.faults.unfinished.fired == 1 and front.stale_reads.fired  # the repeat did land on replica B
    assert target.staging_tables() == []
    target.close()


def test_a_move_whose_answer_was_lost_is_not_guessed_while_another_replica_still_holds_the_partition(front):
    """As above, but the answer never arrives (the connection drops while alter_sync waits): nothing tells whether the
    partition moved, and replica B still lists it. The repeat stops with the ambiguous-commit error instead of moving it
    again; the rows moved are in the target once."""
    target = _setup(front, backoff_s=0.01)
    committable = _prepare(target, between=lambda staging: front.replicate(staging))
    front.faults.unfinished.arm("MOVE PARTITION", times=1)
    front.faults.drop_after_apply.arm("MOVE PARTITION", times=1)
    front.stale_reads.arm(lambda text: front.faults.unfinished.fired > 0, times=1000)  # every statement from then on

    with pytest.raises(CommitInterruptedError, match="partition '0'"):
        target.commit(committable)
    assert _visible(target) == SOURCE[0::2]  # the first partition, once
    target.close()


@pytest.mark.parametrize("commit_mode", ["move", "insert"])
def test_a_replica_that_lags_one_staging_part_never_lets_its_partition_be_lost(front, commit_mode):
    """Review divergence 2: replica B has not fetched the staging table's second part (the odd ids' partition) and
    answers every read and move of the commit: unsynced, it lists one partition, counts 0 after moving it, and the
    commit drops staging with the other partition in it. Synced first, it moves both. (Insert mode counted the staging
    table against the prepared rows already, so it stopped there; synced, it commits.)"""
    target = _setup(front, commit_mode=commit_mode)

    def lag_after_first_part(staging: str) -> None:
        front.replicate(staging)
        front.lag(staging)

    committable = _prepare(target, between=lag_after_first_part)
    front.stale_reads.arm(lambda text: True, times=1000)

    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert _visible(target) == SOURCE
    assert front.stale_reads.fired
    target.close()


def test_a_commit_whose_staging_rows_do_not_add_up_to_the_prepared_rows_stops_before_it_moves_anything(front):
    """`committed` is written only when the rows moved (plus those journaled as moved) are the prepared rows."""
    target = _setup(front)
    committable = _prepare(target)
    with pytest.raises(TargetError, match=f"{ROWS} rows .* {ROWS + 1} were prepared"):
        target.commit(dataclasses.replace(committable, rows=ROWS + 1))
    assert _visible(target) == [] and target.ledger.state(committable.label) is None
    target.close()


@pytest.mark.parametrize("replicated", [False, True])
def test_a_move_refused_before_it_ran_is_sent_again_only_where_the_listing_proves_it(front, replicated):
    """A MOVE the server refused (503 before executing) left its partition journaled as `moving`. One server's own
    staging listing proves the partition is still there: the next commit moves it. A replicated staging table's listing
    is one replica's view, which a move run elsewhere may not have reached: the commit stops instead."""
    target = _setup(front, retries=0)
    committable = _prepare(target, between=(lambda staging: front.replicate(staging)) if replicated else None)
    front.faults.fail_before.arm("MOVE PARTITION", times=1)
    with pytest.raises(ClickHouseError):
        target.commit(committable)
    if replicated:
        with pytest.raises(CommitInterruptedError, match="partition '0'"):
            target.commit(committable)
        assert _visible(target) == []
    else:
        assert target.commit(committable) is CommitOutcome.COMMITTED
        assert _visible(target) == SOURCE
    target.close()


@pytest.mark.parametrize(("engine", "sent"), [(REPLICATED, "2"), (SHARED, "3")])
def test_alter_sync_3_is_kept_only_where_it_waits(front, engine, sent):
    """Review divergence 3 (C9): on ReplicatedMergeTree `alter_sync = 3` did not wait at all for a partition move
    (ClickHouse PR #117517 made it act as 2), so the target sends 2 whatever its settings say; on SharedMergeTree 3
    waits for the active replicas and a user's 3 is kept."""
    target = _setup(front, settings={"alter_sync": 3})
    committable = _prepare(target, between=lambda staging: front.replicate(staging, engine))
    start = len(front.executed)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    moves = [settings.get("alter_sync") for text, settings in front.executed[start:] if "MOVE PARTITION" in text]
    assert moves == [sent, sent] and _visible(target) == SOURCE
    target.close()


def test_doctor_finds_nothing_to_sync_on_one_server_and_syncs_a_replicated_ledger(front):
    """Conformance divergence 9: where the target's tables are replicated, every commit runs SYSTEM SYNC REPLICA …
    LIGHTWEIGHT; doctor runs it once on the ledger, which proves the server has it and the user may."""
    single = _setup(front, ledger_engine=None)
    assert "one server's" in single.server_readiness()
    single.close()
    front.replicate(LEDGER)
    target = ClickHouseTarget(front.url, database=DB)
    start = len(front.statements)
    assert "works on the ledger" in target.server_readiness()
    assert f"SYSTEM SYNC REPLICA `{DB}`.`{LEDGER_TABLE}` LIGHTWEIGHT" in front.statements[start:]
    front.faults.fail_before.arm("SYSTEM SYNC REPLICA", status=403, code=497, name="ACCESS_DENIED",
                                 message="default: Not enough privileges. To execute this query, it's necessary to have "
                                         "the grant SYSTEM SYNC REPLICA ON analytics._streaming_sink_ledger")
    with pytest.raises(ConfigurationError, match=rf"Not enough privileges.*GRANT SYSTEM SYNC REPLICA ON {DB}\.\*"):
        target.server_readiness()
    target.close()


def test_doctor_refuses_a_one_server_ledger_beside_replicated_tables(front):
    target = _setup(front, ledger_engine=None)
    front.replicate(f"{DB}.{TABLE}")
    with pytest.raises(ConfigurationError, match="create it as ReplicatedMergeTree"):
        target.server_readiness()
    target.close()


@pytest.mark.parametrize(("version", "refused"), [("23.3.19.32", True), ("22.8.1.1", True), ("23.4.2.11", False),
                                                  ("26.9.2.1", False), ("unknown", False)])
def test_servers_before_23_4_are_refused_for_replicated_tables(version, refused):
    assert (version_refusal(version) is not None) is refused


def test_the_front_answers_as_a_lagging_replica_until_a_sync_ends_the_lag(front):
    """The stand-in itself: presented engines, stale reads of the lagged table only while armed, PULL ending nothing,
    SYNC REPLICA (and, on Shared, a sequentially consistent read) ending the lag; other tables as the engine has them."""
    target = ClickHouseTarget(front.url, database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE {DB}")
    client.command(f"CREATE TABLE {DB}.journal (n UInt8) ENGINE = MergeTree ORDER BY n")
    client.command(TABLE_DDL)
    front.replicate(f"{DB}.journal")
    engines = dict(client.query("SELECT name, engine FROM system.tables WHERE database = {db:String}",
                                parameters={"db": DB}).result_rows)
    assert engines == {"journal": REPLICATED, TABLE: "MergeTree"}
    [[full]] = client.query(f"SELECT engine_full FROM system.tables WHERE database = '{DB}' AND name = 'journal'").result_rows
    assert full.startswith(f"{REPLICATED}('/clickhouse/tables/{{uuid}}/{{shard}}', '{{replica}}') ORDER BY n"), full
    with pytest.raises(DatabaseError, match="is not replicated"):
        client.command(f"SYSTEM SYNC REPLICA {DB}.{TABLE} LIGHTWEIGHT")  # the engine's own answer

    client.command(f"INSERT INTO {DB}.journal VALUES (1)")
    front.lag(f"{DB}.journal")
    client.command(f"INSERT INTO {DB}.journal VALUES (2)")

    def read(**settings: Any) -> list[int]:
        return sorted(r[0] for r in client.query(f"SELECT n FROM `{DB}`.`journal`", settings=settings).result_rows)

    assert read() == [1, 2]  # not armed: the read lands on a current replica
    front.stale_reads.arm("journal", times=10)
    assert read() == [1]
    assert read(select_sequential_consistency=1) == [1]  # Replicated: only a sequential quorum insert would show
    client.command(f"SYSTEM SYNC REPLICA `{DB}`.`journal` PULL")
    assert read() == [1]
    client.command(f"SYSTEM SYNC REPLICA {DB}.journal LIGHTWEIGHT")
    assert read() == [1, 2] and front.stale_reads.fired == 4

    front.replicate(f"{DB}.journal", SHARED)
    front.lag(f"{DB}.journal")
    client.command(f"INSERT INTO {DB}.journal VALUES (3)")
    assert read() == [1, 2] and read(select_sequential_consistency=1) == [1, 2, 3]
    target.close()


def test_the_front_plays_a_move_that_applied_on_one_replica_and_left_the_other_its_parts(front):
    """The stand-in itself: an unfinished move took the partition out of replica A's staging into the table and
    answered 341; replica B still lists and counts it, a sync does not change that (no DROP_RANGE was written), a
    move sent to B moves B's parts and drops the partition on A too, and dropping the table drops B's copy."""
    target = ClickHouseTarget(front.url, database=DB)
    client = target.client()
    client.command(f"CREATE DATABASE {DB}")
    client.command(TABLE_DDL)
    client.command(TABLE_DDL.replace(f"{DB}.{TABLE}", f"{DB}.staging"))
    client.command(f"INSERT INTO {DB}.staging SELECT number, 'n' FROM numbers(4)")
    front.replicate(f"{DB}.staging")
    front.faults.unfinished.arm("MOVE PARTITION")
    with pytest.raises(DatabaseError, match="UNFINISHED"):
        client.command(f"ALTER TABLE {DB}.staging MOVE PARTITION ID '0' TO TABLE {DB}.{TABLE}")

    def parts(**settings: Any) -> dict[str, int]:
        return {p: rows for p, rows in client.query(
            f"SELECT partition_id, sum(rows) FROM system.parts WHERE database = '{DB}' AND table = 'staging' AND active "
            "GROUP BY partition_id HAVING sum(rows) > 0", settings=settings).result_rows}

    assert parts() == {"1": 2} and _visible(target) == [0, 2]  # replica A
    front.stale_reads.arm(lambda text: True, times=1000)
    client.command(f"SYSTEM SYNC REPLICA {DB}.staging LIGHTWEIGHT")
    assert parts() == {"0": 2, "1": 2}  # replica B, synced: still its own copy
    client.command(f"ALTER TABLE {DB}.staging MOVE PARTITION ID '1' TO TABLE {DB}.{TABLE}")
    front.stale_reads.reset()
    assert parts() == {} and _visible(target) == [0, 1, 2, 3]  # A lost partition 1 by B's DROP_RANGE
    client.command(f"DROP TABLE {DB}.staging SYNC")
    assert client.query("SELECT count() FROM system.tables WHERE database = '_front_replica'").result_rows == [(0,)]
    target.close()
