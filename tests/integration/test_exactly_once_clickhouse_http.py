"""Exactly-once from a real Kafka topic into ClickHouse over HTTP, writers in Spark tasks (issue 15, item 2).

Real Kafka (3 partitions) -> the packaged job in a child process (local Spark, 2 cores, retries allowed:
`local[2,3]`; the writers run in the tasks, one staging table per (table, task attempt)) -> ClickHouse's
HTTP interface served by the test front over the real engine (tests/support/doubles/clickhouse_front, in this process)
-> the Redis state store. The front injects server faults (a connection dropped after a MOVE was
applied, 5xx, answers held beyond the client's timeout); tasks die after prepare and a twin attempt
loses its race; a prepared staging table is dropped by hand and its part is replayed from the re-run
batch. The SIGKILLs at every protocol point and at random instants on this path are the shared
matrix's (test_exactly_once_matrix.py, adapter `ClickHouseHttpAdapter`).

Every pipeline test ends with `verify()`: both tables equal the source row by row (count, checksum,
sorted rows), no staging table is left, every commit the ledger says began finished, no intent is
left, every batch is COMMITTED. Each armed fault must have fired.

The target-level tests at the end (not slow) run the commit of one label against a concurrent commit
or abort of the same label (review R3) and two writers of one label (review R7) over HTTP, at every
interleaving of their statements that the schedules below enumerate.
"""
from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.labels import make_label
from streaming_sink.targets.base import CommitAmbiguousError, CommitOutcome, CommittedNotChosenError
from streaming_sink.targets.clickhouse import COMMITTED, LEDGER_TABLE, ClickHouseTarget
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.pipeline import DB, LocalPipeline
from tests.support.targets.clickhouse import DIE_AFTER_PREPARE, TWIN, ClickHouseHttpAdapter

CRASH_BATCH = 2
STAGING = r"`ss_orders_ingest_\w+`"  # a staging table of the pipeline's job, as statements name it


@pytest.fixture
def front(tmp_path: Path) -> Iterator[ClickHouseFront]:
    with ClickHouseFront(tmp_path / "clickhouse") as front:
        yield front


def _scenario(tmp_path, kafka_broker, redis_server, front, options=None, **overrides) -> LocalPipeline:
    """The matrix adapter's pipeline over this test's front, 45 messages a trigger (3 tasks and 4 batches)."""
    return ClickHouseHttpAdapter(front).pipeline(tmp_path, kafka_broker, redis_server.url, options,
                                                     max_offsets_per_trigger=45, **overrides)


@pytest.mark.slow
def test_server_faults_and_task_deaths_end_exact_without_a_restart(tmp_path, kafka_broker, redis_server, front):
    """Commit: connections dropped after a MOVE was applied (and one before), 5xx on the ledger rows, the MOVE and the drop of
    staging, a MOVE's answer held beyond the client's read timeout: the commit repeats and resumes. Writers:
    5xx and a lost answer on CREATE of staging, a lost answer after rows went into staging: the task fails,
    Spark retries it under a new label, its leftovers are dropped. A task dies after prepare; a twin attempt
    prepares and loses. One run, no restart, exact."""
    faults = front.faults
    ledger_row = rf"^INSERT INTO `{DB}`.`{LEDGER_TABLE}`"
    faults.drop_after_apply.arm(r"MOVE PARTITION", times=2)
    faults.drop_before.arm(r"MOVE PARTITION", times=1)
    faults.fail_before.arm(r"MOVE PARTITION", times=1, status=503)
    faults.fail_before.arm(ledger_row + r".*'moving'", times=1, status=503)
    faults.fail_before.arm(ledger_row + r".*'committed'", times=1, status=500, code=999, name="KEEPER_EXCEPTION")
    faults.drop_after_apply.arm(ledger_row + r".*'committed'", times=1)
    faults.fail_before.arm(rf"^DROP TABLE IF EXISTS `{DB}`.{STAGING}", times=1, status=502)
    faults.delay.arm(r"MOVE PARTITION", times=1, seconds=60)  # applied, the answer held: the client times out
    faults.unfinished.arm(r"MOVE PARTITION", times=1)  # applied, then 341: journaled as moved, never sent again
    faults.fail_before.arm(rf"^CREATE TABLE `{DB}`.{STAGING}", times=1, status=503)
    faults.drop_after_apply.arm(rf"^CREATE TABLE `{DB}`.{STAGING}", times=1)  # created, never known to the writer
    faults.drop_after_apply.arm(rf"^INSERT INTO `{DB}`.{STAGING}", times=1)  # rows in staging, the task fails
    scenario = _scenario(
        tmp_path, kafka_broker, redis_server, front, options={"read_timeout_s": 4.0},
        driver_env={DIE_AFTER_PREPARE: f"{CRASH_BATCH}:0", TWIN: "1:1"},
    )
    try:
        scenario.run_to_completion(first_run=0)
    finally:
        faults.release()
    scenario.verify()
    for knob in faults:
        assert knob.fired >= 1 and not knob.armed, f"knob {knob.name} fired {knob.fired} times, still armed: {knob.armed}"
    assert (faults.drop_after_apply.fired, faults.fail_before.fired, faults.drop_before.fired, faults.delay.fired) == (5, 5, 1, 1)
    log = scenario.log_tail(0, lines=100_000)
    assert "test hook: Python worker dies after prepare" in log
    assert re.search(r"repeating in [0-9.]+s: ClickHouse commit of ", log), "the commit should have been repeated after the faults"
    ledger = scenario.adapter.ledger(DB)
    assert ledger and all(COMMITTED in states for states in ledger.values())
    assert not [label for label in ledger if "_twin_" in label], "a twin that lost its race was committed"
    twin_batch = scenario.batch_state(1)[0]
    assert not any("_twin_" in c.label for c in twin_batch.committables)


