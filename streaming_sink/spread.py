"""The rows of one wave of a batch's plan (`batch_plan.py`), spread over the plan's writers and put in a fixed order.

A wave keeps only its own tables' rows. A spread plan gives each table `writers[table]` slots, numbered one after
the other (`base[table]` .. `base[table] + writers[table] - 1`), and each row the slot its content hashes to; each
slot's rows are in one Spark partition (below), so a table's rows reach at most `writers[table]` task writers and
the wave holds at most `BatchPlan.transactions(wave)` transactions.

A writer's checksum, its flush boundaries and a replay's partition matching all depend on each partition holding
the same rows in the same order on every run of the batch (`writer.ContentChecksum` is order-sensitive). A shuffle
delivers rows in the order the map outputs arrive, which varies, so each partition is sorted by its slot and two
independent 64-bit hashes of the row's content: equal keys mean equal rows (to a chance of about 2^-128), whose
order changes nothing. Were two different rows ever to tie, a replay's checksum would differ and the sink would stop
with `ReplayMismatchError`: loud, never silent.

Slot s goes to partition s mod P, P the fewer of the slots and the writers the batch had when planned
(`BatchPlan.partitions`): many small tables share a task instead of each paying for its own, and a table's slots,
consecutive and no more than P, still land in different partitions. Spark places a row by `pmod(murmur3(key), P)`
(its hash partitioning, the same function as SQL `hash`), so each partition p is given the smallest key Spark places
in p (`partition_keys`): where a row goes is a function of the recorded plan and the row alone.

Rows of a table the plan does not name (or of no table: null) belong to the last wave (`BatchPlan.in_wave`, the
writers' rule too), where the writers load them or the router refuses them: a wave's filter never drops rows.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .batch_plan import BatchPlan
from .errors import ConfigurationError
from .routing import Router

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

#: The helper columns a spread adds and drops before any writer sees the rows.
SLOT_COLUMN = "__streaming_sink_slot"
KEY_COLUMN = "__streaming_sink_partition_key"
HASH_COLUMNS = ("__streaming_sink_hash_a", "__streaming_sink_hash_b")
HELPER_COLUMNS = (SLOT_COLUMN, KEY_COLUMN, *HASH_COLUMNS)

#: Spark's seed for `hash` and for hash partitioning (`Murmur3Hash`).
SPARK_HASH_SEED = 42


def shapes_rows(plan: BatchPlan) -> bool:
    """Whether a plan changes which rows a writer sees: a spread, or more than one wave. Otherwise the batch's
    DataFrame goes to the writers untouched (the fast path costs nothing)."""
    return plan.spread or len(plan.waves) > 1


def wave_rows(df: DataFrame, router: Router, plan: BatchPlan, wave: int, spread: bool = True) -> DataFrame:
    """The rows of `plan`'s wave `wave`, spread over its writers in a fixed order when the plan spreads and `spread`
    (False: the writers run in the driver, one writer whatever the plan)."""
    tables = plan.waves[wave]
    clash = sorted(set(HELPER_COLUMNS) & set(df.columns))
    if clash:
        raise ConfigurationError(f"columns {clash} are reserved for the sink's spread of rows over writers; rename them")
    one_wave = len(plan.waves) == 1  # every row is the wave's (or refused by the router)
    rows = df if router.table_column is None or one_wave else df.filter(_in_wave(router.table_column, plan, wave))
    if not (plan.spread and spread):
        return rows
    return _spread(rows, router, plan, tables)


def _in_wave(column: str, plan: BatchPlan, wave: int) -> Column:
    from pyspark.sql import functions as F

    table = F.col(column)
    keep = table.isin(list(plan.waves[wave]))
    if wave == len(plan.waves) - 1:  # rows of no planned table, null ones too (`isin` is null for them)
        keep = keep | table.isNull() | ~table.isin(list(plan.writers))
    return keep


def _spread(df: DataFrame, router: Router, plan: BatchPlan, tables: tuple[str, ...]) -> DataFrame:
    from pyspark.sql import functions as F

    columns = df.columns
    content = hashable_content(df)
    bases: dict[str, int] = {}
    offset = 0
    for table in tables:
        bases[table] = offset
        offset += plan.writers[table]
    slots = offset
    partitions = min(slots, plan.partitions or slots)
    if router.table_column is None:
        table_of: Column = F.lit(str(router.table))
    else:
        table_of = F.col(router.table_column)
    base = _lookup(table_of, bases)
    width = _lookup(table_of, {table: plan.writers[table] for table in tables})
    keys = partition_keys(partitions)
    hash_a = F.xxhash64(*content)
    hash_b = F.xxhash64(F.lit("streaming-sink"), *content)  # another seed: independent of hash_a
    # rows of no planned table (the last wave's, `BatchPlan.in_wave`) go to slot 0
    slot = F.coalesce(base + F.pmod(hash_a, F.coalesce(width, F.lit(1))), F.lit(0)).cast("int")
    key = F.element_at(F.array(*[F.lit(k) for k in keys]), F.pmod(slot, F.lit(partitions)) + 1).cast("int")
    spread = (
        df.withColumn(SLOT_COLUMN, slot)
        .withColumn(KEY_COLUMN, key)
        .repartition(partitions, KEY_COLUMN)
        .withColumn(HASH_COLUMNS[0], hash_a)
        .withColumn(HASH_COLUMNS[1], hash_b)
        .sortWithinPartitions(SLOT_COLUMN, *HASH_COLUMNS)
    )
    return spread.select(*[F.col(f"`{name}`") for name in columns])


def _lookup(table: Column, values: dict[str, int]) -> Column:
    """`values[table]` as a Spark expression (a map literal; null for a table not in it)."""
    from pyspark.sql import functions as F

    pairs = [F.lit(part) for name, value in sorted(values.items()) for part in (name, value)]
    return F.element_at(F.create_map(*pairs), table)


def hashable_content(df: DataFrame) -> list[Column]:
    """A row's columns as Spark's hashes take them: a map (anywhere inside a column) as its JSON text, since Spark
    refuses to hash maps (equal maps may list their entries in different orders; the same batch lists them the same)."""
    from pyspark.sql import functions as F

    return [F.to_json(F.col(f"`{name}`")) if _has_map(df.schema[name].dataType) else F.col(f"`{name}`") for name in df.columns]


def _has_map(kind: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, MapType):
        return True
    if isinstance(kind, ArrayType):
        return _has_map(kind.elementType)
    if isinstance(kind, StructType):
        return any(_has_map(field.dataType) for field in kind.fields)
    return False


@functools.lru_cache(maxsize=64)
def partition_keys(partitions: int) -> tuple[int, ...]:
    """For each partition p of `partitions`, the smallest non-negative int that Spark's hash partitioning places in
    p (`pmod(murmur3_int(key, 42), partitions) == p`)."""
    keys: list[int | None] = [None] * partitions
    missing = partitions
    candidate = 0
    while missing:
        partition = spark_hash_int(candidate) % partitions
        if keys[partition] is None:
            keys[partition] = candidate
            missing -= 1
        candidate += 1
    return tuple(k for k in keys if k is not None)


_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `Murmur3_x86_32.hashInt` (SQL `hash` of an INT, and its hash partitioning), as a signed 32-bit int."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1
