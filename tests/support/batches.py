"""In-memory micro-batches: a list of partitions, each a list of Arrow batches, as the runners that stand in for
Spark (the simulation's, the in-process tests') hand them to writers."""
from __future__ import annotations

from typing import Any

import pyarrow as pa


def table_rows(partitions: list[list[pa.RecordBatch]], router: Any) -> dict[str, int]:
    """Rows per table, tables without rows left out: what the Spark runner's `table_rows` counts of a DataFrame."""
    rows: dict[str, int] = {}
    for batches in partitions:
        for batch in batches:
            for table, part in router.split(batch):
                rows[table] = rows.get(table, 0) + part.num_rows
    return rows