@pytest.mark.slow
def test_a_lost_staging_table_is_replayed_by_the_tasks_from_the_rerun_batch(tmp_path, kafka_broker, redis_server, front):
    """A prepared part whose staging table is gone is loaded again from the re-run batch: the tasks digest their
    partitions and the one whose content matches the lost part writes it again, under its writer partition."""
    scenario = _scenario(tmp_path, kafka_broker, redis_server, front)
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    victim = record.committables[0]
    target = scenario.adapter.target(DB)
    try:
        target.client().command(f"DROP TABLE {DB}.`{victim.label}`")  # the prepared part is gone
    finally:
        target.close()
    scenario.run_to_completion()
    scenario.verify()
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    assert record.lost == [victim.label]
    assert any("replayed 1 lost" in event for event in record.events)


# -- one label, two actors, over HTTP (reviews R3 and R7) ------------------------------------------------------

TABLE, ROWS = "orders", 10
TABLE_DDL = f"CREATE TABLE IF NOT EXISTS {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
# commit_mode "insert": the table deduplicates repeated INSERTs and feeds a view that counts and sums it into a table that does too
WINDOW = "SETTINGS non_replicated_deduplication_window = 1000"
VIEW_DDL = (f"CREATE TABLE {DB}.totals (k UInt8, n UInt64, s Int64) ENGINE = SummingMergeTree ORDER BY k {WINDOW}",
            f"CREATE MATERIALIZED VIEW {DB}.totals_mv TO {DB}.totals AS SELECT 0 AS k, count() AS n, sum(id) AS s FROM {DB}.{TABLE}")


