"""Replay: loading the lost parts of a PREPARED batch again from Spark's re-run of that very batch.

A part is lost when the target can no longer commit it (aborted, or unknown before any commit was sent). The
re-run batch has the same offsets, so its partitions hold the same rows; the replay reloads only the (table,
writer partition) pairs that lost a part, under fresh labels, and proves each reloaded partition identical to the
prepared one by its content checksum. The plan is made in the driver (`ReplayPlan.of`), travels to the writers in
their `WriteContext`, and is checked against what they prepared (`ReplayPlan.check`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .committable import Committable
from .errors import ReplayMismatchError
from .labels import WAVE_STRIDE, partition_wave
from .records import BatchRecord


class TablePartition(NamedTuple):
    """One table's rows of one writer partition: what a replay reloads, or not, as a whole."""

    table: str
    partition: int


class FlushKey(NamedTuple):
    """One flush of a writer's table: a transaction of its own on a target with one transaction per flush (the Doris
    target before it streamed a writer's flushes into one load: a record of that release replays this way)."""

    table: str
    partition: int
    flush: int


#: Spark partition of the re-run batch -> the prepared writer partition with the same content.
PartitionIdentity = dict[int, int]


class _Prepared(Protocol):
    """What the check reads of a writer's result (`writer.PartitionResult`)."""

    partition: int
    checksum: str


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay pass reloads, what it must skip, and how it recognises the prepared partitions."""

    lost: tuple[Committable, ...]
    reload: frozenset[TablePartition]
    # flushes of the reloaded pairs that stayed committed, with their rows: a replay writes them no more
    committed_flushes: Mapping[FlushKey, int] = field(default_factory=dict)
    # the prepared record's writer partition -> content checksum: the re-run's partitions are matched to them
    prepared_checksums: Mapping[int, str] = field(default_factory=dict)
    # the wave the lost parts belong to, in a batch committed in waves: the replay rewrites that wave's tables only,
    # and its runner numbers partitions as for that wave's first pass (the writers add the wave's offset)
    wave: int = 0

    @classmethod
    def of(cls, record: BatchRecord, lost: Iterable[Committable], job_id: str, wave: int = 0) -> ReplayPlan:
        """The plan for `lost` parts of `record` (all of wave `wave`). Parts of the same (table, partition) that did
        commit must not be loaded again: the replay skips their flushes, or this refuses when they do not say which
        rows they hold."""
        lost = tuple(lost)
        strays = [c.label for c in lost if partition_wave(c.partition) != wave]
        if strays:
            raise ValueError(f"replay of wave {wave} of batch {record.batch_id} given parts of another wave: {strays}")
        reload = frozenset(TablePartition(c.table, c.partition) for c in lost)
        lost_labels = {c.label for c in lost}
        survivors = [c for c in record.live_committables()
                     if TablePartition(c.table, c.partition) in reload and c.label not in lost_labels]
        unsplittable = [c.label for c in survivors if c.flush is None or c.flush_rows is None]
        if unsplittable:
            raise ReplayMismatchError(
                f"job {job_id} batch {record.batch_id}: {unsplittable} committed while other transactions of the "
                "same table and partition were lost, and they do not say which rows they hold; reloading the partition "
                "would duplicate them. " + ReplayMismatchError.RUNBOOK
            )
        committed = {FlushKey(c.table, c.partition, c.flush): c.flush_rows
                     for c in survivors if c.flush is not None and c.flush_rows is not None}
        checksums = {p: c for p, c in record.checksums.items() if record.plan is None or partition_wave(p) == wave}
        return cls(lost, reload, committed, checksums, wave)

    def wants(self, table: str, partition: int) -> bool:
        """Whether the writer of `partition` sends `table`'s rows in this pass."""
        return TablePartition(table, partition) in self.reload

    def committed_rows(self, table: str, partition: int, flush: int) -> int | None:
        """Rows of that flush if it is already committed (a replay must not send it again), else None."""
        return self.committed_flushes.get(FlushKey(table, partition, flush))

    @property
    def prepared_partitions(self) -> list[int]:
        """The writer partitions the prepared batch (its replayed wave) had, as its runner numbered them."""
        return sorted(int(partition) - self.wave * WAVE_STRIDE for partition in self.prepared_checksums)

    def identity(self, digests: Mapping[int, str]) -> PartitionIdentity | None:
        """Match the re-run batch's partitions (Spark's numbers -> their checksums) to the prepared ones by content:
        a re-run can number its partitions differently. None when the prepared batch recorded no checksums."""
        if not self.prepared_checksums:
            return None
        unclaimed: dict[str, list[int]] = {}
        for prepared, checksum in sorted(self.prepared_checksums.items(), key=lambda item: int(item[0])):
            unclaimed.setdefault(checksum, []).append(int(prepared))
        identity: PartitionIdentity = {}
        for spark_partition in sorted(digests):
            candidates = unclaimed.get(digests[spark_partition])
            if candidates:
                identity[spark_partition] = candidates.pop(0) - self.wave * WAVE_STRIDE  # the writer adds it back
        return identity

    def check(self, results: Iterable[_Prepared], job_id: str, batch_id: int) -> None:
        """Every reloaded partition has the prepared checksum, or the source did not replay the same data."""
        by_partition = {r.partition: r for r in results}
        for partition in sorted({p for _, p in self.reload}):
            replayed = by_partition.get(partition)
            if replayed is None or replayed.checksum != self.prepared_checksums.get(partition):
                raise ReplayMismatchError(
                    f"job {job_id} batch {batch_id}: partition {partition} of the re-run batch has checksum "
                    f"{replayed.checksum if replayed else 'none (no rows)'} but the prepared data had "
                    f"{self.prepared_checksums.get(partition)}; the source did not replay the same data, so the lost "
                    "part cannot be reloaded safely. " + ReplayMismatchError.RUNBOOK
                )


def writer_partition(identity: PartitionIdentity | None, spark_partition: int) -> int:
    """Without a replay, Spark's number. In a replay, the prepared partition with the same content;
    a partition whose content matches none gets a negative number, so it can neither be taken
    for a prepared one nor pass the checksum check (which then fails loudly)."""
    if identity is None:
        return spark_partition
    return identity.get(spark_partition, -1 - spark_partition)
