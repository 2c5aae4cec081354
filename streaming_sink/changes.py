"""Change rows: how a row says it is an upsert or a delete of its key, and where it stands in its source's order.

A table whose rows are changes (a database's change stream, e.g. Debezium's) gets, besides its own columns, two
columns the sink owns; every target reads them and speaks its own product's model (StarRocks' `__op`, Doris' delete
sign and sequence column, ClickHouse's ReplacingMergeTree version and is-deleted columns; docs/change-streams.md):

* `__op`: `UPSERT` (0) or `DELETE` (1). A delete carries the key's columns; its other columns may be null.
* `__version`: a non-negative 64-bit number that grows with a key's changes in the source (Debezium's `source.lsn`
  where the connector gives one, else the Kafka offset), so it never goes back after a restart or a replay.

Before the writers see a batch, the sink keeps one row per (table, key): the change with the highest `__version`;
among equal versions the one with the highest `__position` where the rows carry it (the packaged job: the Kafka
offset, since one key's changes stay in one partition; Debezium gives a PostgreSQL snapshot row and the key's first
streamed change the same `source.lsn`), then by content, so a re-run keeps the same row. A delete followed by a
re-insert in one batch therefore ends with the row present, and no two writers hold changes of one key in one batch.
Across batches, equal versions are resolved by load order, which is batch order: every target keeps the row loaded
last among equal versions.
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

OP_COLUMN = "__op"
VERSION_COLUMN = "__version"
POSITION_COLUMN = "__position"  # optional, never loaded: breaks ties of `__version` within a batch
CHANGE_COLUMNS = (OP_COLUMN, VERSION_COLUMN)
UPSERT, DELETE = 0, 1


def is_change_schema(schema: pa.Schema) -> bool:
    """Whether rows of this schema are changes (they carry `__op`); a target then loads them as upserts/deletes."""
    return OP_COLUMN in schema.names


def table_columns(names: Sequence[str]) -> list[str]:
    """A change row's own columns: its names without the sink's `__op` and `__version`."""
    return [name for name in names if name not in CHANGE_COLUMNS]
