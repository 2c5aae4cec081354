"""Issue 26's done-when: a batch far wider than the server's transaction limits commits in waves, exactly once,
through driver kills inside the waves.

300 tables x 4 writers (1,200 transactions, a few rows a table) into each emulator at its release defaults:
StarRocks 3.x (1,000 running transactions, label_keep_max_num 1,000: waves of 500) and Doris 2.1 (100 running:
waves of 50). The real `ExactlyOnceSink` and `PartitionWriter`s over in-memory Arrow batches, no Spark (the runner
keeps rows in their partition, so the sink plans with `spread="never"`). The driver is killed at the named crash
points of the wave loop, in the middle of a wave's commits and in the middle of a later wave's write; each kill is
followed by a restart on the same journal, and the last run must leave every table equal to the source row by row,
no transaction open, no intent left.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink import batch_log as batch_log_module
from streaming_sink import committer as committer_module
from streaming_sink import sink as sink_module
from streaming_sink.crash import WAVE_POINTS
from streaming_sink.labels import partition_wave
from streaming_sink.records import BatchState
from streaming_sink.sink import BatchReport, ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import Target
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.batches import InMemoryRunner
from tests.support.doubles.emulators.base_emulator import BaseEmulator
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

pytestmark = pytest.mark.slow

DB, JOB, QUERY = "db", "waves", "query-1"
TABLES = [f"t{n:03d}" for n in range(300)]
WRITERS = 4
OPEN_STATES = {"PREPARE", "PREPARED", "PRECOMMITTED", "COMMITTED"}  # begun, or committed and not yet visible


def source() -> list[list[pa.RecordBatch]]:
    """Every writer holds one row of every table: 1,200 (table, writer) transactions, 4 rows a table."""
    return [[pa.record_batch({"__table": TABLES, "id": [w * 1000 + n for n in range(len(TABLES))],
                              "name": [f"w{w}"] * len(TABLES)})] for w in range(WRITERS)]


def expected(table: int) -> list[tuple[Any, ...]]:
    return [(w * 1000 + table, f"w{w}") for w in range(WRITERS)]


class Killed(BaseException):
    """The driver process is gone: nothing below it runs any more."""


class KilledDriver:
    """One driver run that dies at the `at`-th time it reaches crash point `point` (or records its `at`-th intent,
    point "intent"): from then on its journal is out of reach, as a killed process's would be."""

    def __init__(self, store: MemoryStateStore, point: str | None, at: int) -> None:
        self._store, self._point, self._left = store, point, at
        self.dead = False

    def reached(self, name: str) -> None:
        if self.dead:
            raise Killed("already dead")
        if name == self._point:
            self._left -= 1
            if self._left == 0:
                self.dead = True
                raise Killed(name)

    def crash_point(self, name: str, batch_id: int) -> None:
        self.reached(name)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.reached("intent" if name == "add_intent" else "")
            return method(*args, **kwargs)

        return call


def run_driver(target: Target, store: MemoryStateStore, point: str | None, at: int,
               monkeypatch: pytest.MonkeyPatch) -> BaseException | BatchReport:
    driver = KilledDriver(store, point, at)
    with monkeypatch.context() as patch:
        for module in (sink_module, committer_module, batch_log_module):
            patch.setattr(module, "crash_point", driver.crash_point)
        sink = ExactlyOnceSink(target, driver, JOB, table_column="__table",  # type: ignore[arg-type]
                               runner=InMemoryRunner(), spread="never", heartbeat_seconds=None)
        try:
            return sink.process(source(), 0, QUERY)
        except Killed as killed:
            return killed


def with_tables(emu: BaseEmulator) -> BaseEmulator:
    for table in TABLES:
        emu.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
    return emu


@pytest.fixture
def starrocks(tmp_path: Path) -> Iterator[StarRocksEmulator]:
    with StarRocksEmulator(tmp_path / "sr") as emu:  # 3.x defaults: 1000 running, label_keep_max_num 1000
        yield with_tables(emu)  # type: ignore[misc]


