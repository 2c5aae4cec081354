"""Each recovery decision against the real ClickHouse engine (chdb): committed, prepared, intents only, lost.

And the operator's commands (recover, abort, settle) refuse a target other than the one the journal
recorded, on the in-memory store with a recording fake target.
"""
from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from streaming_sink.actions import abort_batch, apply_recovery, plan_recovery, settle_label
from streaming_sink.batch_log import BatchLog
from streaming_sink.batch_plan import ServerLimits
from streaming_sink.committable import Committable, TxnRef
from streaming_sink.committer import Committer, _ProgressMarks
from streaming_sink.errors import OperatorActionRefused, ReplayImpossibleError, TargetMismatchError
from streaming_sink.records import BatchState
from streaming_sink.routing import Router
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import BatchRecord, FileStateStore, MemoryStateStore
from streaming_sink.targets.base import CommitOutcome, TargetError
from streaming_sink.targets.clickhouse.ledger import MOVING
from streaming_sink.writer import ContentChecksum, PartitionWriter, WriteContext
from tests.support.pipeline import create_tables, open_target, table_rows

JOB, Q, DB = "job", "query-1", "analytics"


def rows(partition: int, start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" for i in ids],
            "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
            "__table": ["orders" if i % 3 else "payments" for i in ids],
            "kafka_partition": pa.array([partition] * n, pa.int32()),
            "kafka_offset": pa.array(ids, pa.int64()),
        }
    )


@pytest.fixture
def env(tmp_path):
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    with open_target(tmp_path / "ch", DB) as target:
        store = FileStateStore(tmp_path / "state")
        epoch = store.take_epoch(JOB, "test")
        router = Router(frozenset(target.routable_tables()), table_column="__table")
        yield target, store, epoch, router


def write_batch(target, store, epoch, router, batch_id, flush_bytes=1 << 20):
    context = WriteContext(JOB, Q, batch_id, epoch, 0, flush_bytes)
    results = []
    for partition in range(2):
        writer = PartitionWriter(context, target, router, store, partition)
        results.append(writer.add_all([rows(partition, partition * 1000 + k * 50, 50) for k in range(3)]))
    committables = [c for r in results for c in r.committables]
    return BatchRecord(Q, batch_id, BatchState.PREPARED, epoch, committables, {r.partition: r.checksum for r in results})


def expected(table):
    out = []
    for partition in range(2):
        for k in range(3):
            b = rows(partition, partition * 1000 + k * 50, 50).to_pylist()
            out += [(r["id"], r["name"], r["amount"], r["kafka_partition"], r["kafka_offset"]) for r in b if r["__table"] == table]
    return sorted(out)


def test_intents_only_are_aborted(env):
    target, store, epoch, router = env
    write_batch(target, store, epoch, router, 1)
    assert len(store.intents(JOB, Q, 1)) == 4  # 2 partitions x 2 tables
    assert len(target.staging_tables()) == 4
    Committer(target, store, JOB, epoch).abort_intents(Q, 1)
    assert target.staging_tables() == [] and store.intents(JOB, Q, 1) == []
    assert table_rows(target, "orders") == [] and table_rows(target, "payments") == []


def test_prepared_is_committed_exactly_once_even_when_repeated(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, record)
    recovery = Committer(target, store, JOB, epoch)
    assert recovery.commit_pending(recovery.log_of(record)) == []
    assert store.done_labels(JOB, Q, 1) == {c.label for c in record.committables}
    for committable in record.committables:  # a driver that crashed before recording progress repeats them
        assert target.commit(committable) is CommitOutcome.COMMITTED
    recovery.finish_prepared(record)
    assert store.get_batch(JOB, Q, 1).state is BatchState.COMMITTED
    assert table_rows(target, "orders") == expected("orders")
    assert table_rows(target, "payments") == expected("payments")
    assert target.staging_tables() == [] and store.intents(JOB, Q, 1) == []


