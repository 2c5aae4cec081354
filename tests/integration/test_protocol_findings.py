"""The review's protocol findings (R1, R2, R4, R5, R6), each reproduced on the real coordinator.

No Spark: the writers are the real `PartitionWriter`s run over in-memory Arrow batches, the target
is the StarRocks emulator over real HTTP, and a crash is a `BaseException` raised at a chosen call.
Each test failed on the code before its fix (see the notes of issue 9).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.actions import abort_batch
from streaming_sink.committable import TxnRef
from streaming_sink.committer import Committer
from streaming_sink.errors import OperatorActionRefused, ReplayAmbiguousError
from streaming_sink.records import BatchState
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import BatchRecord, FencedError, MemoryStateStore, StateStoreLostError
from streaming_sink.targets.starrocks import StarRocksTarget
from streaming_sink.writer import PartitionWriter
from tests.support.batches import InMemoryRunner
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.doubles.recording import RecordingTarget
from tests.support.targets.starrocks import starrocks_target

DB, TABLE, JOB, QUERY = "db", "t", "job", "query-1"
ROWS_PER_PARTITION = 100


class Crash(BaseException):
    """kill -9 of the driver, as seen by the code that was running."""


def target_of(sr: StarRocksEmulator) -> StarRocksTarget:
    """Commits one at a time, so a crash after the first commit leaves exactly one visible (`sr`: tests/support/fixtures.py)."""
    return starrocks_target(sr, commit_parallelism=1)


def source(batch_id: int, partitions: int = 2) -> list[list[pa.RecordBatch]]:
    """The rows Spark delivers for a batch: the same on every re-run."""
    base = batch_id * 10_000
    return [
        [pa.record_batch({"id": [base + p * 1000 + i for i in range(ROWS_PER_PARTITION)],
                          "name": [f"n{i}" for i in range(ROWS_PER_PARTITION)]})]
        for p in range(partitions)
    ]


def sink_of(target: Any, store: Any, **options: Any) -> ExactlyOnceSink:
    return ExactlyOnceSink(target, store, JOB, table=TABLE, runner=InMemoryRunner(), **options)


class CrashingStore:
    """Delegates to a store, and dies on the n-th call of one method (before or after it applies)."""

    def __init__(self, store: Any, method: str, on_call: int = 1, after: bool = False) -> None:
        self._store, self._method, self._left, self._after = store, method, on_call, after

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name != self._method:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._left -= 1
            if self._left == 0 and not self._after:
                raise Crash(f"before {name}")
            result = attribute(*args, **kwargs)
            if self._left == 0:
                raise Crash(f"after {name}")
            return result

        return call


def ids(sr: StarRocksEmulator) -> list[int]:
    return sorted(row[0] for row in sr.visible_rows(DB, TABLE))


def expected_ids(*batches: int) -> list[int]:
    return sorted(row for b in batches for part in source(b) for batch in part for row in batch.column("id").to_pylist())


# -- R1: a forgotten label whose commit was sent is never replayed ------------------------------


def test_a_committed_label_forgotten_by_the_server_stops_the_job_instead_of_duplicating(sr) -> None:
    store = MemoryStateStore()
    # the commit of the first transaction lands, then the driver dies before it records that
    crashing = CrashingStore(store, "mark_done_many")
    with pytest.raises(Crash):
        sink_of(target_of(sr), crashing).process(source(0), 0, QUERY)
    assert len(ids(sr)) == ROWS_PER_PARTITION  # one of two transactions is visible
    sr.clock.advance(3 * 86400 + 60)  # down longer than StarRocks remembers finished labels
    with pytest.raises(ReplayAmbiguousError, match="runbook.md, section 'Replay ambiguous"):
        sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    assert len(ids(sr)) == ROWS_PER_PARTITION and len(set(ids(sr))) == ROWS_PER_PARTITION  # nothing loaded twice
    assert store.get_batch(JOB, QUERY, 0).state is BatchState.PREPARED  # left for the operator to settle


def test_a_prepared_transaction_that_expired_before_any_commit_was_sent_is_replayed_exactly(sr) -> None:
    store = MemoryStateStore()
    with pytest.raises(Crash):  # killed right after the commit point: no commit was ever sent
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2)).process(source(0), 0, QUERY)
    assert store.get_batch(JOB, QUERY, 0).sent == []
    sr.clock.advance(3 * 86400 + 60)  # the prepared transactions expired (aborted by the server), then forgotten
    report = sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    assert report.action == "recovered-prepared" and report.replayed == 2
    assert ids(sr) == expected_ids(0)


def test_a_doris_label_evicted_by_newer_loads_stops_the_job_instead_of_duplicating(tmp_path) -> None:
    """Doris forgets finished labels past label_num_threshold (2000 per database) within minutes on a
    busy database, long before its 12 h: the same loud stop, no clock needed."""
    from streaming_sink.targets.doris import DorisTarget
    from tests.integration.test_doris_target import COLUMNS, other_jobs_finish_loads
    from tests.support.doubles.emulators.doris import DorisEmulator

    with DorisEmulator(tmp_path / "doris") as doris:
        doris.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(32)")])
        doris.create_table(DB, "payments", COLUMNS)

        def target() -> DorisTarget:
            return DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.01, commit_parallelism=1)

        store = MemoryStateStore()
        with pytest.raises(Crash):
            sink_of(target(), CrashingStore(store, "mark_done_many")).process(source(0), 0, QUERY)
        visible = sorted(r[0] for r in doris.visible_rows(DB, TABLE))
        assert len(visible) == ROWS_PER_PARTITION
        other_jobs_finish_loads(doris, 2000)  # other writers of the shared database
        with pytest.raises(ReplayAmbiguousError):
            sink_of(target(), store).process(source(0), 0, QUERY)
        # the other partition's transaction was still alive and is now committed; nothing was loaded twice
        assert sorted(r[0] for r in doris.visible_rows(DB, TABLE)) == expected_ids(0)


# -- R2: a state store that lost or rolled back its journal is detected -------------------------


def test_a_wiped_store_stops_the_rerun_of_a_committed_batch(sr) -> None:
    store = MemoryStateStore()
    sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    sink_of(target_of(sr), store).process(source(1), 1, QUERY)  # COMMITTED; Spark's commits/1 not yet written
    store.wipe()  # Redis restarted without AOF
    with pytest.raises(StateStoreLostError, match="no record of batch 0"):
        sink_of(target_of(sr), store).process(source(1), 1, QUERY)
    assert ids(sr) == expected_ids(0, 1)  # not written again


def test_a_store_rolled_back_to_an_older_backup_is_detected(sr) -> None:
    store = MemoryStateStore()
    sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    backup = store.snapshot()
    sink_of(target_of(sr), store).process(source(1), 1, QUERY)
    sink_of(target_of(sr), store).process(source(2), 2, QUERY)
    store.restore(backup)  # batches 1 and 2 forgotten; Spark re-runs 2
    with pytest.raises(StateStoreLostError, match="no record of batch 1"):
        sink_of(target_of(sr), store).process(source(2), 2, QUERY)
    assert ids(sr) == expected_ids(0, 1, 2)


def test_epochs_never_go_back_after_a_wipe_when_the_checkpoint_keeps_the_mark(sr, tmp_path) -> None:
    store = MemoryStateStore()
    first = sink_of(target_of(sr), store, checkpoint_location=str(tmp_path / "ckpt"))
    first.start()
    assert (tmp_path / "ckpt" / "streaming-sink" / f"{JOB}.json").exists()
    store.wipe()
    second = sink_of(target_of(sr), store, checkpoint_location=str(tmp_path / "ckpt"), accept_empty_state=True)
    second.start()
    assert second.epoch > first.epoch
    with pytest.raises(FencedError):  # the zombie stays fenced
        first.process(source(0), 0, QUERY)


def test_a_failover_that_lost_the_prepared_record_of_the_batch_in_flight_is_detected(sr, tmp_path) -> None:
    """A replica that missed the last writes: batch 1's PREPARED record and progress are gone, batch 0's kept.
    There is no gap before batch 1, but the checkpoint knows batch 1 reached its commit point."""
    store = MemoryStateStore()
    ckpt = str(tmp_path / "ckpt")
    sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(0), 0, QUERY)
    replica = store.snapshot()  # the replica is in sync up to here
    with pytest.raises(Crash):  # one of batch 1's commits lands, then the primary dies
        sink_of(target_of(sr), CrashingStore(store, "mark_done_many"), checkpoint_location=ckpt).process(source(1), 1, QUERY)
    store.restore(replica)  # failover
    with pytest.raises(StateStoreLostError, match="batch 1 of query query-1 was PREPARED"):
        sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(1), 1, QUERY)
    assert len(ids(sr)) == len(set(ids(sr)))  # nothing loaded twice


def test_a_store_that_lost_a_batch_before_its_commit_point_writes_it_again_safely(sr, tmp_path) -> None:
    store = MemoryStateStore()
    ckpt = str(tmp_path / "ckpt")
    sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(0), 0, QUERY)
    replica = store.snapshot()
    with pytest.raises(Crash):  # dies before batch 1's PREPARED record: no commit was ever sent
        sink_of(target_of(sr), CrashingStore(store, "put_batch"), checkpoint_location=ckpt).process(source(1), 1, QUERY)
    store.restore(replica)
    sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(1), 1, QUERY)
    assert ids(sr) == expected_ids(0, 1)


def test_accept_empty_state_starts_a_deliberately_fresh_store_but_not_a_partly_rolled_back_one(sr) -> None:
    store = MemoryStateStore()
    with pytest.raises(Crash):  # a first attempt dies after its writers began: intents of batch 4 only
        sink_of(target_of(sr), CrashingStore(store, "put_batch"), accept_empty_state=True).process(source(4), 4, QUERY)
    assert sink_of(target_of(sr), store, accept_empty_state=True).process(source(4), 4, QUERY).action == "written"
    assert ids(sr) == expected_ids(4)
    with pytest.raises(StateStoreLostError):  # the store is not empty any more: a gap is a loss
        sink_of(target_of(sr), store, accept_empty_state=True).process(source(9), 9, QUERY)


# -- R4: fencing covers target actions --------------------------------------------------------


def test_a_fenced_driver_aborts_nothing_of_the_newer_driver() -> None:
    store, target = MemoryStateStore(), RecordingTarget()
    old = Committer(target, store, JOB, store.take_epoch(JOB, "a"))
    new = Committer(target, store, JOB, store.take_epoch(JOB, "b"))
    for i in range(3):
        store.add_intent(JOB, new.epoch, QUERY, 0, TxnRef("recording", DB, TABLE, f"B-{i}", i, f"e{new.epoch}w0t{i}"))
    with pytest.raises(FencedError):
        old.abort_intents(QUERY, 0)
    assert target.calls == []


@pytest.mark.parametrize("fenced", ["during the first commit", "after the first commit was recorded"])
def test_a_driver_fenced_during_its_commits_stops_sending_them(fenced: str) -> None:
    """During: the first commit's progress write is refused, the pool stops. After: that write went
    through, so only the epoch check before each commit keeps the second one from being sent."""
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "a")
    take_over = lambda: store.take_epoch(JOB, "b")  # noqa: E731
    target = RecordingTarget(
        on_commit=lambda: take_over() if fenced == "during the first commit" and len(target.calls) == 1 else None
    )
    target.commit_parallelism = 1
    from streaming_sink.committable import Committable

    committables = [Committable("recording", DB, TABLE, f"L{i}", i, f"e{epoch}w0t{i}", rows=1) for i in range(6)]
    record = BatchRecord(QUERY, 0, BatchState.PREPARED, epoch, committables)
    store.put_batch(JOB, epoch, record)
    after_recorded = take_over if fenced == "after the first commit was recorded" else None
    with pytest.raises(FencedError):
        committer = Committer(target, store, JOB, epoch)
        committer.commit_pending(committer.log_of(record), on_commit=after_recorded)
    assert target.calls == [("commit", "L0")]  # the newer driver took over before any second commit


# -- R5: the operator's abort re-reads the record under its own epoch --------------------------


def test_operator_abort_refuses_a_batch_that_became_prepared_meanwhile() -> None:
    store, target = MemoryStateStore(), RecordingTarget()
    driver = store.take_epoch(JOB, "driver")
    ref = TxnRef("recording", DB, TABLE, "L0", 0, f"e{driver}w0t1")
    store.add_intent(JOB, driver, QUERY, 3, ref)
    assert store.get_batch(JOB, QUERY, 3) is None  # what the CLI saw before taking over...
    from streaming_sink.committable import Committable

    prepared = Committable("recording", DB, TABLE, "L0", 0, ref.attempt, rows=1)
    store.put_batch(JOB, driver, BatchRecord(QUERY, 3, BatchState.PREPARED, driver, [prepared]))  # ...then this
    operator = Committer(target, store, JOB, store.take_epoch(JOB, "operator"))
    with pytest.raises(OperatorActionRefused, match="PREPARED"):
        abort_batch(operator, QUERY, 3)
    assert target.calls == []


# -- R6: a writer that begins after the driver's final abort leaves nothing behind ---------------


def test_a_late_twin_that_begins_after_the_final_abort_aborts_itself(sr) -> None:
    """The twin records its intent before the decision, and its begin reaches the server after the
    driver committed the batch and aborted the (not yet begun) intent."""
    import threading

    store = MemoryStateStore()
    recorded, driver_done = threading.Event(), threading.Event()
    outcome: dict[str, BaseException] = {}

    class PausingStore:
        """The twin's view of the store: it stops right after recording its intent."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def add_intent(self, *args: Any) -> None:
            store.add_intent(*args)
            recorded.set()
            assert driver_done.wait(30)

    class TwinRunner(InMemoryRunner):
        def run(self, data, target, router, context, store_):
            results = super().run(data, target, router, context, store_)
            twin = PartitionWriter(context, target, router, PausingStore(), 0, 999)

            def go() -> None:
                try:
                    twin.add_all(data[0])
                except BaseException as error:  # what the twin task would die of
                    outcome["error"] = error

            self.thread = threading.Thread(target=go)
            self.thread.start()
            assert recorded.wait(30)
            return results

    runner = TwinRunner()
    sink = ExactlyOnceSink(target_of(sr), store, JOB, table=TABLE, runner=runner)
    assert sink.process(source(0), 0, QUERY).action == "written"
    driver_done.set()
    runner.thread.join(30)
    assert "closed to attempt" in str(outcome.get("error")), outcome
    open_txns = [t["label"] for t in sr.transactions(DB) if t["state"] not in ("VISIBLE", "ABORTED")]
    assert open_txns == []
    assert ids(sr) == expected_ids(0)


