"""The operator's actions on a job's journal: `recover` (plan, apply), `abort`, `settle`, `settle --accept-loss`.

Each runs under an epoch the command took (`cli._take_over`), so no driver writes the journal meanwhile, and
each is checked against the target the journal names before anything is sent (W2).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from .checkpoint_marker import CheckpointMarker
from .committable import Committable, TxnRef
from .committer import Committer, check_target, leftover_labels
from .errors import OperatorActionRefused, ReplayAmbiguousError
from .records import BatchRecord, BatchState
from .state import StateStore
from .targets.base import Target


class Action(StrEnum):
    """What `recover` does for one batch (or, for ABORT_LEFTOVERS, for the server's unnamed transactions)."""

    COMMIT_PREPARED = "commit-prepared"
    # a PREPARED batch stopped between its waves: the recorded waves are committed, the rest only the job can write
    COMMIT_RECORDED_WAVES = "commit-recorded-waves"
    # a PREPARED batch Spark may re-run, and no checkpoint given: its commits must be kept in the checkpoint's marker
    KEEP_FOR_JOB = "keep-for-job"
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


def plan_recovery(store: StateStore, job_id: str, target: Target | None = None,
                  checkpoint_query: str | None = None) -> list[RecoveryAction]:
    """What a crashed job left: PREPARED batches to roll forward, intents and server leftovers to abort. Reads only.

    `checkpoint_query`: the query of the job's checkpoint (None: not given). The newest batch of a query may be the
    one Spark re-runs, and the commits sent for it must be in the checkpoint's marker (else a store that goes back
    and a server that forgets the labels make the re-run load it again, N2): without the checkpoint it is left to the
    job."""
    actions = []
    if target is not None:
        leftovers = leftover_labels(store, target, job_id)
        if leftovers:
            actions.append(RecoveryAction("", -1, Action.ABORT_LEFTOVERS, len(leftovers), ", ".join(leftovers), leftovers))
    keys = store.batch_keys(job_id)
    newest: dict[str, int] = {}
    for query_id, batch_id in keys:
        newest[query_id] = max(newest.get(query_id, batch_id), batch_id)
    for query_id, batch_id in keys:
        record = store.get_batch(job_id, query_id, batch_id)
        intents = store.intents(job_id, query_id, batch_id)
        if record is not None and record.state is BatchState.PREPARED:
            actions.append(_roll_forward_action(store, job_id, record, newest[query_id] == batch_id and checkpoint_query is None))
        keep = {c.label for c in record.committables} if record else set()
        leftover = [r for r in intents if r.label not in keep]
        if leftover:
            actions.append(RecoveryAction(query_id, batch_id, Action.ABORT_INTENTS, len(leftover),
                                          ", ".join(r.label for r in leftover[:3]) + (" ..." if len(leftover) > 3 else ""),
                                          [r.label for r in leftover]))
    return actions


def _roll_forward_action(store: StateStore, job_id: str, record: BatchRecord, needs_checkpoint: bool) -> RecoveryAction:
    """What `recover` does for a PREPARED batch: commit it whole, commit the waves it recorded, or leave it to the job."""
    query_id, batch_id = record.query_id, record.batch_id
    done = store.done_labels(job_id, query_id, batch_id)
    pending = [c.label for c in record.live_committables() if c.label not in done]
    if needs_checkpoint:
        return RecoveryAction(query_id, batch_id, Action.KEEP_FOR_JOB, len(pending),
                              "Spark may re-run this batch, and the commits sent for it must be kept in the checkpoint: "
                              "give --checkpoint (or --config) to commit it now, or restart the job, which commits it")
    if record.plan is not None and record.next_wave is not None:
        return RecoveryAction(query_id, batch_id, Action.COMMIT_RECORDED_WAVES, len(pending),
                              f"{record.waves_prepared} of {len(record.plan.waves)} waves recorded; the rest needs the "
                              f"job ({len(done)} already committed)", pending)
    return RecoveryAction(query_id, batch_id, Action.COMMIT_PREPARED, len(pending), f"{len(done)} already committed", pending)


def apply_recovery(committer: Committer, actions: list[RecoveryAction], progress: Callable[[str], None],
                   marker: CheckpointMarker | None = None, checkpoint_query: str | None = None) -> list[RecoveryAction]:
    """Carry out a plan. A PREPARED batch with lost parts is left PREPARED for the job's own replay; one stopped
    between its waves has its recorded waves committed and stays PREPARED for the job to write the rest.

    Every batch of the plan is checked against the target first, so a wrong one changes nothing at all. `marker`:
    the checkpoint's, told of the commits sent for a batch of `checkpoint_query` before they go out, as the
    driver's are (I9, N2)."""
    check_journal_target(committer.store, committer.target, committer.job_id,
                         [(a.query_id, a.batch_id) for a in actions if a.batch_id >= 0])
    if marker is not None:
        committer.before_send = lambda record: _mark_sending(marker, checkpoint_query, record)
    results = []
    for number, action in enumerate(actions, 1):
        progress(f"[{number}/{len(actions)}] batch {action.batch_id}: {action.action} ({action.transactions})")
        record = committer.store.get_batch(committer.job_id, action.query_id, action.batch_id)
        rolls_forward = action.action in (Action.COMMIT_PREPARED, Action.COMMIT_RECORDED_WAVES)
        if rolls_forward and record is not None and record.state is BatchState.PREPARED:
            batch = committer.log_of(record)
            if record.next_wave is not None:  # only the batch's re-run holds the other waves' rows
                lost = committer.commit_pending(batch)
            else:
                lost = []

                def keep_for_replay(found: list[Committable], lost: list[Committable] = lost) -> bool:  # the job's re-run replays them
                    lost.extend(found)
                    return False

                committer.roll_forward(batch, keep_for_replay)
            if lost:
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


def _mark_sending(marker: CheckpointMarker, checkpoint_query: str | None, record: BatchRecord) -> None:
    """The driver's mark (`ExactlyOnceSink._mark_sending`), for a batch Spark may re-run: one of the checkpoint's query,
    not older than the batch the marker names (Spark re-runs only its newest)."""
    position = marker.prepared()
    if record.query_id != checkpoint_query or (
            position is not None and position.query_id == record.query_id and position.batch_id > record.batch_id):
        return
    marker.record_sending(record.query_id, record.batch_id, record.sent)


def check_journal_target(
    store: StateStore, target: Target, job_id: str, keys: Iterable[tuple[str, int]] | None = None
) -> None:
    """Every transaction the journal names for these batches (all by default: records' live committables and
    intents) is in `target` (W2): checked before anything is sent, so a wrong target changes nothing at all."""
    for query_id, batch_id in store.batch_keys(job_id) if keys is None else keys:
        record = store.get_batch(job_id, query_id, batch_id)
        refs: list[TxnRef] = list(record.live_committables()) if record else []
        check_target(target, job_id, refs + store.intents(job_id, query_id, batch_id), query_id, batch_id)
