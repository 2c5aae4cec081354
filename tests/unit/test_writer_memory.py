"""A writer's memory bound holds across all its tables (review O1), and a replay flushes the same rows."""
from __future__ import annotations

import pyarrow as pa

from streaming_sink.committable import TxnRef
from streaming_sink.replay import ReplayPlan, TablePartition
from streaming_sink.routing import Router
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import CommitOutcome, NewRef, PreparedPart, RecordIntent, TableTransaction, Target
from streaming_sink.writer import PartitionWriter, WriteContext

TABLES = [f"t{i:02d}" for i in range(50)]


class CountingTarget(Target):
    """Keeps, per table, the row count of every write: what the writer sent, and when."""

    kind, database = "counting", "db"

    def __init__(self) -> None:
        self.writes: dict[str, list[int]] = {}

    def routable_tables(self) -> set[str] | None:
        return set(TABLES)

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        target = self

        class Transaction(TableTransaction):
            def __init__(self) -> None:
                self.ref = new_ref(0)
                record_intent(self.ref)
                self.rows = 0

            def write(self, chunk: pa.Table) -> None:
                target.writes.setdefault(table, []).append(chunk.num_rows)
                self.rows += chunk.num_rows

            def prepare(self) -> list[PreparedPart]:
                return [PreparedPart(self.ref, None, self.rows, 0)]

            def abort(self) -> None:
                pass

        return Transaction()

    def commit(self, committable) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        pass


def batch(start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()),
        "payload": ["x" * 200 for _ in ids],
        "__table": [TABLES[(i * 7) % len(TABLES)] for i in ids],
    })


def write(replay: ReplayPlan | None = None) -> tuple[CountingTarget, PartitionWriter, int]:
    target, store = CountingTarget(), MemoryStateStore()
    epoch = store.take_epoch("job", "test")
    context = WriteContext("job", "q", 0, epoch, 0, flush_bytes=256 * 1024, replay=replay)
    writer = PartitionWriter(context, target, Router(frozenset(TABLES), table_column="__table"), store, 0)
    batches = [batch(k * 1000, 1000) for k in range(40)]
    result = writer.add_all(batches)
    assert result.rows == 40_000
    return target, writer, sum(b.nbytes for b in batches)


def test_one_bound_for_all_tables_of_a_writer():
    target, writer, total = write()
    bound = 256 * 1024
    assert total > 20 * bound  # far more data than the bound, spread over 50 tables
    assert writer.peak_buffered_bytes <= 2 * bound, f"peak {writer.peak_buffered_bytes} for a bound of {bound}"
    assert sum(sum(rows) for rows in target.writes.values()) == 40_000
    assert set(target.writes) == set(TABLES)


def test_a_replay_of_some_tables_flushes_the_same_rows_as_the_first_pass():
    first, _, _ = write()
    reloaded = {"t03", "t31"}
    replay, _, _ = write(ReplayPlan((), frozenset(TablePartition(table, 0) for table in reloaded)))
    assert set(replay.writes) == reloaded
    for table in reloaded:
        assert replay.writes[table] == first.writes[table]