def test_the_operator_settles_an_ambiguous_label_and_the_job_resumes_exactly(sr) -> None:
    """After ReplayAmbiguousError: the operator counted the rows, records the verdict, restarts."""
    from streaming_sink.actions import settle_label

    store = MemoryStateStore()
    with pytest.raises(Crash):
        sink_of(target_of(sr), CrashingStore(store, "mark_done_many")).process(source(0), 0, QUERY)
    sr.clock.advance(3 * 86400 + 60)
    with pytest.raises(ReplayAmbiguousError) as stopped:
        sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    record = store.get_batch(JOB, QUERY, 0)
    forgotten = [c.label for c in record.committables if c.label in str(stopped.value)]
    assert len(forgotten) == 1  # the one whose commit landed; its twin was never sent and expired
    operator = Committer(target_of(sr), store, JOB, store.take_epoch(JOB, "operator"))
    settle_label(operator, QUERY, 0, forgotten[0], committed=True)  # its 100 rows are in the table
    assert sink_of(target_of(sr), store).process(source(0), 0, QUERY).action == "recovered-prepared"
    assert ids(sr) == expected_ids(0)


# -- O3: a file store the executors cannot share ------------------------------------------------


def test_a_file_store_with_writers_on_a_cluster_is_refused_before_any_data_moves(sr, tmp_path) -> None:
    from streaming_sink.state import FileStateStore
    from streaming_sink.targets.base import ConfigurationError

    sink = ExactlyOnceSink(target_of(sr), FileStateStore(tmp_path / "state"), JOB, table=TABLE, runner=InMemoryRunner())
    sink._check_store_reaches_writers("local[2]")  # one machine: the tasks see the same directory
    with pytest.raises(ConfigurationError, match="local to this machine.*use a Redis state store"):
        sink._check_store_reaches_writers("spark://10.0.0.5:7077")


# -- O2: state does not grow with checkpoint changes ---------------------------------------------


def test_older_checkpoints_keep_only_their_newest_record_and_none_once_stale() -> None:
    from streaming_sink.committable import Committable
    from streaming_sink.committer import STALE_QUERY_SECONDS

    store, target = MemoryStateStore(), RecordingTarget()
    recovery = Committer(target, store, JOB, store.take_epoch(JOB, "driver"))
    for query in ("old-a", "old-b", QUERY):
        for batch in range(5):
            done = Committable("recording", DB, TABLE, f"{query}-{batch}", 0, f"e{recovery.epoch}w0t1", rows=1)
            store.put_batch(JOB, recovery.epoch, BatchRecord(query, batch, BatchState.COMMITTED, recovery.epoch, [done],
                                                             created_at=1000.0 if query == "old-a" else 10**10))
    recovery.sweep(skip=(QUERY, 5), retain_batches=3, now=1000.0 + STALE_QUERY_SECONDS + 1)
    assert set(store.batch_keys(JOB)) == {("old-b", 4)} | {(QUERY, b) for b in (2, 3, 4)}
    assert target.calls == []  # clean COMMITTED records: nothing to abort
