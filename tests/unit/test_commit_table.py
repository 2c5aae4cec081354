"""`Target.commit_table`: a target whose commit is one act per table gets every part of a table in one call per
commit phase (tables in parallel); a target that keeps the default is committed part by part, as before."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.committer import Committer
from streaming_sink.records import BatchRecord, BatchState
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import CommitOutcome, TableTransaction, Target
from tests.support.doubles.recording import RecordingTarget

JOB, QUERY = "job", "q"


class TableTarget(Target):
    """Commits a table's parts together; answers LOST for the labels in `forgotten`."""

    kind, database = "tabular", "db"
    commit_parallelism = 4

    def __init__(self, forgotten: frozenset[str] = frozenset()) -> None:
        self.forgotten = forgotten
        self.calls: list[tuple[str, list[str]]] = []
        self._lock = threading.Lock()

    def routable_tables(self) -> set[str] | None:
        return None

    def begin(self, table: str, new_ref: Any, record_intent: Any) -> TableTransaction:
        raise NotImplementedError

    def commit(self, committable: Committable) -> CommitOutcome:
        raise AssertionError("a table-level target is committed by table")

    def commit_table(self, table: str, committables: Sequence[Committable]) -> dict[str, CommitOutcome]:
        with self._lock:
            self.calls.append((table, sorted(c.label for c in committables)))
        return {c.label: CommitOutcome.LOST if c.label in self.forgotten else CommitOutcome.COMMITTED
                for c in committables}

    def abort(self, ref: TxnRef) -> None:
        raise AssertionError(f"nothing is aborted here: {ref.label}")


def prepared(store: MemoryStateStore, target: Any, epoch: int) -> BatchRecord:
    parts = [Committable(target.kind, target.database, table, f"{table}-{p}", p, f"e{epoch}w0t{p}", rows=1)
             for table in ("orders", "payments") for p in range(3)]
    record = BatchRecord(QUERY, 0, BatchState.PREPARED, epoch, parts)
    store.put_batch(JOB, epoch, record)
    return record


def test_a_table_level_target_commits_each_table_once_with_all_its_parts() -> None:
    store, target = MemoryStateStore(), TableTarget()
    epoch = store.take_epoch(JOB, "driver")
    committer = Committer(target, store, JOB, epoch)
    committed = committer.roll_forward(committer.log_of(prepared(store, target, epoch)), on_lost=lambda lost: False)
    assert committed is not None and store.get_batch(JOB, QUERY, 0).state is BatchState.COMMITTED
    assert sorted(target.calls) == [("orders", ["orders-0", "orders-1", "orders-2"]),
                                    ("payments", ["payments-0", "payments-1", "payments-2"])]
    assert store.done_labels(JOB, QUERY, 0) == {c.label for c in committed.committables}


def test_a_table_level_answer_of_lost_is_a_lost_part_like_any_other() -> None:
    store, target = MemoryStateStore(), TableTarget(forgotten=frozenset({"payments-1"}))
    epoch = store.take_epoch(JOB, "driver")
    committer = Committer(target, store, JOB, epoch)
    batch = committer.log_of(prepared(store, target, epoch))
    assert [c.label for c in committer.commit_pending(batch)] == ["payments-1"]
    assert store.get_batch(JOB, QUERY, 0).never_committed == ["payments-1"]  # LOST on its first send (F4)


def test_a_target_with_the_default_is_committed_part_by_part() -> None:
    store, target = MemoryStateStore(), RecordingTarget()
    epoch = store.take_epoch(JOB, "driver")
    committer = Committer(target, store, JOB, epoch)  # type: ignore[arg-type]
    record = prepared(store, target, epoch)
    assert committer.commit_pending(committer.log_of(record)) == []
    assert sorted(target.calls) == sorted(("commit", c.label) for c in record.committables)
