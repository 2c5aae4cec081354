"""In-memory micro-batches: a list of partitions, each a list of Arrow batches, as the runners that stand in for
Spark (the simulation's, the in-process tests') hand them to writers."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from streaming_sink.routing import Router
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext


def table_rows(partitions: list[list[pa.RecordBatch]], router: Any) -> dict[str, int]:
    """Rows per table, tables without rows left out: what the Spark runner's `table_rows` counts of a DataFrame."""
    rows: dict[str, int] = {}
    for batches in partitions:
        for batch in batches:
            for table, part in router.split(batch):
                rows[table] = rows.get(table, 0) + part.num_rows
    return rows


class InMemoryRunner:
    """One real PartitionWriter per partition; task attempt ids unique per run, as Spark's are."""

    def __init__(self) -> None:
        self.next_attempt = 0

    def writer_count(self, data: Any, target: Any) -> int:
        return len(data)

    def table_rows(self, data: Any, router: Router) -> dict[str, int]:
        return table_rows(data, router)

    def run(self, data: Any, target: Any, router: Router, context: WriteContext, store: Any) -> list[PartitionResult]:
        results = []
        for partition, batches in enumerate(data):
            self.next_attempt += 1
            writer = PartitionWriter(context, target, router, store, partition, self.next_attempt)
            results.append(writer.add_all(batches))
        return results