def test_commit_interrupted_between_move_and_drop_resumes(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    first = record.committables[0]
    client = target.client()
    sizes = target.connection.partition_sizes(first.label)
    for partition_id in sorted(sizes)[:1]:  # one partition journaled and moved, as a crash after its move leaves it
        target.ledger.write_partition(first, MOVING, partition_id, sizes[partition_id][0])
        client.command(f"ALTER TABLE {DB}.`{first.label}` MOVE PARTITION ID '{partition_id}' TO TABLE {DB}.{first.table}")
    assert target.commit(first) is CommitOutcome.COMMITTED
    assert len(table_rows(target, first.table)) == first.rows


def test_staging_gone_without_ledger_is_aborted_and_fails_loudly_outside_replay(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, record)
    victim = record.committables[1]
    target.client().command(f"DROP TABLE {DB}.`{victim.label}`")  # what an operator or a wipe would do
    assert target.commit(victim) is CommitOutcome.ABORTED  # no commit ever began: never visible
    with pytest.raises(ReplayImpossibleError, match="runbook"):
        Committer(target, store, JOB, epoch).finish_prepared(record)
    assert store.get_batch(JOB, Q, 1).state is BatchState.PREPARED  # never rolled back, never marked done


def test_sweep_finishes_old_prepared_aborts_old_intents_and_applies_retention(env):
    target, store, epoch, router = env
    prepared = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, prepared)
    write_batch(target, store, epoch, router, 2)  # intents only: a crashed, unprepared batch
    recovery = Committer(target, store, JOB, epoch)
    recovery.sweep(skip=None, retain_batches=2)
    assert store.get_batch(JOB, Q, 1).state is BatchState.COMMITTED
    assert store.intents(JOB, Q, 2) == [] and target.staging_tables() == []
    assert table_rows(target, "orders") == expected("orders")
    recovery.sweep(skip=None, retain_batches=0)
    assert store.batch_keys(JOB) == []


def test_flush_bound_splits_into_chunks_of_one_transaction(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1, flush_bytes=1)  # every batch flushes
    assert len(record.committables) == 4  # still one transaction per (table, partition)
    Committer(target, store, JOB, epoch).finish_prepared(record)
    assert table_rows(target, "orders") == expected("orders")


def test_checksum_is_the_same_after_an_ipc_round_trip():
    batch = rows(0, 0, 100)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    with pa.ipc.open_stream(sink.getvalue()) as reader:
        back = reader.read_next_batch()
    a, b = ContentChecksum(), ContentChecksum()
    a.update(batch)
    b.update(back)
    assert a.hexdigest() == b.hexdigest()
    c = ContentChecksum()
    c.update(rows(0, 1, 100))
    assert c.hexdigest() != a.hexdigest()


def test_writer_memory_is_bounded_by_the_flush_size_not_the_batch(env):
    target, store, epoch, router = env
    flush = 64 * 1024
    context = WriteContext(JOB, Q, 1, epoch, 0, flush)
    writer = PartitionWriter(context, target, router, store, 0)
    batches = [rows(0, k * 500, 500) for k in range(40)]
    biggest = max(b.nbytes for b in batches)
    result = writer.add_all(batches)
    assert sum(b.nbytes for b in batches) > 10 * flush  # the partition is far larger than the bound
    assert writer.peak_buffered_bytes <= 2 * (flush + biggest)  # per table: at most one flush plus one batch
    assert result.rows == 40 * 500 == sum(c.rows for c in result.committables)


# -- operator commands act on the target the journal recorded (review W2) ---------------------------

JOURNAL_TARGET = ("starrocks", "analytics")
WRONG_TARGETS = [("clickhouse", "default"), ("clickhouse", "analytics"), ("starrocks", "default")]


class RecordingTarget:
    """Commits always succeed; records every call, so a refusal can be shown to have sent nothing."""

    commit_parallelism = 1
    commits_per_table = False  # commits part by part, as `Target.commit_table`'s default

    def __init__(self, kind: str, database: str) -> None:
        self.kind, self.database = kind, database
        self.calls: list[tuple[str, str]] = []

    def routable_tables(self) -> None:
        return None

    def server_limits(self) -> ServerLimits:
        return ServerLimits()

    def leftover_transactions(self, label_prefix: str) -> None:
        return None

    def commit(self, committable: Committable) -> CommitOutcome:
        self.calls.append(("commit", committable.label))
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self.calls.append(("abort", ref.label))


def crashed_job(store: MemoryStateStore) -> None:
    """What a driver on StarRocks 'analytics' left: batch 3 PREPARED (one commit sent), batch 4 intents only."""
    epoch = store.take_epoch(JOB, "driver")
    kind, database = JOURNAL_TARGET
    prepared = [Committable(kind, database, "orders", f"L3-{p}", p, f"e{epoch}w0t{p}", rows=5) for p in range(2)]
    for c in prepared:
        store.add_intent(JOB, epoch, Q, 3, c.ref())
    store.put_batch(JOB, epoch, BatchRecord(Q, 3, BatchState.PREPARED, epoch, prepared, sent=["L3-0"]))
    for p in range(2):
        store.add_intent(JOB, epoch, Q, 4, TxnRef(kind, database, "orders", f"L4-{p}", p, f"e{epoch}w0t{p}"))