class Gate:
    """Runs actors in threads, one target statement at a time, in the order a schedule gives.

    Each actor's target sends its statements through a proxy that waits for the actor's turn; `run`
    hands out turns (one statement each) by actor name, then lets the actors named in `then` run to
    their ends, one after the other. Deterministic: no two statements ever overlap."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._allowed: dict[str, int] = {}
        self._started: dict[str, int] = {}
        self._finished: dict[str, int] = {}
        self._done: set[str] = set()
        self.outcomes: dict[str, Any] = {}

    def target(self, name: str, url: str) -> ClickHouseTarget:
        target = ClickHouseTarget(url, database=DB, retries=0)
        target.ledger.ensure()  # before the gate: the schedules count only the commit's own statements
        real_client = target.connection.client  # every part of the target (ledger, catalog, staging) asks it
        gate = self
        self._allowed[name] = self._started[name] = self._finished[name] = 0

        class Proxy:
            def __init__(self, client: Any) -> None:
                self._client = client

            def __getattr__(self, attr: str) -> Any:
                method = getattr(self._client, attr)
                if attr not in ("command", "query", "insert_arrow"):
                    return method

                def gated(*args: Any, **kwargs: Any) -> Any:
                    with gate._cv:
                        gate._cv.wait_for(lambda: gate._allowed[name] > gate._started[name])
                        gate._started[name] += 1
                    try:
                        return method(*args, **kwargs)
                    finally:
                        with gate._cv:
                            gate._finished[name] += 1
                            gate._cv.notify_all()

                return gated

        target.connection.client = lambda: Proxy(real_client())  # type: ignore[method-assign]
        return target

    def _step(self, name: str) -> None:
        with self._cv:
            if name in self._done:
                return
            self._allowed[name] += 1
            self._cv.notify_all()
            ok = self._cv.wait_for(lambda: self._finished[name] >= self._allowed[name] or name in self._done, timeout=60)
            assert ok, f"actor {name} took no step"

    def run(self, actors: dict[str, Callable[[], Any]], schedule: str, then: str) -> dict[str, Any]:
        with self._cv:  # a fresh round for the same targets
            for name in self._allowed:
                self._allowed[name] = self._started[name] = self._finished[name] = 0
            self._done.clear()
            self.outcomes = {}

        def body(name: str, action: Callable[[], Any]) -> None:
            try:
                self.outcomes[name] = action()
            except Exception as error:  # noqa: BLE001 - the outcome is what the test judges
                self.outcomes[name] = error
            finally:
                with self._cv:
                    self._done.add(name)
                    self._cv.notify_all()

        threads = [threading.Thread(target=body, args=(name, action), daemon=True) for name, action in actors.items()]
        for thread in threads:
            thread.start()
        for name in schedule:
            self._step(name)
        for name in then:
            while name not in self._done:
                self._step(name)
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive()
        return self.outcomes


def _setup(front: ClickHouseFront, commit_mode: str = "move") -> ClickHouseTarget:
    target = ClickHouseTarget(front.url, database=DB, commit_mode=commit_mode)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    target.client().command(TABLE_DDL + (f" {WINDOW}" if commit_mode == "insert" else ""))
    for ddl in VIEW_DDL if commit_mode == "insert" else ():
        target.client().command(ddl)
    target.routable_tables()  # the ledger exists from here
    return target


def _prepare(target: ClickHouseTarget, label_seed: str) -> Committable:
    attempt = "e1w0t0"
    txn = TxnRef("clickhouse", DB, TABLE, make_label("job", "query-1", 7, TABLE, 0, attempt + label_seed), 0, attempt)
    transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    transaction.write(pa.table({"id": pa.array(range(ROWS), pa.int64()), "name": [f"n{i}" for i in range(ROWS)]}))
    [part] = transaction.prepare()
    return part.committable("checksum")


def _visible(target: ClickHouseTarget) -> list[int]:
    return sorted(r[0] for r in target.client().query(f"SELECT id FROM {DB}.{TABLE}").result_rows)


def _truncate(target: ClickHouseTarget) -> None:
    target.client().command(f"TRUNCATE TABLE {DB}.{TABLE}")
    target.client().command(f"TRUNCATE TABLE IF EXISTS {DB}.totals")


def _totals(target: ClickHouseTarget) -> tuple[int, int]:
    """What the view counted and summed: (ROWS, sum of ids) when every row fired it once."""
    n, total = target.client().query(f"SELECT sum(n), sum(s) FROM {DB}.totals").result_rows[0]
    return int(n), int(total)


def _schedules(first: str, second: str, first_steps: int, second_steps: int, cuts: int,
               second_cuts: Iterable[int] | None = None) -> Iterator[tuple[str, str]]:
    """(schedule, then): two cuts: `first` for i statements, `second` for j, then `first` to its end and `second`
    to its end; three cuts: `first` i, `second` j, `first` k, then `second` to its end and `first` to its end.
    Every i and k; every j, or those in `second_cuts`."""
    for i in range(first_steps + 1):
        for j in second_cuts or range(1, second_steps + 1):
            if cuts == 2:
                yield first * i + second * j, first + second
            else:
                for k in range(1, first_steps - i + 1):
                    yield first * i + second * j + first * k, second + first


def _count_statements(front: ClickHouseFront, action: Callable[[], Any]) -> int:
    """How many statements `action` sends (its arguments prepared beforehand)."""
    before = len(front.statements)
    action()
    return len(front.statements) - before


def test_two_commits_of_one_label_interleaved_anywhere_move_every_row_once(front):
    """R3: a fenced driver and its successor commit the same label at once. MOVE PARTITION moves a part
    or nothing, so the two can split the moves between them but never move a row twice; whichever ends
    first writes the committed row before dropping staging, so the other, finding staging gone, answers
    COMMITTED from the ledger. B cut in after its first statement, half way through and whole, in every gap of A."""
    setup = _setup(front)
    counted = _prepare(setup, "count")
    steps = _count_statements(front, lambda: setup.commit(counted))
    _truncate(setup)
    # B after its first statement, half way, and whole, in every gap of A (the two run the same code)
    schedules = list(_schedules("A", "B", steps, steps, cuts=2, second_cuts=sorted({1, steps // 2, steps})))
    assert len(schedules) > 30
    gate = Gate()
    a, b = gate.target("A", front.url), gate.target("B", front.url)
    for n, (schedule, then) in enumerate(schedules):
        committable = _prepare(setup, f"cc{n}")
        outcomes = gate.run({"A": lambda c=committable: a.commit(c), "B": lambda c=committable: b.commit(c)}, schedule, then)
        assert outcomes == {"A": CommitOutcome.COMMITTED, "B": CommitOutcome.COMMITTED}, (schedule, outcomes)
        assert _visible(setup) == list(range(ROWS)), (schedule, _visible(setup))
        assert setup.staging_tables() == [] and setup.ledger.states(committable.label) >= {COMMITTED}, schedule
        _truncate(setup)
    for target in (a, b, setup):
        target.close()


def test_a_commit_and_an_abort_of_one_label_never_lose_or_duplicate_silently(front):
    """R3: a fenced driver (or an operator) aborts a label while the driver commits it. At every split of
    the two (the abort's two statements anywhere in the commit's, and the commit inside the abort's gap):
    COMMITTED means every row is visible once, ABORTED means none is, and when the abort dropped staging
    between two moves the commit stops with CommitAmbiguousError (never LOST, never COMMITTED), as does
    any later repeat of it. An abort that finds the commit journaled is refused."""
    setup = _setup(front)
    counted = _prepare(setup, "count")
    commit_steps = _count_statements(front, lambda: setup.commit(counted))
    _truncate(setup)
    probe = _prepare(setup, "abort-count")
    abort_steps = _count_statements(front, lambda: setup.abort(TxnRef("clickhouse", DB, TABLE, probe.label, 0, "e1w0t0")))
    schedules = list(_schedules("C", "X", commit_steps, abort_steps, cuts=3)) + list(
        _schedules("X", "C", abort_steps, commit_steps, cuts=2))
    seen: dict[str, int] = {}
    gate = Gate()
    c, x = gate.target("C", front.url), gate.target("X", front.url)
    for n, (schedule, then) in enumerate(schedules):
        committable = _prepare(setup, f"ca{n}")
        ref = TxnRef("clickhouse", DB, TABLE, committable.label, 0, committable.attempt)
        outcomes = gate.run({"C": lambda k=committable: c.commit(k), "X": lambda r=ref: x.abort(r)}, schedule, then)
        visible = _visible(setup)
        committed, aborted = outcomes["C"], outcomes["X"]
        if committed is CommitOutcome.COMMITTED:
            assert visible == list(range(ROWS)), (schedule, outcomes, visible)
            assert aborted is None or isinstance(aborted, CommittedNotChosenError), (schedule, outcomes)
            seen["committed"] = seen.get("committed", 0) + 1
        elif committed is CommitOutcome.ABORTED:
            assert visible == [] and aborted is None, (schedule, outcomes, visible)
            seen["aborted"] = seen.get("aborted", 0) + 1
        else:
            assert isinstance(committed, CommitAmbiguousError), (schedule, outcomes)
            with pytest.raises(CommitAmbiguousError):  # a repeat stops too: never LOST, never a replay
                setup.commit(committable)
            seen["ambiguous"] = seen.get("ambiguous", 0) + 1
        assert len(set(visible)) == len(visible), (schedule, visible)
        _truncate(setup)
    assert seen.get("committed") and seen.get("aborted") and seen.get("ambiguous"), seen
    for target in (c, x, setup):
        target.close()


def test_a_losing_writer_of_the_same_label_never_drops_the_winners_staging_over_http(front):
    """R7: two task attempts with one label (attempt numbers repeat across stage attempts): the loser's
    CREATE fails, and its abort must leave the winner's staging table and rows alone."""
    setup = _setup(front)
    txn = TxnRef("clickhouse", DB, TABLE, make_label("job", "query-1", 7, TABLE, 0, "e1w0t0"), 0, "e1w0t0")
    winner_target, loser_target = ClickHouseTarget(front.url, database=DB), ClickHouseTarget(front.url, database=DB)
    winner = winner_target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    loser = loser_target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    chunk = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]})
    winner.write(chunk)
    with pytest.raises(Exception, match="already exists"):
        loser.write(chunk)
    loser.abort()
    assert setup.staging_tables() == [txn.label]
    [part] = winner.prepare()
    assert part.rows == 2 and setup.commit(part.committable("checksum")) is CommitOutcome.COMMITTED
    assert _visible(setup) == [1, 2]
    for target in (setup, winner_target, loser_target):
        target.close()