@pytest.fixture
def doris(tmp_path: Path) -> Iterator[DorisEmulator]:
    # a Doris FE that does not tell its release to the loading user (not ADMIN), set to the least default, 100
    with DorisEmulator(tmp_path / "doris", max_running_txn_num_per_db=100, user_is_admin=False) as emu:
        yield with_tables(emu)  # type: ignore[misc]


# Each run is killed once, and the next run starts from what the kill left: wave 1 recorded and none of it committed;
# then killed amid wave 1's commits; then between waves (wave 1 committed, wave 2 not begun); then amid wave 2's write.
KILLS = [("after-wave-prepared", 1), ("after-first-commit", 1), ("between-waves", 1), ("intent", 40)]
assert set(WAVE_POINTS) < {point for point, _ in KILLS}


def assert_exact(emu: BaseEmulator, store: MemoryStateStore) -> None:
    for n, table in enumerate(TABLES):
        assert sorted(emu.visible_rows(DB, table)) == expected(n), table
    assert not [t for t in emu.transactions(DB) if t["state"] in OPEN_STATES], "a transaction was left open"
    assert store.intents(JOB, QUERY, 0) == []


def killed_in_waves_then_exact(emu: BaseEmulator, new_target: Callable[[], Target], waves: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streaming_sink.retry.sleep", lambda _seconds: None)
    store = MemoryStateStore()
    for point, at in KILLS:
        outcome = run_driver(new_target(), store, point, at, monkeypatch)
        assert isinstance(outcome, Killed), f"the driver was not killed at {point}: {outcome}"
        record = store.get_batch(JOB, QUERY, 0)
        assert record is not None and record.state is BatchState.PREPARED, point
        assert record.plan is not None and len(record.plan.waves) == waves
    report = run_driver(new_target(), store, None, 0, monkeypatch)
    assert isinstance(report, BatchReport) and report.action == "recovered-prepared", report
    assert (report.waves, report.transactions, report.rows) == (waves, len(TABLES) * WRITERS, len(TABLES) * WRITERS)
    record = store.get_batch(JOB, QUERY, 0)
    assert record is not None and record.state is BatchState.COMMITTED
    assert record.plan is not None and record.waves_prepared == waves
    per_wave: dict[int, int] = {}
    for c in record.live_committables():
        per_wave[partition_wave(c.partition)] = per_wave.get(partition_wave(c.partition), 0) + 1
    assert max(per_wave.values()) <= record.plan.budget  # type: ignore[operator]
    assert_exact(emu, store)


def test_300_tables_by_4_writers_into_starrocks_commit_in_waves_through_driver_kills(
        starrocks: StarRocksEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,200 transactions against 1,000 running and 1,000 remembered labels: 3 waves of at most 500."""
    killed_in_waves_then_exact(starrocks, lambda: StarRocksTarget(starrocks.fe_url, DB, "root", "", backoff_s=0.0,
                                                                  backoff_max_s=0.0), 3, monkeypatch)


@pytest.mark.extended  # CI: the StarRocks run above, and Doris' own waves in test_transaction_limits.py
def test_300_tables_by_4_writers_into_doris_2_1_commit_in_waves_through_driver_kills(
        doris: DorisEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,200 transactions against a Doris FE at 100 running that does not tell its release (the least default):
    25 waves of 12 tables (48 transactions)."""
    killed_in_waves_then_exact(doris, lambda: DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.0), 25,
                               monkeypatch)


def test_a_wave_the_server_rolled_back_is_replayed_alone_from_the_re_run_batch(
        starrocks: StarRocksEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver dies with wave 1 recorded and uncommitted, and stays down past StarRocks' prepared timeout: the
    server rolls wave 1 back. The restart reloads wave 1's tables only, proved by the partitions' checksums, and
    goes on with wave 2."""
    monkeypatch.setattr("streaming_sink.retry.sleep", lambda _seconds: None)
    store = MemoryStateStore()

    def target() -> Target:
        return StarRocksTarget(starrocks.fe_url, DB, "root", "", backoff_s=0.0, backoff_max_s=0.0)

    assert isinstance(run_driver(target(), store, "after-wave-prepared", 1, monkeypatch), Killed)
    prepared = store.get_batch(JOB, QUERY, 0)
    assert prepared is not None and prepared.plan is not None
    wave_1 = {c.label for c in prepared.committables if partition_wave(c.partition) == 1}
    starrocks.clock.advance(86400 + 60)  # prepared_transaction_default_timeout_second
    report = run_driver(target(), store, None, 0, monkeypatch)
    assert isinstance(report, BatchReport) and report.action == "recovered-prepared", report
    record = store.get_batch(JOB, QUERY, 0)
    assert record is not None and record.state is BatchState.COMMITTED
    assert set(record.lost) == wave_1
    first_pass = {c.label for c in prepared.committables}
    replayed = [c for c in record.committables if partition_wave(c.partition) == 1 and c.label not in first_pass]
    assert {c.table for c in replayed} == set(prepared.plan.waves[1])
    assert len(replayed) == len(wave_1)
    assert_exact(starrocks, store)


def test_an_older_querys_batch_killed_between_waves_is_given_up_naming_the_tables_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`settle --accept-loss` on a batch of an older query whose driver died between waves: what the operator must
    re-ingest is the given-up labels' tables *and* every table of the waves never written, so both are named (in the
    dry run, in the applied verdict and in the record's event), or those tables' rows would be lost unnoticed."""
    import json

    from streaming_sink.cli import main
    from streaming_sink.state import FileStateStore

    monkeypatch.setattr("streaming_sink.retry.sleep", lambda _seconds: None)
    tables = TABLES[:30]  # 120 transactions against a Doris FE at 100 running that does not tell its release: 3 waves
    with DorisEmulator(tmp_path / "doris", max_running_txn_num_per_db=100, user_is_admin=False) as doris:
        for table in tables:
            doris.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
        store = FileStateStore(tmp_path / "state")
        batches = [[pa.record_batch({"__table": tables, "id": [w * 1000 + n for n in range(len(tables))],
                                     "name": [f"w{w}"] * len(tables)})] for w in range(WRITERS)]
        driver = KilledDriver(store, "between-waves", 1)  # type: ignore[arg-type]
        with monkeypatch.context() as patch:
            for module in (sink_module, committer_module, batch_log_module):
                patch.setattr(module, "crash_point", driver.crash_point)
            sink = ExactlyOnceSink(DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.0), driver, JOB,  # type: ignore[arg-type]
                                   table_column="__table", runner=InMemoryRunner(), spread="never", heartbeat_seconds=None)
            with pytest.raises(Killed):
                sink.process(batches, 0, "q-old")
        record = store.get_batch(JOB, "q-old", 0)
        assert record is not None and record.plan is not None and record.next_wave == 1
        never_written = [t for wave in record.plan.waves[1:] for t in wave]
        assert never_written

        checkpoint = tmp_path / "new-checkpoint"  # a new query, which never re-runs q-old's batch
        checkpoint.mkdir()
        (checkpoint / "metadata").write_text(json.dumps({"id": "q-new"}))
        monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "root")
        monkeypatch.setenv("STREAMING_SINK_TARGET_PASSWORD", "")
        command = ["settle", "--job", JOB, "--state", f"file://{tmp_path / 'state'}", "--target",
                   doris.fe_url.replace("http://", "doris://"), "--database", DB, "--query-id", "q-old", "--batch", "0",
                   "--accept-loss", "--checkpoint", str(checkpoint)]
        assert main(command) == 0, capsys.readouterr().err
        dry = capsys.readouterr().out
        assert f"{len(never_written)} table(s) never written" in dry and never_written[0] in dry, dry
        # --force: the killed driver is this test's own process, alive to the command's liveness check
        assert main([*command, "--apply", "--force"]) == 0, capsys.readouterr().err
        said = capsys.readouterr().out
        assert f"{len(never_written)} table(s) never written" in said and all(t in said for t in never_written), said
        closed = store.get_batch(JOB, "q-old", 0)
        assert closed is not None and closed.state is BatchState.COMMITTED
        assert all(t in closed.events[-1] for t in never_written), closed.events[-1]
        for n, table in enumerate(tables):  # wave 0 is committed; the other waves' tables hold nothing
            rows = sorted(doris.visible_rows(DB, table))
            assert rows == ([] if table in never_written else expected(n)), table
