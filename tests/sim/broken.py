"""Deliberately broken variants of the protocol, each a context manager that patches the product.

The simulation must catch every one of them (tests/sim/test_teeth.py); each undoes a rule that
DESIGN.md states as an invariant.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from streaming_sink import actions as actions_module
from streaming_sink import cli
from streaming_sink.committer import Committer
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.targets.base import CommitOutcome, CommittedNotChosenError
from streaming_sink.writer import PartitionWriter, WriteContext


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: object) -> Iterator[None]:
    """`owner.name` replaced while the block runs (a class or a module)."""
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def commit_before_prepared_record() -> contextlib.AbstractContextManager:
    """I1 broken: the writers' transactions are committed as soon as they are prepared."""
    write = ExactlyOnceSink._write

    def eager_write(self, df, query_id, batch_id, *args, **kwargs):
        results = write(self, df, query_id, batch_id, *args, **kwargs)
        for result in results:
            for committable in result.committables:
                self.target.commit(committable)
        return results

    return _patched(ExactlyOnceSink, "_write", eager_write)


def abort_without_epoch_check() -> contextlib.AbstractContextManager:
    """I5 broken: leftover intents are aborted without checking the epoch, whoever's they are."""

    def abort_intents(self, query_id, batch_id, keep=frozenset()):
        intents = self.store.intents(self.job_id, query_id, batch_id)
        for ref in intents:
            if ref.label not in keep:
                self.target.abort(ref)
        self.store.remove_intents(self.job_id, self.epoch, query_id, batch_id, [r.label for r in intents])
        return len(intents)

    return _patched(Committer, "abort_intents", abort_intents)


class _RewrittenOutcomes:
    """A view of the target whose commit answers are rewritten (`rewrite`: outcome -> what the sink is told)."""

    def __init__(self, target, rewrite) -> None:
        self._target, self._rewrite = target, rewrite

    def __getattr__(self, name):
        return getattr(self._target, name)

    def commit(self, committable):
        outcome = self._target.commit(committable)
        return self._rewrite.get(outcome, outcome)


def _commit_phase_told(rewrite) -> contextlib.AbstractContextManager:
    """`Committer.commit_pending` sees the target's commit outcomes rewritten."""
    commit_pending = Committer.commit_pending

    def misinformed_commit_pending(self, batch, on_commit=None):
        target = self.target
        self.target = _RewrittenOutcomes(target, rewrite)
        try:
            return commit_pending(self, batch, on_commit)
        finally:
            self.target = target

    return _patched(Committer, "commit_pending", misinformed_commit_pending)


def replay_lost_after_commit_sent() -> contextlib.AbstractContextManager:
    """I8 broken: a label the server forgot is replayed even though its commit was sent (told: a known rollback)."""
    return _commit_phase_told({CommitOutcome.LOST: CommitOutcome.ABORTED})


def lost_after_send_taken_as_lost() -> contextlib.AbstractContextManager:
    """I8 broken: a label the server forgot right after a commit whose answer was lost is taken as never
    committed (LOST on its first send proves that only when the server answered that send)."""
    return _commit_phase_told({CommitOutcome.LOST_AFTER_SEND: CommitOutcome.LOST})


def prepared_batch_rolled_back() -> contextlib.AbstractContextManager:
    """I2 broken: a restart that finds a PREPARED record aborts its uncommitted transactions first (their
    commits then answer ABORTED and they are loaded again: the rows arrive, so only the I2 check sees it)."""
    recover_prepared = ExactlyOnceSink._recover_prepared

    def rolling_back(self, df, record):
        for ref in self.state.intents(self.job_id, record.query_id, record.batch_id):
            with contextlib.suppress(CommittedNotChosenError):  # what is committed stays so
                self.target.abort(ref)
        return recover_prepared(self, df, record)

    return _patched(ExactlyOnceSink, "_recover_prepared", rolling_back)


