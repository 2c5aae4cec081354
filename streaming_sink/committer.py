"""The Committer: commits what was prepared, aborts what was only begun; the sink's and the operator CLI's.

Rules (docs/design.md):
* a batch with a PREPARED record is rolled forward, never back (I2): commit every committable;
* intents of a batch that has no PREPARED record are aborted (I3);
* intents that are not in a batch's record (failed, speculative or replaced attempts) are aborted
  once the batch is COMMITTED;
* a committable that can no longer be committed (ABORTED, or LOST: unknown to the server) is replayed
  by the sink while Spark re-runs that very batch; anywhere else it is a loud failure with the runbook step;
* a LOST committable whose commit may have been sent (its label is in the record's `sent`) is never
  replayed: the server may have committed it and forgotten the label since (I8), so the job stops;
  unless it is proved never committed (`never_committed`: it answered LOST in the phase that first sent
  it, as a commit of a label the server does not know commits nothing), or the phase that listed it
  failed before sending it (`not_sent`: the next phase sends it as if first listed);
* a fenced driver acts on nothing: the epoch is checked before every commit and abort (I5), and an
  abort never touches a transaction of a newer epoch.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from .batch_log import BatchLog
from .committable import Committable, TxnRef
from .crash import crash_point
from .errors import InvariantBreach, ReplayAmbiguousError, ReplayImpossibleError, TargetMismatchError
from .labels import attempt_epoch, label_prefix, parse_label
from .records import BatchRecord, BatchState
from .state import StateStore
from .state.base import fencing_error
from .targets.base import CommitOutcome, ExpiryKind, Target

log = logging.getLogger(__name__)






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


class Committer:
    """The commit phase of every batch under one fencing epoch, and the clean-up around it (aborts, sweep).

    The coordinator decides (the PREPARED record); the Committer carries the decision out for a `BatchLog`,
    on the job's first batch after a restart and for operators' commands alike."""

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

    def roll_forward(
        self, batch: BatchLog, on_lost: Callable[[list[Committable]], bool], started: float | None = None,
        on_wave: Callable[[int], None] | None = None,
    ) -> BatchRecord | None:
        """Carry a PREPARED batch to COMMITTED (I2): commit what is pending, mark COMMITTED, abort the unchosen attempts.

        `on_lost` is told of parts that can no longer be committed: it replays them and answers True (the batch goes
        on), raises, or answers False (the batch stays PREPARED; None is returned). A batch committed in waves is
        committed wave by wave: once the recorded waves are committed, `on_wave` writes the next one into the record
        (only the batch's re-run can: without it the unwritten waves stop the job). `started`: when the commit phase
        began, kept as the record's `commit_s`."""
        while True:
            lost = self.commit_pending(batch)
            if lost and not on_lost(lost):
                return None
            wave = batch.record.next_wave
            if wave is None:
                break
            crash_point("between-waves", batch.record.batch_id)
            if on_wave is None:
                raise self._unwritten_waves(batch.record)
            on_wave(wave)
        committed = batch.mark_committed({"commit_s": time.time() - started} if started is not None else None)
        self.abort_intents(committed.query_id, committed.batch_id, keep={c.label for c in committed.committables})
        return committed

    def commit_pending(self, batch: BatchLog, on_commit: Callable[[], None] | None = None) -> list[Committable]:
        """Commit every live committable not yet recorded as done; return those that can be replayed.

        Before the first commit is sent, the record lists the labels it is sent for (one state write):
        a later LOST answer for one of them is ambiguous and stops the job (R1).
        """
        record = batch.record
        self.check_epoch()
        self.check_target(record.live_committables(), record.query_id, record.batch_id)  # before `sent` is written
        done = self.store.done_labels(self.job_id, record.query_id, record.batch_id)
        pending = [c for c in record.live_committables() if c.label not in done]
        already_sent, not_sent = set(record.sent), set(record.not_sent)
        # sent by an earlier phase and not proved uncommitted since: a LOST answer for these is ambiguous
        sent_before = already_sent - set(record.never_committed) - not_sent
        unsent = [c.label for c in pending if c.label not in already_sent]
        again = [c.label for c in pending if c.label in not_sent]  # listed, never sent: sent now as if first listed

        marks = _ProgressMarks(batch)
        stopped = threading.Event()  # set by the first failure: queued commits are not sent any more
        # LOST for a label first sent in this phase is safe: a commit of a label the server does not know commits
        # nothing, so it was unknown before it (F4). Kept as it arrives, before the replay and any later failure.
        proofs = _NeverCommitted(batch)

        started: set[str] = set()  # labels whose commit this phase began to send

        def commit_unit(parts: list[Committable]) -> list[CommitOutcome | None]:
            if stopped.is_set():
                return [None] * len(parts)
            try:
                self.check_epoch()  # a fenced driver sends no further commit (I5)
                started.update(c.label for c in parts)  # from here on, a commit may have gone out
                answers: list[CommitOutcome | None] = list(self._commit(parts))
                for committable, outcome in zip(parts, answers, strict=True):
                    if outcome is CommitOutcome.COMMITTED:
                        marks.add(committable.label)
                        if on_commit:
                            on_commit()
                    # a label of `not_sent` sent now counts as first sent (seed 32 of test_simulation stopped without it)
                    elif outcome is CommitOutcome.LOST and committable.label not in sent_before:
                        proofs.add(committable.label)
                return answers
            except BaseException:
                stopped.set()
                raise

        units = self._commit_units(pending)
        try:
            if unsent or again:
                batch.mark_sent(unsent, again)
            if pending and self.before_send is not None:
                self.before_send(batch.record)
            answers = self._run_commits(commit_unit, units)
        except Exception:
            self._never_sent(batch, [label for label in [*unsent, *again] if label not in started])
            raise
        answered = {c.label: o for unit, unit_answers in zip(units, answers, strict=True)
                    for c, o in zip(unit, unit_answers, strict=True)}
        outcomes = [answered[c.label] for c in pending]
        # LOST for a label sent before this phase may be a forgotten commit, and LOST_AFTER_SEND always may be.
        ambiguous = [c for c, o in zip(pending, outcomes, strict=True)
                     if o is CommitOutcome.LOST_AFTER_SEND or (o is CommitOutcome.LOST and c.label in sent_before)]
        if ambiguous:
            raise ReplayAmbiguousError(
                f"job {self.job_id} batch {record.batch_id} of query {record.query_id}: the target no longer knows "
                f"{len(ambiguous)} transaction(s) whose commit was sent ({', '.join(c.label for c in ambiguous)}). "
                f"{label_memory(self.target)}, so they may be committed or not: replaying could duplicate their rows, "
                "skipping could lose them. Nothing was replayed: settle it with a query on the target and resume. "
                + ReplayAmbiguousError.RUNBOOK
            )
        lost = [c for c, o in zip(pending, outcomes, strict=True) if o is not CommitOutcome.COMMITTED and c not in ambiguous]
        if lost:
            log.warning(
                "job %s batch %s: %d prepared transaction(s) can no longer be committed (aborted by the target, or "
                "unknown to it before any commit was sent): %s",
                self.job_id, record.batch_id, len(lost), [c.label for c in lost],
            )
        return lost

    def _never_sent(self, batch: BatchLog, labels: list[str]) -> None:
        """A failed phase sent no commit for these labels, listed in `sent` by it: the next phase sends them as if first
        listed, so a LOST answer there proves them never committed instead of stopping the job (N8). Best effort: the
        failure is what the caller must see, and a label left as sent only stops the job for an operator, never loads
        twice."""
        if not labels:
            return
        try:
            batch.mark_not_sent(labels, event=f"commit phase stopped before sending {len(labels)} commit(s)")
        except Exception as error:
            log.error("job %s batch %s: could not record %d commit(s) never sent (%s)", self.job_id,
                      batch.record.batch_id, len(labels), error)

    def _commit_units(self, pending: list[Committable]) -> list[list[Committable]]:
        """What one commit call takes: every part of a table for a target that commits a table at once
        (`Target.commit_table`), otherwise one part."""
        if not self.target.commits_per_table:
            return [[c] for c in pending]
        tables: dict[str, list[Committable]] = {}
        for committable in pending:
            tables.setdefault(committable.table, []).append(committable)
        return list(tables.values())

    def _commit(self, parts: list[Committable]) -> list[CommitOutcome]:
        """The target's answers for one commit unit, in the order of `parts`."""
        if not self.target.commits_per_table:
            return [self.target.commit(c) for c in parts]
        answers = self.target.commit_table(parts[0].table, parts)
        missing = [c.label for c in parts if c.label not in answers]
        if missing:
            raise InvariantBreach(f"{self.target.kind} commit_table of {parts[0].table!r} did not answer for {missing}")
        return [answers[c.label] for c in parts]

    def _run_commits(
        self, commit_unit: Callable[[list[Committable]], list[CommitOutcome | None]], units: list[list[Committable]]
    ) -> list[list[CommitOutcome | None]]:
        """Run `commit_unit` over `units` with the target's parallelism; on the first error, start no further
        one, wait for those running, and raise it. One at a time runs in the calling thread; more run in a pool
        this Committer keeps across batches (its threads start once per driver, not once per batch)."""
        parallelism = min(max(1, self.target.commit_parallelism), len(units))
        if parallelism <= 1:
            return [commit_unit(unit) for unit in units]  # stops at the first error: it propagates
        pool = self._commit_pool(max(1, self.target.commit_parallelism))
        futures = [pool.submit(commit_unit, unit) for unit in units]
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
            # idle threads end when this Committer is collected (the CLI and tests make many) or at exit
            weakref.finalize(self, pool.shutdown, wait=False)
            self._pool, self._pool_workers = pool, workers
        return pool

    def log_of(self, record: BatchRecord) -> BatchLog:
        """The record's transitions under this Committer's epoch."""
        return BatchLog(self.store, self.job_id, self.epoch, record)

    def abort_intents(self, query_id: str, batch_id: int, keep: Collection[str] = frozenset()) -> int:
        """Abort every intent of the batch whose label is not in `keep`; forget all of them.

        Never a transaction of a newer epoch (its driver owns it), and never once fenced (R4).
        """
        self.check_epoch()
        intents = self.store.intents(self.job_id, query_id, batch_id)
        self._refuse_newer(attempt_epoch(r.attempt) or 0 for r in intents)
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
        self.refuse_newer_epochs(leftovers)
        for label in leftovers:
            self.check_epoch()
            self.target.abort(TxnRef(self.target.kind, self.target.database, "", label, -1, ""))
        if leftovers:
            log.warning("job %s: aborted %d transaction(s) on the target that the journal does not name: %s",
                        self.job_id, len(leftovers), leftovers)
        return len(leftovers)

    def refuse_newer_epochs(self, labels: Iterable[str]) -> None:
        """Never abort a server transaction a newer epoch began (I5), as for intents: its driver may still record and
        commit it. A leftover that no record names and that is newer than this process's epoch also says the store
        went back (its newest epoch is below the label's): the label's own attempt is the only witness left."""
        self._refuse_newer(parts.attempt.epoch for label in labels if (parts := parse_label(label, self.job_id)))

    def _refuse_newer(self, epochs: Iterable[int]) -> None:
        """Stop (FencedError) before aborting anything begun under an epoch newer than this process's."""
        newest = max(epochs, default=0)
        if newest > self.epoch:
            raise fencing_error(self.job_id, self.epoch, newest)

    def finish_prepared(self, record: BatchRecord) -> None:
        """Roll a PREPARED batch forward outside its own re-run; a lost part cannot be replayed here."""

        def cannot_replay(lost: list[Committable]) -> bool:
            stop = ReplayImpossibleError(
                f"job {self.job_id}: batch {record.batch_id} of query {record.query_id} was PREPARED but "
                f"{len(lost)} of its transactions can no longer be committed ({', '.join(c.label for c in lost)}), "
                "and the streaming query will not re-run that batch: re-ingest that batch's offsets, then record the "
                f"loss with `streaming-sink settle --query-id {record.query_id} --batch {record.batch_id} --accept-loss`. "
                + ReplayImpossibleError.RUNBOOK
            )
            stop.query_id, stop.batch_id = record.query_id, record.batch_id
            raise stop

        self.roll_forward(self.log_of(record), cannot_replay)

    def _unwritten_waves(self, record: BatchRecord) -> ReplayImpossibleError:
        """Waves of a batch were never written, and only the batch's re-run holds their rows."""
        assert record.plan is not None and record.next_wave is not None
        wave, tables = record.next_wave, record.unwritten_tables()
        stop = ReplayImpossibleError(
            f"job {self.job_id}: batch {record.batch_id} of query {record.query_id} commits in "
            f"{len(record.plan.waves)} waves and waves {wave}.. ({len(tables)} table(s): {', '.join(tables[:10])}"
            f"{', ...' if len(tables) > 10 else ''}) were never written; its recorded waves are committed. Only the "
            "batch's re-run holds the other waves' rows: if the job restarts on the same checkpoint, restarting it "
            "writes them; if the streaming query will never re-run that batch, re-ingest those tables' rows of its "
            f"offsets, then record the loss with `streaming-sink settle --query-id {record.query_id} --batch "
            f"{record.batch_id} --accept-loss`. " + ReplayImpossibleError.RUNBOOK
        )
        stop.query_id, stop.batch_id = record.query_id, record.batch_id
        return stop

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
                    self.finish_prepared(record)
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

    def __init__(self, batch: BatchLog) -> None:
        super().__init__()
        self._batch = batch

    def _write(self, labels: list[str]) -> None:
        self._batch.mark_done(labels)
        if self.recorded == 0:
            crash_point("after-first-commit", self._batch.record.batch_id)


class _NeverCommitted(_GroupWrites):
    """Labels proved never committed (LOST on the first commit the server received: F4), kept in the record as they
    arrive, so neither a later failure of the phase nor a later phase reads them as ambiguous."""

    def __init__(self, batch: BatchLog) -> None:
        super().__init__()
        self._batch = batch

    def _write(self, labels: list[str]) -> None:
        self._batch.mark_never_committed(labels)






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


def label_memory(target: Target) -> str:
    """How long the target remembers finished labels, from its own expiry limits: why a label whose commit was sent
    can be unknown to it. Told in an error, so a target that cannot say (or fails to) leaves the general words."""
    try:
        limits = [limit for limit in target.expiry_limits() if limit.kind is ExpiryKind.LABELS]
    except Exception:  # the message is about another failure; never replace it with this one
        limits = []
    said = "The server forgets finished labels after a while or past a count"
    known = ["; ".join(filter(None, [
        f"{limit.what}: {limit.seconds:g} s" if limit.seconds is not None else f"{limit.what}: no age limit",
        f"or past {limit.count} newer transactions" if limit.count is not None else "",
    ])) for limit in limits]
    return f"{said} ({', '.join(known)})" if known else said
