"""The operator's `restore-offsets`: give Spark back the source ranges the journal recorded (runbook: 'Batch
re-planned with another range').

Spark plans a batch again with another range when its `offsets/N` is gone (deleted as a corrupt last offset
file, or the checkpoint restored from a snapshot), and the sink then stops rather than guess. Every batch record
keeps the offset file its batch was written from, so the checkpoint can be made to agree with the journal again:
write back each offset file the journal holds that is missing or differs, and remove the offset and commit files
of batches beyond the journal's newest (they never reached the sink's commit point, so Spark may plan them anew).
Spark then re-runs the newest journal batch with its recorded range and goes on from its end.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import CheckpointFolder, checkpoint_query_id, delete_log_entry, latest_batch, restore_offsets, same_source
from .errors import OffsetRangeUnknownError
from .state import StateStore


@dataclass
class OffsetRestorePlan:
    query_id: str
    restore: dict[int, tuple[str, str | None]] = field(default_factory=dict)  # batch -> (recorded, found now)
    remove: list[int] = field(default_factory=list)  # batches beyond the journal's newest: offsets and commits go

    @property
    def empty(self) -> bool:
        return not self.restore and not self.remove


def plan_offset_restore(folder: CheckpointFolder, store: StateStore, job_id: str) -> OffsetRestorePlan:
    """What `restore-offsets --apply` would write and remove; reads only. Refuses when the journal cannot give
    Spark both the newest batch and the one before it (Spark re-runs the newest from the end of the one before)."""
    query_id = checkpoint_query_id(folder)
    batches = sorted(b for q, b in store.batch_keys(job_id) if q == query_id)
    if not batches:
        raise OffsetRangeUnknownError(
            f"job {job_id}: the state store holds no batch of query {query_id} (this checkpoint's): there is no "
            "recorded range to restore. " + OffsetRangeUnknownError.RUNBOOK)
    newest = batches[-1]
    records = {b: store.get_batch(job_id, query_id, b) for b in batches}
    sources = {b: r.source for b, r in records.items() if r is not None and r.source is not None}
    needed = [b for b in (newest - 1, newest) if b >= 0]
    unknown = [b for b in needed if b not in sources]
    if unknown:
        raise OffsetRangeUnknownError(
            f"job {job_id} query {query_id}: the journal holds no recorded range for batch(es) {unknown} (past "
            "retention, or written by a release that did not record ranges), so Spark cannot be given the newest "
            "batch's range back. " + OffsetRangeUnknownError.RUNBOOK)
    plan = OffsetRestorePlan(query_id)
    for batch_id, recorded in sorted(sources.items()):
        found = folder.read(f"offsets/{batch_id}")
        if found is None or not same_source(recorded, found):
            plan.restore[batch_id] = (recorded, found)
    beyond = [latest_batch(folder, "offsets"), latest_batch(folder, "commits")]
    top = max((b for b in beyond if b is not None), default=newest)
    plan.remove = list(range(newest + 1, top + 1))
    return plan


def apply_offset_restore(folder: CheckpointFolder, plan: OffsetRestorePlan) -> None:
    """Write the plan: files beyond the journal first, then the recorded offset files, oldest first."""
    for batch_id in reversed(plan.remove):
        for log in ("commits", "offsets"):
            delete_log_entry(folder, log, batch_id)
    for batch_id, (recorded, _) in sorted(plan.restore.items()):
        restore_offsets(folder, batch_id, recorded)
