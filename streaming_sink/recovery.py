"""Commit what was prepared, abort what was only begun: shared by the sink and the operator CLI.

Rules (docs/design.md):
* a batch with a PREPARED record is rolled forward, never back (I2): commit every committable;
* intents of a batch that has no PREPARED record are aborted (I3);
* intents that are not in a batch's record (failed, speculative or replaced attempts) are aborted
  once the batch is COMMITTED;
* a committable that can no longer be committed (ABORTED, or LOST: unknown to the server) is replayed
  by the sink while Spark re-runs that very batch; anywhere else it is a loud failure with the runbook step;
* a LOST committable whose commit may have been sent (its label is in the record's `sent`) is never
  replayed: the server may have committed it and forgotten the label since (I8), so the job stops;
  unless it answered LOST in the very phase that first sent it (`never_committed`): a commit of a
  label the server does not know commits nothing, so it provably never committed;
* a fenced driver acts on nothing: the epoch is checked before every commit and abort (I5), and an
  abort never touches a transaction of a newer epoch.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterable

from .state import BatchRecord, StateStore
from .state.base import fencing_error
from .labels import attempt_epoch

from .committable import Committable, TxnRef
from .records import BatchState
from .labels import label_prefix
from .crash import crash_point
from .errors import ExitCode, StopForOperator, StreamingSinkError
from .targets.base import CommitOutcome, Target

log = logging.getLogger(__name__)


class ReplayImpossibleError(StopForOperator):
    """Prepared data is gone and the source will not re-run the batch: stop before losing it silently."""


class ReplayAmbiguousError(StopForOperator):
    """The server forgot a label whose commit may have been sent: replaying could duplicate, skipping could lose."""


#: Other checkpoints' batch records are dropped this long after their newest one (O2).
STALE_QUERY_SECONDS = 7 * 86400.0


def check_target(target: Target, job_id: str, refs: Iterable[TxnRef], query_id: str, batch_id: int) -> None:
    """Refuse to act on transactions the journal records in another target kind or database (W2).

    Every intent and committable says where its transaction is; a target given on a command line
    (or a job whose target changed) is taken on faith nowhere.
    """
    given = (target.kind, target.database)
    for ref in refs:
        if (ref.target, ref.database) != given:
            raise TargetMismatchError(
                f"job {job_id} batch {batch_id} of query {query_id}: the journal says these transactions are "
                f"in {ref.target} database {ref.database!r}; --target/--database name {given[0]} database "
                f"{given[1]!r}. Nothing was committed or aborted: name the target and database the job wrote them "
                "to (for the job itself: its target or database changed while these transactions were open)."
            )


class Recovery:
    def __init__(self, target: Target, store: StateStore, job_id: str, epoch: int) -> None:
        self.target, self.store, self.job_id, self.epoch = target, store, job_id, epoch
        self._clean: set[tuple[str, int]] = set()  # COMMITTED batches with no intents left: nothing to sweep
        self._pool: ThreadPoolExecutor | None = None  # the commit threads, started at the first parallel commit
        self._pool_workers = 0
        # told of a record just before its commits go out, `sent` durable (the sink keeps it beside the checkpoint)
        self.before_send: Callable[[BatchRecord], None] | None = None

    def check_epoch(self) -> None:
        current = self.store.current_epoch(self.job_id)
        if current != self.epoch:
            raise fencing_error(self.job_id, self.epoch, current)

    def check_target(self, refs: Iterable[TxnRef], query_id: str, batch_id: int) -> None:
        check_target(self.target, self.job_id, refs, query_id, batch_id)

    def commit_pending(self, record: BatchRecord, on_commit: Callable[[], None] | None = None) -> list[Committable]:
        """Commit every live committable not yet recorded as done; return those that can be replayed.

        Before the first commit is sent, the record lists the labels it is sent for (one state write):
        a later LOST answer for one of them is ambiguous and stops the job (R1).
        """
        self.check_epoch()
        self.check_target(record.live_committables(), record.query_id, record.batch_id)  # before `sent` is written
        done = self.store.done_labels(self.job_id, record.query_id, record.batch_id)
        pending = [c for c in record.live_committables() if c.label not in done]
        already_sent = set(record.sent)
        # sent by an earlier phase and not proved uncommitted since: a LOST answer for these is ambiguous
        sent_before = already_sent - set(record.never_committed)
        unsent = [c.label for c in pending if c.label not in already_sent]
        if unsent:
            record.sent = record.sent + unsent
            self.store.put_batch(self.job_id, self.epoch, record)
        if pending and self.before_send is not None:
            self.before_send(record)

        marks = _ProgressMarks(self.store, self.job_id, self.epoch, record.query_id, record.batch_id)
        stopped = threading.Event()  # set by the first failure: queued commits are not sent any more
        # LOST for a label first sent in this phase is safe: a commit of a label the server does not know commits
        # nothing, so it was unknown before it (F4). Kept as it arrives, before the replay and any later failure.
        proofs = _NeverCommitted(self.store, self.job_id, self.epoch, record)

        def commit_one(committable: Committable) -> CommitOutcome | None:
            if stopped.is_set():
                return None
            try:
                self.check_epoch()  # a fenced driver sends no further commit (I5)
                outcome = self.target.commit(committable)
                if outcome is CommitOutcome.COMMITTED:
                    marks.add(committable.label)
                    if on_commit:
                        on_commit()
                elif outcome is CommitOutcome.LOST and committable.label not in already_sent:
                    proofs.add(committable.label)
                return outcome
            except BaseException:
                stopped.set()
                raise

        outcomes = self._run_commits(commit_one, pending)
        # LOST for a label sent before this phase may be a forgotten commit, and LOST_AFTER_SEND always may be.
        ambiguous = [c for c, o in zip(pending, outcomes)
                     if o is CommitOutcome.LOST_AFTER_SEND or (o is CommitOutcome.LOST and c.label in sent_before)]
        if ambiguous:
            raise ReplayAmbiguousError(
                f"job {self.job_id} batch {record.batch_id} of query {record.query_id}: the target no longer knows "
                f"{len(ambiguous)} transaction(s) whose commit was sent ({', '.join(c.label for c in ambiguous)}). "
                "The server forgets finished labels after a while or past a count (StarRocks 3 days or 1000 running "
                "and finished transactions per database; Doris 12 h or 2000 finished ones), so they may be committed or "
                "not: replaying could duplicate their rows, "
                "skipping could lose them. Nothing was replayed. See docs/runbook.md, section 'Replay ambiguous: "
                "a committed label was forgotten', to settle it with a query on the target and resume."
            )
        lost = [c for c, o in zip(pending, outcomes) if o is not CommitOutcome.COMMITTED and c not in ambiguous]
        if lost:
            log.warning(
                "job %s batch %s: %d prepared transaction(s) can no longer be committed (aborted by the target, or "
                "unknown to it before any commit was sent): %s",
                self.job_id, record.batch_id, len(lost), [c.label for c in lost],
            )
        return lost

    def _run_commits(
        self, commit_one: Callable[[Committable], CommitOutcome | None], pending: list[Committable]
    ) -> list[CommitOutcome | None]:
        """Run `commit_one` over `pending` with the target's parallelism; on the first error, start no further
        one, wait for those running, and raise it. One at a time runs in the calling thread; more run in a pool
        this Recovery keeps across batches (its threads start once per driver, not once per batch)."""
        parallelism = min(max(1, self.target.commit_parallelism), len(pending))
        if parallelism <= 1:
            return [commit_one(c) for c in pending]  # stops at the first error: it propagates
        pool = self._commit_pool(max(1, self.target.commit_parallelism))
        futures = [pool.submit(commit_one, c) for c in pending]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in finished and f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()  # not started yet: never sent (those already started see `stopped`)
            wait(futures)  # the ones running finish (their progress marks included) before the error goes up
            raise failed.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def _commit_pool(self, workers: int) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None or self._pool_workers != workers:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"commit-{self.job_id}")
            # idle threads end when this Recovery is collected (the CLI and tests make many) or at exit
            weakref.finalize(self, pool.shutdown, wait=False)
            self._pool, self._pool_workers = pool, workers
        return pool

    def mark_committed(self, record: BatchRecord) -> BatchRecord:
        committed = replace(record, state=BatchState.COMMITTED, epoch=self.epoch)
        committed.timings = dict(record.timings, committed_at=time.time())
        self.store.put_batch(self.job_id, self.epoch, committed)
        crash_point("after-committed-record", record.batch_id)
        return committed

    def abort_intents(self, query_id: str, batch_id: int, keep: Collection[str] = frozenset()) -> int:
        """Abort every intent of the batch whose label is not in `keep`; forget all of them.

        Never a transaction of a newer epoch (its driver owns it), and never once fenced (R4).
        """
        self.check_epoch()
        intents = self.store.intents(self.job_id, query_id, batch_id)
        newer = [r for r in intents if (attempt_epoch(r.attempt) or 0) > self.epoch]
        if newer:
            raise fencing_error(self.job_id, self.epoch, attempt_epoch(newer[0].attempt))
        self.check_target(intents, query_id, batch_id)  # every one is aborted or forgotten below
        aborted = 0
        for ref in intents:
            if ref.label not in keep:
                self.check_epoch()
                self.target.abort(ref)
                aborted += 1
        self.store.remove_intents(self.job_id, self.epoch, query_id, batch_id, [r.label for r in intents])
        if aborted:
            log.info("job %s batch %s of query %s: aborted %d leftover transaction(s)", self.job_id, batch_id, query_id, aborted)
        return aborted

    def abort_leftovers(self, query_id: str) -> int:
        """Abort the job's open transactions on the server that neither a record nor an intent names.

        They are what a process leaves when it dies between a begin and its confirmation, or what a
        store that lost intents leaves behind (I3). Only targets that can list transactions find any.
        """
        self.check_epoch()
        leftovers = leftover_labels(self.store, self.target, self.job_id, {query_id})
        for label in leftovers:
            self.check_epoch()
            self.target.abort(TxnRef(self.target.kind, self.target.database, "", label, -1, ""))
        if leftovers:
            log.warning("job %s: aborted %d transaction(s) on the target that the journal does not name: %s",
                        self.job_id, len(leftovers), leftovers)
        return len(leftovers)

    def finish_prepared(self, record: BatchRecord) -> BatchRecord:
        """Roll a PREPARED batch forward outside its own re-run; a lost part cannot be replayed here."""
        lost = self.commit_pending(record)
        if lost:
            stop = ReplayImpossibleError(
                f"job {self.job_id}: batch {record.batch_id} of query {record.query_id} was PREPARED but "
                f"{len(lost)} of its transactions can no longer be committed ({', '.join(c.label for c in lost)}), "
                "and the streaming query will not re-run that batch. See docs/runbook.md, "
                "section 'Prepared data lost outside its batch': re-ingest that batch's offsets, then record the "
                f"loss with `streaming-sink settle --query-id {record.query_id} --batch {record.batch_id} --accept-loss`."
            )
            stop.query_id, stop.batch_id = record.query_id, record.batch_id
            raise stop
        committed = self.mark_committed(record)
        self.abort_intents(record.query_id, record.batch_id, keep={c.label for c in record.committables})
        return committed

    def sweep(self, skip: tuple[str, int] | None = None, retain_batches: int = 100, now: float | None = None) -> None:
        """Finish or clean every batch of the job other than `skip`; drop COMMITTED records past retention.

        The current query keeps its newest `retain_batches` records (batch N needs N-1's to prove the
        store did not lose state). Other queries (older checkpoints) keep only their newest record,
        and none once it is `STALE_QUERY_SECONDS` old, so state does not grow with checkpoint changes (O2).
        """
        keys = self.store.batch_keys(self.job_id)
        newest: dict[str, int] = {}
        for query_id, batch_id in keys:
            newest[query_id] = max(newest.get(query_id, batch_id), batch_id)
        current_query = skip[0] if skip else None
        now = time.time() if now is None else now
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
            other = current_query is not None and query_id != current_query
            retain = 1 if other else retain_batches
            if batch_id <= newest[query_id] - retain or (other and self._stale(key, now)):
                self.store.delete_batch(self.job_id, self.epoch, query_id, batch_id)
                self._clean.discard(key)

    def _stale(self, key: tuple[str, int], now: float) -> bool:
        record = self.store.get_batch(self.job_id, *key)
        return record is not None and record.state is BatchState.COMMITTED and now - record.created_at > STALE_QUERY_SECONDS


class _GroupWrites:
    """Group commit of labels to the store, as a commit phase's workers produce them: as few writes as the commits
    allow, and no lock held across a write.

    A worker adds its label; if no worker is writing, it writes every label waiting, again until none waits, while
    the other workers go on committing. So each label is written by the time the commit phase returns (the worker
    writing is waited for like any other), with one write per label when commits run one at a time, and far fewer
    when they run in parallel.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[str] = []
        self._writing = False
        self.recorded = 0

    def _write(self, labels: list[str]) -> None:
        raise NotImplementedError

    def add(self, label: str) -> None:
        with self._lock:
            self._waiting.append(label)
            if self._writing:
                return  # the worker writing takes it in its next write
            self._writing = True
        try:
            while True:
                with self._lock:
                    labels, self._waiting = self._waiting, []
                    if not labels:
                        self._writing = False
                        return
                self._write(labels)
                self.recorded += len(labels)
        except BaseException:
            with self._lock:
                self._writing = False
            raise


