"""MemoryTarget (streaming_sink/targets/memory.py): the Target contract in a dict, for users' own tests.

Driven as the sink drives a real target: PartitionWriter records intents and prepares, the driver commits;
and the whole coordinator, `ExactlyOnceSink.process`, with a runner that calls the writers directly (no Spark).
"""
from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import TxnRef
from streaming_sink.records import BatchState
from streaming_sink.routing import Router
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import MemoryStateStore, StateStore
from streaming_sink.targets.base import CommitOutcome, CommittedNotChosenError, Target, TargetError
from streaming_sink.targets.memory import MemoryTarget, MemoryTxnState
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext


def batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


def write(target: MemoryTarget, store: MemoryStateStore, *batches: pa.RecordBatch, flush_bytes: int = 1 << 20) -> PartitionResult:
    context = WriteContext("job", "q", 0, store.take_epoch("job", "test"), 0, flush_bytes=flush_bytes)
    return PartitionWriter(context, target, Router(target.routable_tables(), table="t"), store, partition=0).add_all(batches)


class DirectRunner:
    """The coordinator's writers, called in this process: `data` is one list of Arrow batches per partition."""

    def run(self, data: Any, target: Target, router: Router, context: WriteContext, store: StateStore) -> list[PartitionResult]:
        return [PartitionWriter(context, target, router, store, p, task_attempt=0).add_all(b) for p, b in enumerate(data)]


# -- the writer prepares, the driver commits ----------------------------------------------------------


def test_prepared_rows_are_invisible_until_the_commit_and_committed_once() -> None:
    target, store = MemoryTarget(["t"]), MemoryStateStore()
    result = write(target, store, batch(1, 2), batch(3))
    [committable] = result.committables  # one transaction for the table, whatever the number of flushes
    assert (committable.rows, committable.target, committable.database) == (3, "memory", "memory")
    assert [r.label for r in store.intents("job", "q", 0)] == [committable.label]  # recorded before the begin
    assert target.state(committable.label) is MemoryTxnState.PREPARED and target.rows("t") == []
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED  # repeating it changes nothing
    assert target.rows("t") == [{"id": 1}, {"id": 2}, {"id": 3}]
    assert target.labels(MemoryTxnState.COMMITTED) == [committable.label]


def test_per_flush_makes_one_prepared_transaction_per_flush() -> None:
    target, store = MemoryTarget(["t"], per_flush=True), MemoryStateStore()
    committables = write(target, store, batch(1, 2), batch(3), flush_bytes=1).committables
    assert [(c.flush, c.flush_rows, c.rows) for c in committables] == [(0, 2, 2), (1, 1, 1)]
    assert len({c.label for c in committables}) == 2
    assert all(target.state(c.label) is MemoryTxnState.PREPARED for c in committables)
    for c in committables:
        target.commit(c)
    assert [r["id"] for r in target.rows("t")] == [1, 2, 3]


def test_answers_follow_the_contract() -> None:
    target, store = MemoryTarget(["t"]), MemoryStateStore()
    first = write(target, store, batch(1)).committables[0]
    target.abort(first.ref())
    assert target.state(first.label) is MemoryTxnState.ABORTED
    assert target.commit(first) is CommitOutcome.ABORTED  # never visible: a replay is safe
    target.abort(first.ref())  # repeating an abort is harmless
    target.abort(TxnRef("memory", "memory", "t", "never-begun", 0, "a"))  # and so is one that never began

    second = write(target, store, batch(2)).committables[0]
    assert target.leftover_transactions(second.label[:10]) == [second.label]
    target.commit(second)
    assert target.leftover_transactions(second.label[:10]) == []
    with pytest.raises(CommittedNotChosenError):
        target.abort(second.ref())
    target.forget(second.label)  # past the server's label retention
    assert target.commit(second) is CommitOutcome.LOST and target.state(second.label) is None
    assert target.rows("t") == [{"id": 2}]  # forgetting a label does not take its rows back


def test_a_failed_writer_aborts_what_it_began() -> None:
    target, store = MemoryTarget(["t"]), MemoryStateStore()
    context = WriteContext("job", "q", 0, store.take_epoch("job", "test"), 0, flush_bytes=1)
    writer = PartitionWriter(context, target, Router(None, table="t"), store, partition=0)

    def batches() -> Any:
        yield batch(1)
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        writer.add_all(batches())
    assert [target.state(label) for label in target.labels()] == [MemoryTxnState.ABORTED]


def test_tables_are_the_routable_ones_and_an_unknown_one_is_refused_at_begin() -> None:
    target = MemoryTarget(["a", "b"])
    assert target.routable_tables() == {"a", "b"} and MemoryTarget().routable_tables() is None
    with pytest.raises(TargetError, match="unknown table 'c'"):
        target.begin("c", lambda chunk: TxnRef("memory", "memory", "c", "l", 0, "a"), lambda ref: None)


def test_it_never_leaves_the_process() -> None:
    assert MemoryTarget().runs_writers_in_driver
    with pytest.raises(TypeError, match="one process"):
        pickle.dumps(MemoryTarget())


# -- the coordinator, without Spark --------------------------------------------------------------------


def sink(target: MemoryTarget, store: MemoryStateStore) -> ExactlyOnceSink:
    return ExactlyOnceSink(target, store, "job", table_column="table", runner=DirectRunner(), flush_bytes=1)


def routed(table: str, *ids: int) -> pa.RecordBatch:
    return pa.record_batch({"table": pa.array([table] * len(ids)), "id": pa.array(ids, pa.int64())})


def test_the_coordinator_commits_each_batch_exactly_once() -> None:
    target, store = MemoryTarget(["a", "b"]), MemoryStateStore()
    data = [[routed("a", 1, 2)], [routed("b", 3), routed("a", 4)]]
    report = sink(target, store).process(data, 0, "q")
    assert (report.action, report.records_in, report.rows) == ("written", 4, 4)
    assert store.get_batch("job", "q", 0).state is BatchState.COMMITTED
    again = sink(target, store).process(data, 0, "q")  # Spark re-runs a batch it did not see finish
    assert again.action == "already-committed"
    assert sorted(r["id"] for r in target.rows("a")) == [1, 2, 4] and [r["id"] for r in target.rows("b")] == [3]


@pytest.mark.parametrize("applied", [False, True], ids=["refused", "answer-lost"])
def test_a_failed_commit_is_finished_by_the_rerun_exactly_once(applied: bool) -> None:
    target, store = MemoryTarget(["a"]), MemoryStateStore()
    data = [[routed("a", 1, 2)], [routed("a", 3)]]
    target.fail_next_commit(applied=applied)
    with pytest.raises(TargetError, match="injected"):
        sink(target, store).process(data, 0, "q")
    assert store.get_batch("job", "q", 0).state is BatchState.PREPARED  # the commit point was passed
    report = sink(target, store).process(data, 0, "q")  # a new driver, the same batch
    assert report.action == "recovered-prepared"
    assert sorted(r["id"] for r in target.rows("a")) == [1, 2, 3]
    assert store.get_batch("job", "q", 0).state is BatchState.COMMITTED