def labels_without_attempt() -> contextlib.AbstractContextManager:
    """I4/R7 broken: every task attempt of a partition gets the same label."""
    return _patched(WriteContext, "attempt", lambda self, task_attempt: f"e{self.epoch}w{self.write_pass}")


def no_recheck_after_begin() -> contextlib.AbstractContextManager:
    """R6 broken: a writer does not confirm its intent after begin, so a late begin leaks."""
    return _patched(PartitionWriter, "_confirm_intents", lambda self: None)


def commit_without_epoch_check() -> contextlib.AbstractContextManager:
    """M1, I5 broken for commits: `commit_pending` checks the epoch once, then its commits go out unchecked, so a
    fenced driver keeps committing (the per-commit `check_epoch` in `commit_one` undone)."""
    commit_pending = Committer.commit_pending

    def checking_once(self: Committer, batch: Any, on_commit: Any = None) -> Any:
        check = self.check_epoch
        checks = 0

        def first_only() -> None:  # the check at the phase's start stays; each commit's own goes
            nonlocal checks
            checks += 1
            if checks == 1:
                check()

        self.check_epoch = first_only  # type: ignore[method-assign]
        try:
            return commit_pending(self, batch, on_commit)
        finally:
            del self.check_epoch

    return _patched(Committer, "commit_pending", checking_once)


@contextlib.contextmanager
def abort_without_rereading_the_record() -> Iterator[None]:
    """M2, R5 undone: `abort --apply` takes the epoch and aborts every intent of the batch without reading its record
    again, so a driver that wrote PREPARED between the command's first read and the epoch loses the batch (I2)."""

    def abort_every_intent(committer: Committer, query_id: str, batch_id: int) -> int:
        return committer.abort_intents(query_id, batch_id)

    with _patched(cli, "abort_batch", abort_every_intent), _patched(actions_module, "abort_batch", abort_every_intent):
        yield


def later_wave_committed_before_its_record() -> contextlib.AbstractContextManager:
    """I1 broken for waves: a later wave's transactions are committed as soon as its writers prepared them, before
    the record holds them (the first wave keeps its PREPARED record first)."""
    write = ExactlyOnceSink._write

    def eager_later_waves(self, df, query_id, batch_id, *args, **kwargs):
        results = write(self, df, query_id, batch_id, *args, **kwargs)
        if kwargs.get("wave", 0) > 0 and kwargs.get("replay") is None:
            for result in results:
                for committable in result.committables:
                    self.target.commit(committable)
        return results

    return _patched(ExactlyOnceSink, "_write", eager_later_waves)


def waves_forgotten_at_recovery() -> contextlib.AbstractContextManager:
    """A PREPARED batch's unwritten waves are forgotten by a restart: it commits the recorded waves and marks the
    batch COMMITTED, as a release before waves would read the record (rows lost)."""
    recover_prepared = ExactlyOnceSink._recover_prepared

    def forgetting(self, df, record):
        return recover_prepared(self, df, dataclasses.replace(record, plan=None))

    return _patched(ExactlyOnceSink, "_recover_prepared", forgetting)


def record_completeness_unchecked() -> contextlib.AbstractContextManager:
    """I9 broken (review F3): a record that lacks labels the checkpoint says commits were sent for is taken as it is,
    so after a store rolled back inside a replay the batch is replayed again."""
    return _patched(ExactlyOnceSink, "_check_record_complete", lambda self, record: None)



def rerun_routes_unchecked() -> contextlib.AbstractContextManager:
    """Review N1 undone: a re-run writes a batch's unwritten waves from whatever its frame routes now."""
    return _patched(ExactlyOnceSink, "_check_routed_alike", lambda self, df, record: None)


def unsent_commits_left_as_sent() -> contextlib.AbstractContextManager:
    """N8 undone: a commit phase that failed before sending some commits leaves them listed as sent, so once the server
    forgets them (expired while the driver was down) a restart stops as ambiguous instead of replaying them."""
    return _patched(Committer, "_never_sent", lambda self, batch, labels: None)