class _ProgressMarks(_GroupWrites):
    """The commit phase's progress marks (`mark_done`). A mark only spares recovery a commit it would send again
    (the servers answer a repeated commit COMMITTED); `sent`, written before any commit, is what keeps a forgotten
    label from being replayed (I8), so a crash before a mark is written is safe."""

    def __init__(self, store: StateStore, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        super().__init__()
        self._store, self._key = store, (job_id, epoch, query_id, batch_id)

    def _write(self, labels: list[str]) -> None:
        self._store.mark_done_many(*self._key, labels)
        if self.recorded == 0:
            crash_point("after-first-commit", self._key[3])


class _NeverCommitted(_GroupWrites):
    """Labels proved never committed (LOST on the first commit the server received: F4), kept in the record as they
    arrive, so neither a later failure of the phase nor a later phase reads them as ambiguous."""

    def __init__(self, store: StateStore, job_id: str, epoch: int, record: BatchRecord) -> None:
        super().__init__()
        self._store, self._job_id, self._epoch, self._record = store, job_id, epoch, record

    def _write(self, labels: list[str]) -> None:
        self._record.never_committed = self._record.never_committed + labels
        self._store.put_batch(self._job_id, self._epoch, self._record)


@dataclass
class RecoveryAction:
    """One thing `recover` does (or, in a dry run, would do) for one batch."""

    query_id: str
    batch_id: int
    action: str  # commit-prepared | abort-intents | keep-for-replay
    transactions: int
    detail: str = ""


class OperatorActionRefused(StreamingSinkError, RuntimeError):
    """An operator's action that would lose or duplicate rows (aborting a batch with a record, settling a
    label the record does not hold): refused, with the reason."""

    exit_code = ExitCode.REFUSED
    headline = "refusing: {error}"


class TargetMismatchError(OperatorActionRefused):
    """The journal records the transactions in another target kind or database than the one given.

    A commit or abort sent there finds nothing (or a namesake), and the journal would then forget the
    real transactions: staging tables that never expire, StarRocks/Doris transactions holding their
    database's quota until their timeout. Raised before anything is sent, for the job's own restart too.
    """


def abort_batch(recovery: "Recovery", query_id: str, batch_id: int) -> int:
    """The operator's `abort --apply`: abort a batch's leftover transactions, never what a record names (R5).

    Called after `recovery` took the fencing epoch, so no driver can write the record any more: the
    record read here is final. A batch with a record is refused; its committables are kept regardless.
    """
    record = recovery.store.get_batch(recovery.job_id, query_id, batch_id)
    if record is not None:
        raise OperatorActionRefused(
            f"batch {batch_id} of query {query_id} is {record.state.value}: its transactions must be committed "
            "(run `recover`); aborting them would lose rows the source will not send again"
        )
    return recovery.abort_intents(query_id, batch_id)


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


def settle_label(recovery: "Recovery", query_id: str, batch_id: int, label: str, committed: bool) -> None:
    """The operator's verdict on an ambiguous label (runbook: 'Replay ambiguous'), under a taken epoch.

    committed: record it as done, so the job goes on without loading it again; not committed: record it as
    never committed, so the job replays it once from the source.
    """
    record = settle_record(recovery.store, recovery.job_id, query_id, batch_id, label)
    recovery.check_target(record.live_committables(), query_id, batch_id)  # the verdict is about that target's label
    if committed:
        recovery.store.mark_done(recovery.job_id, recovery.epoch, query_id, batch_id, label)
        return
    # `sent` only grows (the checkpoint marker counts it, I9): the verdict goes where LOST-at-first-send does
    record.never_committed = record.never_committed + [label]
    record.events.append(f"operator settled {label} as not committed")
    recovery.store.put_batch(recovery.job_id, recovery.epoch, record)


def accept_loss(recovery: "Recovery", query_id: str, batch_id: int) -> list[Committable]:
    """The operator's `settle --accept-loss` for a PREPARED batch Spark will never re-run (an older checkpoint's,
    runbook: 'Prepared data lost outside its batch'), under a taken epoch: commit what the target still holds,
    record the rest as given up (`discarded`), and close the batch so it no longer stops the job.

    Nothing can be duplicated by it (a given-up label is never loaded again); what it gives up is returned, for
    the operator to re-ingest from the batch's recorded source range.
    """
    record = settle_record(recovery.store, recovery.job_id, query_id, batch_id, None)
    try:
        recovery.commit_pending(record)
    except ReplayAmbiguousError:
        pass  # committed or not, the operator accepts its rows may be missing: it is given up like the lost ones
    done = recovery.store.done_labels(recovery.job_id, query_id, batch_id)
    given_up = [c for c in record.live_committables() if c.label not in done]
    record.discarded = sorted(set(record.discarded) | {c.label for c in given_up})
    record.stop = None
    record.events.append(f"operator accepted the loss of {len(given_up)} transaction(s) "
                         f"({sum(c.rows for c in given_up)} rows): {[c.label for c in given_up]}")
    recovery.mark_committed(record)
    recovery.abort_intents(query_id, batch_id, keep={c.label for c in record.committables})
    return given_up


def leftover_labels(store: StateStore, target: Target, job_id: str, query_ids: Collection[str] = frozenset()) -> list[str]:
    """Server-side transactions of this job that no record or intent names (R6); [] where the target cannot list.

    Looks under every query the store knows, and `query_ids` (the running query, after a store loss).
    """
    keys = store.batch_keys(job_id)
    found: set[str] = set()
    for query_id in {q for q, _ in keys} | set(query_ids):
        listed = target.leftover_transactions(label_prefix(job_id, query_id))
        found |= set(listed or [])
    if not found:  # the common case, and always where the target cannot list: no record needs reading
        return []
    named: set[str] = set()
    for query_id, batch_id in keys:
        record = store.get_batch(job_id, query_id, batch_id)
        named |= {c.label for c in record.committables} if record else set()
        named |= {r.label for r in store.intents(job_id, query_id, batch_id)}
    return sorted(found - named)


def plan_recovery(store: StateStore, job_id: str, target: Target | None = None) -> list[RecoveryAction]:
    """What a crashed job left: PREPARED batches to roll forward, intents and server leftovers to abort. Reads only."""
    actions = []
    if target is not None:
        leftovers = leftover_labels(store, target, job_id)
        if leftovers:
            actions.append(RecoveryAction("", -1, "abort-leftovers", len(leftovers), ", ".join(leftovers)))
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
    """Carry out a plan. A PREPARED batch with lost parts is left PREPARED for the job's own replay.

    Every batch of the plan is checked against the target first, so a wrong one changes nothing at all.
    """
    check_journal_target(recovery.store, recovery.target, recovery.job_id,
                         [(a.query_id, a.batch_id) for a in actions if a.batch_id >= 0])
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
        elif action.action == "abort-leftovers":
            still = set(leftover_labels(recovery.store, recovery.target, recovery.job_id))  # re-read under our epoch
            for label in action.detail.split(", "):
                if label in still:
                    recovery.check_epoch()
                    recovery.target.abort(TxnRef(recovery.target.kind, recovery.target.database, "", label, -1, ""))
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