def mismatch(kind: str, database: str) -> str:
    return (rf"the journal says these transactions are in starrocks database 'analytics'; "
            rf"--target/--database name {kind} database '{database}'")


def operator(store: MemoryStateStore, kind: str, database: str) -> Committer:
    target = RecordingTarget(kind, database)
    return Committer(target, store, JOB, store.take_epoch(JOB, "operator"))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind, database", WRONG_TARGETS)
def test_recover_refuses_a_target_other_than_the_journals_before_acting(kind: str, database: str) -> None:
    store = MemoryStateStore()
    crashed_job(store)
    recovery = operator(store, kind, database)
    before = store.snapshot()
    with pytest.raises(TargetMismatchError, match=mismatch(kind, database)) as refused:
        apply_recovery(recovery, plan_recovery(store, JOB, recovery.target), lambda line: None)
    assert isinstance(refused.value, OperatorActionRefused)  # the CLI's refusal handling prints it
    assert recovery.target.calls == [] and store.snapshot() == before  # nothing sent, nothing forgotten


@pytest.mark.parametrize("kind, database", WRONG_TARGETS)
def test_abort_refuses_a_target_other_than_the_journals(kind: str, database: str) -> None:
    store = MemoryStateStore()
    crashed_job(store)
    recovery = operator(store, kind, database)
    with pytest.raises(TargetMismatchError, match=mismatch(kind, database)):
        abort_batch(recovery, Q, 4)
    assert recovery.target.calls == [] and [r.label for r in store.intents(JOB, Q, 4)] == ["L4-0", "L4-1"]


@pytest.mark.parametrize("kind, database", WRONG_TARGETS)
@pytest.mark.parametrize("committed", [True, False])
def test_settle_refuses_a_target_other_than_the_journals(kind: str, database: str, committed: bool) -> None:
    store = MemoryStateStore()
    crashed_job(store)
    recovery = operator(store, kind, database)
    with pytest.raises(TargetMismatchError, match=mismatch(kind, database)):
        settle_label(recovery, Q, 3, "L3-0", committed=committed)
    assert store.done_labels(JOB, Q, 3) == set() and store.get_batch(JOB, Q, 3).sent == ["L3-0"]


def test_a_restarted_job_refuses_a_target_other_than_the_one_its_prepared_batch_is_in() -> None:
    store = MemoryStateStore()
    crashed_job(store)
    target = RecordingTarget("starrocks", "default")
    sink = ExactlyOnceSink(target, store, JOB, table="orders", runner=object())  # type: ignore[arg-type]
    with pytest.raises(TargetMismatchError, match=mismatch("starrocks", "default")):
        sink.process(None, 3, Q)
    assert target.calls == [] and store.get_batch(JOB, Q, 3).state is BatchState.PREPARED


def test_the_journals_own_target_is_acted_on_by_every_command() -> None:
    store = MemoryStateStore()
    crashed_job(store)
    recovery = operator(store, *JOURNAL_TARGET)
    settle_label(recovery, Q, 3, "L3-0", committed=True)
    apply_recovery(recovery, plan_recovery(store, JOB, recovery.target), lambda line: None)
    assert recovery.target.calls == [("commit", "L3-1"), ("abort", "L4-0"), ("abort", "L4-1")]
    assert store.get_batch(JOB, Q, 3).state is BatchState.COMMITTED and store.intents(JOB, Q, 4) == []
    store.add_intent(JOB, recovery.epoch, Q, 5, TxnRef(*JOURNAL_TARGET, "orders", "L5-0", 0, f"e{recovery.epoch}w0t1"))
    assert abort_batch(recovery, Q, 5) == 1


# -- the commit phase's own costs: grouped progress marks, one commit pool per driver ------------


