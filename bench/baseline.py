"""The fair at-least-once baseline: the sink's own writers and runner, committed without the journal.

The sink has no at-least-once mode, so the bench builds one from its parts without changing them:
`streaming_sink.execution.SparkWriterRunner` runs the same `PartitionWriter`s (same routing, buffering,
encoding, checksum, transactions: in tasks for StarRocks/Doris, in the driver for chdb) against a
`NullJournal`, a state store that records nothing; the driver then commits every committable the
writers prepared, with the target's own commit parallelism, and writes no record. What it leaves
out is exactly what exactly-once adds: recovery checks, intents, the PREPARED and COMMITTED
records, progress marks, the checkpoint marker and the final abort of unchosen attempts.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streaming_sink.committable import TxnRef
from streaming_sink.execution import SparkWriterRunner
from streaming_sink.records import BatchRecord
from streaming_sink.routing import Router
from streaming_sink.sink import QUERY_ID_PROPERTY
from streaming_sink.state.base import StateStore
from streaming_sink.targets.base import CommitOutcome, Target, TargetError
from streaming_sink.writer import WriteContext

FLUSH_BYTES = 64 * 1024 * 1024  # the sink's default


class NullJournal(StateStore):
    """A state store that keeps nothing: intents and records vanish. Picklable (it travels to tasks)."""

    url = "null://"

    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        return max(1, at_least)

    def current_epoch(self, job_id: str) -> int:
        return 1

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        return None

    def beat(self, job_id: str, epoch: int, at: float) -> None:
        return None

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        return None

    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        return None

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        return []

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        return None

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        return None

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        return None

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        return None

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        return set()

    def job_ids(self) -> list[str]:
        return []

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        return []

    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        return None


class AtLeastOnceWriter:
    """foreachBatch callable: write with the sink's runner, commit what was prepared, remember nothing."""

    def __init__(self, target: Target, table_column: str, on_report: Callable[[dict[str, Any]], None] | None = None) -> None:
        tables = target.routable_tables()
        self.target = target
        self.router = Router(frozenset(tables) if tables is not None else None, None, table_column)
        self.store = NullJournal()
        self.runner = SparkWriterRunner()
        self.on_report = on_report

    def __call__(self, df: Any, batch_id: int) -> None:
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY) or "bench"
        started = time.time()
        context = WriteContext("bench-alo", query_id, int(batch_id), 1, 0, FLUSH_BYTES)
        results = self.runner.run(df, self.target, self.router, context, self.store)
        written = time.time()
        committables = [c for r in results for c in r.committables]
        with ThreadPoolExecutor(max_workers=max(1, self.target.commit_parallelism)) as pool:
            outcomes = list(pool.map(self.target.commit, committables))
        failed = [c.label for c, o in zip(committables, outcomes, strict=True) if o is not CommitOutcome.COMMITTED]
        if failed:
            raise TargetError(f"at-least-once baseline: commits of {failed} did not succeed")
        if self.on_report is not None:
            self.on_report({"batch_id": int(batch_id), "rows": sum(r.rows for r in results), "transactions": len(committables),
                            "write_s": written - started, "commit_s": time.time() - written})