# CI repeats the move commit; the insert commit's repeats (the same statement retries, another journal) are extended
@pytest.mark.parametrize("commit_mode", ["move", pytest.param("insert", marks=[pytest.mark.slow, pytest.mark.extended])])
def test_a_commit_repeats_after_each_server_fault_and_lands_every_row_once(front, commit_mode):
    """Each fault knob on each statement of a commit (answers held past the client's timeout: on the statements
    that change something): the commit repeats itself and ends COMMITTED, exact. The error answer is a 500, which
    the client never repeats itself (it does a 503 to a read), so the target's own repeat meets every statement.
    In commit_mode "insert" that includes an INSERT … SELECT applied and its answer lost, then sent again: the view
    counts every row once. Each commit is a target's first (as a driver's after a restart), which sends every
    statement the count saw."""
    setup = _setup(front, commit_mode)
    counted = _prepare(setup, "count")
    before = len(front.statements)
    setup.commit(counted)
    statements = front.statements[before:]
    _truncate(setup)
    knobs = (("drop_after_apply", {}), ("fail_before", {"status": 500, "code": 241, "name": "MEMORY_LIMIT_EXCEEDED"}),
             ("drop_before", {}), ("delay", {"seconds": 30}))
    for n, statement in enumerate(statements):
        for knob, params in knobs if not statement.startswith("SELECT") else knobs[:3]:  # held answers: on writes
            committable = _prepare(setup, f"fault{n}{knob}")
            text = statement.replace(_LABEL_IN_COUNT, committable.label)
            getattr(front.faults, knob).arm(lambda sql, text=text: sql == text, times=1, **params)
            target = ClickHouseTarget(front.url, database=DB, commit_mode=commit_mode, read_timeout_s=1, retries=10,
                                      backoff_s=0.01, backoff_max_s=0.05)
            try:
                assert target.commit(committable) is CommitOutcome.COMMITTED, (knob, text)
            finally:
                front.faults.release()
                target.close()
            assert getattr(front.faults, knob).fired == 1, (knob, text)
            assert _visible(setup) == list(range(ROWS)) and setup.staging_tables() == [], (knob, text)
            assert commit_mode == "move" or _totals(setup) == (ROWS, sum(range(ROWS))), (knob, text, _totals(setup))
            front.faults.reset()
            _truncate(setup)
    setup.close()


def test_a_server_error_while_insert_mode_checks_a_table_is_repeated_never_taken_for_a_refusal(front):
    """Before a label's first INSERT, commit_mode "insert" checks the table again, one check being a query that sorts
    its rows. An error answer to that query from a failing server (the client repeats no 500) says nothing about
    the table: the commit repeats itself and lands, exact, instead of refusing the table as unsortable."""
    setup = _setup(front, "insert")
    committable = _prepare(setup, "probe")
    front.faults.fail_before.arm(r"ORDER BY `id`, `name` LIMIT 0", times=1, status=500, code=241, name="MEMORY_LIMIT_EXCEEDED")
    target = ClickHouseTarget(front.url, database=DB, commit_mode="insert", backoff_s=0.01)
    try:
        assert target.commit(committable) is CommitOutcome.COMMITTED
    finally:
        target.close()
    assert front.faults.fail_before.fired == 1
    assert _visible(setup) == list(range(ROWS)) and _totals(setup) == (ROWS, sum(range(ROWS)))
    setup.close()


_LABEL_IN_COUNT = make_label("job", "query-1", 7, TABLE, 0, "e1w0t0count")