class ParallelTarget(RecordingTarget):
    """Commits in parallel; records the thread each commit ran in, and fails the commits named in `failing`."""

    def __init__(self, parallelism: int, failing: frozenset[str] = frozenset()) -> None:
        super().__init__(*JOURNAL_TARGET)
        self.commit_parallelism, self.failing = parallelism, failing
        self.threads: list[threading.Thread] = []
        self.committed: list[str] = []
        self._lock = threading.Lock()

    def commit(self, committable: Committable) -> CommitOutcome:
        with self._lock:
            self.threads.append(threading.current_thread())
        if committable.label in self.failing:
            raise TargetError(f"commit of {committable.label} failed")
        with self._lock:
            self.committed.append(committable.label)
        return CommitOutcome.COMMITTED


def prepared(store: MemoryStateStore, epoch: int, batch: int, n: int) -> BatchRecord:
    kind, database = JOURNAL_TARGET
    committables = [Committable(kind, database, "orders", f"L{batch}-{p}", p, f"e{epoch}w0t{p}", rows=1) for p in range(n)]
    record = BatchRecord(Q, batch, BatchState.PREPARED, epoch, committables)
    store.put_batch(JOB, epoch, record)
    return record


def test_progress_marks_of_commits_that_land_while_one_is_written_go_in_the_next_write() -> None:
    """Group commit: the worker writing marks takes every label that arrived meanwhile in its next write; the
    workers whose commits landed meanwhile do not wait. Every mark is written by the time the writer returns."""
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "driver")
    writes: list[list[str]] = []
    writing, release = threading.Event(), threading.Event()

    class FirstWriteWaits:
        def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
            writes.append(list(labels))
            if len(writes) == 1:
                writing.set()
                assert release.wait(timeout=60)
            store.mark_done_many(job_id, epoch, query_id, batch_id, labels)

    marks = _ProgressMarks(BatchLog(FirstWriteWaits(), JOB, epoch, prepared(store, epoch, 1, 3)))  # type: ignore[arg-type]
    first = threading.Thread(target=marks.add, args=("L1-0",))
    first.start()
    assert writing.wait(timeout=60)
    marks.add("L1-1")  # landed while L1-0's mark is being written: returns at once, written by the writer
    marks.add("L1-2")
    assert writes == [["L1-0"]]
    release.set()
    first.join()
    assert writes == [["L1-0"], ["L1-1", "L1-2"]] and marks.recorded == 3
    assert store.done_labels(JOB, Q, 1) == {"L1-0", "L1-1", "L1-2"}


def test_parallel_commits_record_every_landed_commit_in_fewer_writes_than_commits() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "driver")
    writes: list[list[str]] = []

    class CountingStore(MemoryStateStore):
        def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
            writes.append(list(labels))
            store.mark_done_many(job_id, epoch, query_id, batch_id, labels)

        def __getattribute__(self, name: str) -> object:
            if name == "mark_done_many":
                return object.__getattribute__(self, name)
            return getattr(store, name)

    target = ParallelTarget(4)
    record = prepared(store, epoch, 1, 32)
    committer = Committer(target, CountingStore(), JOB, epoch)  # type: ignore[arg-type]
    assert committer.commit_pending(committer.log_of(record)) == []
    labels = {c.label for c in record.committables}
    assert store.done_labels(JOB, Q, 1) == labels == set(target.committed)
    assert sorted(label for write in writes for label in write) == sorted(labels)  # each recorded once


def test_the_commit_pool_is_started_once_per_driver_and_one_commit_runs_in_the_callers_thread() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "driver")
    target = ParallelTarget(2)
    recovery = Committer(target, store, JOB, epoch)
    for batch in range(3):
        assert recovery.commit_pending(recovery.log_of(prepared(store, epoch, batch, 8))) == []
    assert len(target.threads) == 24 and len(set(target.threads)) <= 2  # a pool per batch would have started 3+
    assert threading.current_thread() not in target.threads
    recovery.commit_pending(recovery.log_of(prepared(store, epoch, 3, 1)))
    assert target.threads[-1] is threading.current_thread()  # one commit: no pool hand-off at all


def test_a_failed_commit_in_the_pool_stops_the_phase_and_the_commits_that_landed_are_recorded() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "driver")
    target = ParallelTarget(3, failing=frozenset({"L1-5"}))
    record = prepared(store, epoch, 1, 40)
    with pytest.raises(TargetError, match="commit of L1-5 failed"):
        committer = Committer(target, store, JOB, epoch)
        committer.commit_pending(committer.log_of(record))
    assert "L1-5" not in target.committed
    assert store.done_labels(JOB, Q, 1) == set(target.committed)  # each that landed is recorded before the error
    assert store.get_batch(JOB, Q, 1).sent == [c.label for c in record.committables]  # I8: sent before any commit
