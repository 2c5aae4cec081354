"""Commit what was prepared, abort what was only begun: shared by the sink and the operator CLI.

Rules (DESIGN.md section 2):
* a batch with a PREPARED record is rolled forward, never back (I2): commit every committable;
* intents of a batch that has no PREPARED record are aborted (I3);
* intents that are not in a batch's record (failed, speculative or replaced attempts) are aborted
  once the batch is COMMITTED;
* a committable that can no longer be committed is LOST: only the sink, while Spark re-runs that
  very batch, can replay it; anywhere else it is a loud failure with the runbook step.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

from state import BatchRecord, FencedError, StateStore

from .committable import BatchState, Committable
from .crash import crash_point
from .targets.base import CommitOutcome, Target

log = logging.getLogger(__name__)


class ReplayImpossibleError(RuntimeError):
    """Prepared data is gone and the source will not re-run the batch: stop before losing it silently."""


class Recovery:
    def __init__(self, target: Target, store: StateStore, job_id: str, epoch: int) -> None:
        self.target, self.store, self.job_id, self.epoch = target, store, job_id, epoch
        self._clean: set[tuple[str, int]] = set()  # COMMITTED batches with no intents left: nothing to sweep

    def check_epoch(self) -> None:
        current = self.store.current_epoch(self.job_id)
        if current != self.epoch:
            raise FencedError(self.job_id, self.epoch, current)

    def commit_pending(self, record: BatchRecord, on_commit: Callable[[], None] | None = None) -> list[Committable]:
        """Commit every live committable not yet recorded as done; return the LOST ones."""
        self.check_epoch()
        done = self.store.done_labels(self.job_id, record.query_id, record.batch_id)
        pending = [c for c in record.live_committables() if c.label not in done]
        lost: list[Committable] = []

        def commit_one(committable: Committable) -> CommitOutcome:
            outcome = self.target.commit(committable)
            if outcome is CommitOutcome.COMMITTED:
                self.store.mark_done(self.job_id, self.epoch, record.query_id, record.batch_id, committable.label)
                crash_point("after-first-commit", record.batch_id)
                if on_commit:
                    on_commit()
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, self.target.commit_parallelism)) as pool:
            for committable, outcome in zip(pending, pool.map(commit_one, pending)):
                if outcome is not CommitOutcome.COMMITTED:
                    lost.append(committable)
        if lost:
            log.warning(
                "job %s batch %s: %d prepared transaction(s) can no longer be committed: %s",
                self.job_id, record.batch_id, len(lost), [c.label for c in lost],
            )
        return lost

    def mark_committed(self, record: BatchRecord) -> BatchRecord:
        committed = replace(record, state=BatchState.COMMITTED, epoch=self.epoch)
        committed.timings = dict(record.timings, committed_at=time.time())
        self.store.put_batch(self.job_id, self.epoch, committed)
        crash_point("after-committed-record", record.batch_id)
        return committed

    def abort_intents(self, query_id: str, batch_id: int, keep: set[str] = frozenset()) -> int:
        """Abort every intent of the batch whose label is not in `keep`; forget all of them."""
        intents = self.store.intents(self.job_id, query_id, batch_id)
        aborted = 0
        for ref in intents:
            if ref.label not in keep:
                self.target.abort(ref)
                aborted += 1
        self.store.remove_intents(self.job_id, self.epoch, query_id, batch_id, [r.label for r in intents])
        if aborted:
            log.info("job %s batch %s of query %s: aborted %d leftover transaction(s)", self.job_id, batch_id, query_id, aborted)
        return aborted

    def finish_prepared(self, record: BatchRecord) -> BatchRecord:
        """Roll a PREPARED batch forward outside its own re-run; a lost part cannot be replayed here."""
        lost = self.commit_pending(record)
        if lost:
            raise ReplayImpossibleError(
                f"job {self.job_id}: batch {record.batch_id} of query {record.query_id} was PREPARED but "
                f"{len(lost)} of its transactions can no longer be committed ({', '.join(c.label for c in lost)}), "
                "and the streaming query will not re-run that batch. See docs/runbook.md, "
                "section 9 'Prepared data lost outside its batch': re-ingest that batch's offsets, or accept the loss."
            )
        committed = self.mark_committed(record)
        self.abort_intents(record.query_id, record.batch_id, keep={c.label for c in record.committables})
        return committed

    def sweep(self, skip: tuple[str, int] | None = None, retain_batches: int = 100) -> None:
        """Finish or clean every batch of the job other than `skip`; drop COMMITTED records past retention."""
        keys = self.store.batch_keys(self.job_id)
        newest: dict[str, int] = {}
        for query_id, batch_id in keys:
            newest[query_id] = max(newest.get(query_id, batch_id), batch_id)
        for key in keys:
            query_id, batch_id = key
            if key == skip:
                continue
            if key not in self._clean:
                record = self.store.get_batch(self.job_id, query_id, batch_id)
                if record is None:
                    self.abort_intents(query_id, batch_id)
                    continue
                if record.state is BatchState.PREPARED:
                    record = self.finish_prepared(record)
                else:
                    self.abort_intents(query_id, batch_id, keep={c.label for c in record.committables})
                self._clean.add(key)
            if batch_id <= newest[query_id] - retain_batches:
                self.store.delete_batch(self.job_id, self.epoch, query_id, batch_id)
                self._clean.discard(key)


@dataclass
class RecoveryAction:
    """One thing `recover` does (or, in a dry run, would do) for one batch."""

    query_id: str
    batch_id: int
    action: str  # commit-prepared | abort-intents | keep-for-replay
    transactions: int
    detail: str = ""


def plan_recovery(store: StateStore, job_id: str) -> list[RecoveryAction]:
    """What a crashed job left: PREPARED batches to roll forward, intents to abort. Reads only."""
    actions = []
    for query_id, batch_id in store.batch_keys(job_id):
        record = store.get_batch(job_id, query_id, batch_id)
        intents = store.intents(job_id, query_id, batch_id)
        if record is not None and record.state is BatchState.PREPARED:
            done = store.done_labels(job_id, query_id, batch_id)
            pending = [c for c in record.live_committables() if c.label not in done]
            actions.append(RecoveryAction(query_id, batch_id, "commit-prepared", len(pending),
                                          f"{len(done)} already committed"))
        keep = {c.label for c in record.committables} if record else set()
        leftover = [r for r in intents if r.label not in keep]
        if leftover:
            actions.append(RecoveryAction(query_id, batch_id, "abort-intents", len(leftover),
                                          ", ".join(r.label for r in leftover[:3]) + (" ..." if len(leftover) > 3 else "")))
    return actions


def apply_recovery(recovery: "Recovery", actions: list[RecoveryAction], progress: Callable[[str], None]) -> list[RecoveryAction]:
    """Carry out a plan. A PREPARED batch with lost parts is left PREPARED for the job's own replay."""
    results = []
    for number, action in enumerate(actions, 1):
        progress(f"[{number}/{len(actions)}] batch {action.batch_id}: {action.action} ({action.transactions})")
        record = recovery.store.get_batch(recovery.job_id, action.query_id, action.batch_id)
        if action.action == "commit-prepared" and record is not None and record.state is BatchState.PREPARED:
            lost = recovery.commit_pending(record)
            if lost:
                results.append(RecoveryAction(action.query_id, action.batch_id, "keep-for-replay", len(lost),
                                              "lost: " + ", ".join(c.label for c in lost)))
                continue
            recovery.mark_committed(record)
            recovery.abort_intents(action.query_id, action.batch_id, keep={c.label for c in record.committables})
        elif action.action == "abort-intents":
            keep = {c.label for c in record.committables} if record else set()
            recovery.abort_intents(action.query_id, action.batch_id, keep=keep)
        results.append(action)
    return results
