"""One change per (table, key) per batch, before any writer sees the batch (the rule of `changes.py`).

Why in Spark, before the writers: a batch's rows reach many writers (Kafka partitions, the spread of `spread.py`), and
each writer is its own transaction, committed in no order the source decides. Two changes of one key in two writers
could land in either order. Keeping only the latest change of each key leaves nothing to order inside a batch;
batches themselves commit in order, and a replay re-derives the same rows.

The result must be the same rows in the same partitions in the same order whenever the batch is read again: the
writers' content checksums, flush boundaries and replay matching depend on it (execution.py). Rows are hash-
partitioned by (table, key) into the batch's own partition count, so the writer count does not change; rows that are
not changes (`__op` null: append-only tables, dead letters) are spread by a hash of their content rather than
piled into one partition. Within a partition the order is total: (table, key, version, content hashes).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .changes import OP_COLUMN, POSITION_COLUMN, VERSION_COLUMN
from .errors import ConfigurationError
from .spread import hashable_content

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_SPREAD, _RANK = "__streaming_sink_spread", "__streaming_sink_rank"


def latest_changes(df: DataFrame, route: str | None, key: Sequence[str]) -> DataFrame:
    """`df` with, of the change rows of each (route, key), only the one with the highest `__version`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    missing = [name for name in (*key, OP_COLUMN, VERSION_COLUMN) if name not in df.columns]
    if missing:
        raise ConfigurationError(f"change rows need the column(s) {missing}; the batch has {df.columns}")
    content = hashable_content(df)
    change = F.col(OP_COLUMN).isNotNull()
    groups = ([F.col(route)] if route else []) + [F.col(f"`{name}`") for name in key]
    # the content hash of a non-change row keeps its group to itself and its identical twins, which all stay
    spread = F.when(change, F.lit(0)).otherwise(F.xxhash64(*content))
    hashes = [F.xxhash64(*content), F.hash(*content)]  # two independent ones: ties only between identical rows
    order = [F.col(name).desc_nulls_last() for name in (VERSION_COLUMN, POSITION_COLUMN) if name in df.columns]
    order += [h.desc() for h in hashes]
    partitions = max(1, df.rdd.getNumPartitions())
    grouped = df.withColumn(_SPREAD, spread).repartition(partitions, *groups, F.col(_SPREAD))
    ranked = grouped.withColumn(_RANK, F.row_number().over(Window.partitionBy(*groups, F.col(_SPREAD)).orderBy(*order)))
    kept = ranked.filter(~change | (F.col(_RANK) == 1))
    ordered = kept.sortWithinPartitions(*groups, F.col(_SPREAD), *order)
    return ordered.drop(_SPREAD, _RANK, *([POSITION_COLUMN] if POSITION_COLUMN in df.columns else []))
