"""The operator's actions on a job's journal: `recover` (plan, apply), `abort`, `settle`, `settle --accept-loss`.

Each runs under an epoch the command took (`cli._take_over`), so no driver writes the journal meanwhile, and
each is checked against the target the journal names before anything is sent (W2).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from .committable import Committable, TxnRef
from .committer import Committer, check_target, leftover_labels
from .errors import OperatorActionRefused, ReplayAmbiguousError
from .records import BatchRecord, BatchState
from .state import StateStore
from .targets.base import Target


class Action(StrEnum):
    """What `recover` does for one batch (or, for ABORT_LEFTOVERS, for the server's unnamed transactions)."""

    COMMIT_PREPARED = "commit-prepared"
    ABORT_INTENTS = "abort-intents"
    ABORT_LEFTOVERS = "abort-leftovers"
    KEEP_FOR_REPLAY = "keep-for-replay"  # a PREPARED batch with lost parts, left for the job's own replay


@dataclass
class RecoveryAction:
    """One thing `recover` does (or, in a dry run, would do) for one batch."""

    query_id: str
    batch_id: int
    action: Action
    transactions: int
    detail: str = ""  # for the operator to read; nothing parses it
    labels: list[str] = field(default_factory=list)  # the transactions acted on, where the action names them


def abort_batch(committer: Committer, query_id: str, batch_id: int) -> int:
    """The operator's `abort --apply`: abort a batch's leftover transactions, never what a record names (R5).

    Called after `committer` took the fencing epoch, so no driver can write the record any more: the
    record read here is final. A batch with a record is refused; its committables are kept regardless.
    """
    record = committer.store.get_batch(committer.job_id, query_id, batch_id)
    if record is not None:
        raise OperatorActionRefused(
            f"batch {batch_id} of query {query_id} is {record.state.value}: its transactions must be committed "
            "(run `recover`); aborting them would lose rows the source will not send again"
        )
    return committer.abort_intents(query_id, batch_id)


def settle_record(store: StateStore, job_id: str, query_id: str, batch_id: int, label: str | None) -> BatchRecord:
    """The PREPARED record an operator's verdict is about (holding `label`, when one is given). Read before
    the command takes the epoch, so a mistaken one changes nothing, and again after, so the verdict is
    applied to the final record."""
    record = store.get_batch(job_id, query_id, batch_id)
    if record is None or record.state is not BatchState.PREPARED:
        found = "has no record" if record is None else f"is {record.state.value}"
        raise OperatorActionRefused(f"batch {batch_id} of query {query_id} {found}: only a PREPARED batch's "
                                    "transactions can be settled (see `status`)")
    labels = [c.label for c in record.live_committables()]
    if label is not None and label not in labels:
        shown = ", ".join(labels[:5]) + (" ..." if len(labels) > 5 else "")
        raise OperatorActionRefused(f"batch {batch_id} of query {query_id} has no PREPARED committable {label}; "
                                    f"its labels: {shown}")
    return record


def settle_label(committer: Committer, query_id: str, batch_id: int, label: str, committed: bool) -> None:
    """The operator's verdict on an ambiguous label (runbook: 'Replay ambiguous'), under a taken epoch.

    committed: record it as done, so the job goes on without loading it again; not committed: record it as
    never committed, so the job replays it once from the source.
    """
    record = settle_record(committer.store, committer.job_id, query_id, batch_id, label)
    committer.check_target(record.live_committables(), query_id, batch_id)  # the verdict is about that target's label
    batch = committer.log_of(record)
    if committed:
        batch.settle_committed(label)
        return
    # `sent` only grows (the checkpoint marker counts it, I9): the verdict goes where LOST-at-first-send does
    batch.mark_never_committed([label], event=f"operator settled {label} as not committed")


def accept_loss(committer: Committer, query_id: str, batch_id: int) -> list[Committable]:
    """The operator's `settle --accept-loss` for a PREPARED batch Spark will never re-run (an older checkpoint's,
    runbook: 'Prepared data lost outside its batch'), under a taken epoch: commit what the target still holds,
    record the rest as given up (`discarded`), and close the batch so it no longer stops the job.

    Nothing can be duplicated by it (a given-up label is never loaded again); what it gives up is returned, for
    the operator to re-ingest from the batch's recorded source range.
    """
    batch = committer.log_of(settle_record(committer.store, committer.job_id, query_id, batch_id, None))
    try:
        committer.commit_pending(batch)
    except ReplayAmbiguousError:
        pass  # committed or not, the operator accepts its rows may be missing: it is given up like the lost ones
    done = committer.store.done_labels(committer.job_id, query_id, batch_id)
    given_up = [c for c in batch.record.live_committables() if c.label not in done]
    committed = batch.accept_loss(given_up)
    committer.abort_intents(query_id, batch_id, keep={c.label for c in committed.committables})
    return given_up


def plan_recovery(store: StateStore, job_id: str, target: Target | None = None) -> list[RecoveryAction]:
    """What a crashed job left: PREPARED batches to roll forward, intents and server leftovers to abort. Reads only."""
    actions = []
    if target is not None:
        leftovers = leftover_labels(store, target, job_id)
        if leftovers:
            actions.append(RecoveryAction("", -1, Action.ABORT_LEFTOVERS, len(leftovers), ", ".join(leftovers), leftovers))
    for query_id, batch_id in store.batch_keys(job_id):
        record = store.get_batch(job_id, query_id, batch_id)
        intents = store.intents(job_id, query_id, batch_id)
        if record is not None and record.state is BatchState.PREPARED:
            done = store.done_labels(job_id, query_id, batch_id)
            pending = [c for c in record.live_committables() if c.label not in done]
            actions.append(RecoveryAction(query_id, batch_id, Action.COMMIT_PREPARED, len(pending),
                                          f"{len(done)} already committed", [c.label for c in pending]))
        keep = {c.label for c in record.committables} if record else set()
        leftover = [r for r in intents if r.label not in keep]
        if leftover:
            actions.append(RecoveryAction(query_id, batch_id, Action.ABORT_INTENTS, len(leftover),
                                          ", ".join(r.label for r in leftover[:3]) + (" ..." if len(leftover) > 3 else ""),
                                          [r.label for r in leftover]))
    return actions


def apply_recovery(committer: Committer, actions: list[RecoveryAction], progress: Callable[[str], None]) -> list[RecoveryAction]:
    """Carry out a plan. A PREPARED batch with lost parts is left PREPARED for the job's own replay.

    Every batch of the plan is checked against the target first, so a wrong one changes nothing at all.
    """
    check_journal_target(committer.store, committer.target, committer.job_id,
                         [(a.query_id, a.batch_id) for a in actions if a.batch_id >= 0])
    results = []
    for number, action in enumerate(actions, 1):
        progress(f"[{number}/{len(actions)}] batch {action.batch_id}: {action.action} ({action.transactions})")
        record = committer.store.get_batch(committer.job_id, action.query_id, action.batch_id)
        if action.action == Action.COMMIT_PREPARED and record is not None and record.state is BatchState.PREPARED:
            lost: list[Committable] = []

            def keep_for_replay(found: list[Committable], lost: list[Committable] = lost) -> bool:  # the job's re-run replays them
                lost.extend(found)
                return False

            if committer.roll_forward(committer.log_of(record), keep_for_replay) is None:
                results.append(RecoveryAction(action.query_id, action.batch_id, Action.KEEP_FOR_REPLAY, len(lost),
                                              "lost: " + ", ".join(c.label for c in lost), [c.label for c in lost]))
                continue
        elif action.action == Action.ABORT_INTENTS:
            keep = {c.label for c in record.committables} if record else set()
            committer.abort_intents(action.query_id, action.batch_id, keep=keep)
        elif action.action == Action.ABORT_LEFTOVERS:
            still = set(leftover_labels(committer.store, committer.target, committer.job_id))  # re-read under our epoch
            committer.refuse_newer_epochs(still & set(action.labels))
            for label in action.labels:
                if label in still:
                    committer.check_epoch()
                    committer.target.abort(TxnRef(committer.target.kind, committer.target.database, "", label, -1, ""))
        results.append(action)
    return results


def check_journal_target(
    store: StateStore, target: Target, job_id: str, keys: Iterable[tuple[str, int]] | None = None
) -> None:
    """Every transaction the journal names for these batches (all by default: records' live committables and
    intents) is in `target` (W2): checked before anything is sent, so a wrong target changes nothing at all."""
    for query_id, batch_id in store.batch_keys(job_id) if keys is None else keys:
        record = store.get_batch(job_id, query_id, batch_id)
        refs: list[TxnRef] = list(record.live_committables()) if record else []
        check_target(target, job_id, refs + store.intents(job_id, query_id, batch_id), query_id, batch_id)
