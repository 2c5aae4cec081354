"""The simulation has teeth: each deliberately broken protocol variant is caught within a seed budget,
and the unbroken protocol passes the very same seeds."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from . import broken
from .harness import NEVER_SENT, Config, Outcome, run_schedule

BUDGET = 400  # seeds each broken variant gets


pytestmark = pytest.mark.usefixtures("quiet_logs")  # tests/support/fixtures.py


def _first_violation(seeds: range, config: Config | None = None) -> Outcome | None:
    for seed in seeds:
        outcome = run_schedule(seed, config) if config else run_schedule(seed)
        if outcome.violations:
            return outcome
    return None


# Without the re-check after begin, a late writer's transaction is left to whoever can find it: a
# server that lists open transactions lets the next restart abort it, so the leak shows where it cannot. It leaks only
# when a late attempt (a slow executor's, declared lost, or a speculative twin) records its intent before the batch's
# record closes the gate and begins after the driver's final abort: at the default share of late attempts about one
# schedule in 200 has that (seed 187 first, or 535 once uncounted passes changed what the seeds draw), so here many
# attempts run late.
UNLISTED = Config(lists_leftovers=False, slow_tasks=0.4, speculative_tasks=0.2)
# A fenced driver's unchecked commits show when commits run in the pool (no progress write between them stops a
# fenced worker) and operators take the epoch in the middle of a commit phase.
RACED_COMMITS = Config(commit_parallelism=4, operators=2, operator_actions=("recover",))
# `abort --apply` undoing R5 needs the driver's PREPARED write between the command's first read and its epoch:
# several abort commands race each batch's decision.
RACED_ABORTS = Config(operators=3, operator_actions=("abort",))


# A commit answer lost after it landed, the label forgotten at once: a label memory (running transactions
# counted, as StarRocks does) smaller than a batch, and lost answers as the only faults.
LABEL_MEMORY = Config(label_memory=2, fault_kinds=("timeout-after",), faults=4)
# Batches in waves: a server that allows one transaction at a time, so every batch of more than one writer's table
# commits in several waves.
WAVES = Config(txn_budget=1)
# A store rolled back in every schedule, to a snapshot taken inside a batch, and a label memory of two: the record that
# went back lacks labels whose commits were sent, and the server forgot them (review F3). At the default share of
# rollbacks (5 %) the unchecked record survived 4,000 seeds of the suite (review 2026-11-27, "Mutants").
# Batches in waves, and a frame that routes a message of the re-run batch elsewhere at a restart (review N1).
REROUTED = Config(txn_budget=1, reroute=True)
ROLLED_BACK = Config(rollback_share=1.0, label_memory=2, store_wipe=False, zombie_driver=False)


@pytest.mark.parametrize("variant, expected, config", [
    (broken.commit_before_prepared_record, "I1", None),
    (broken.abort_without_epoch_check, "I5", None),
    (broken.replay_lost_after_commit_sent, "duplicate rows", None),
    (broken.lost_after_send_taken_as_lost, "duplicate rows", LABEL_MEMORY),
    (broken.prepared_batch_rolled_back, "I2", None),
    (broken.labels_without_attempt, "I4", None),
    (broken.no_recheck_after_begin, "I3", UNLISTED),
    (broken.commit_without_epoch_check, "I5", RACED_COMMITS),
    (broken.abort_without_rereading_the_record, "I2", RACED_ABORTS),
    (broken.later_wave_committed_before_its_record, "I1", WAVES),
    (broken.waves_forgotten_at_recovery, "missing", WAVES),
    (broken.record_completeness_unchecked, "duplicate rows", ROLLED_BACK),
    (broken.rerun_routes_unchecked, "not visible exactly once", REROUTED),
    (broken.unsent_commits_left_as_sent, "not necessary", NEVER_SENT),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_broken_protocol_is_caught(variant: Callable, expected: str, config: Config | None) -> None:
    with variant():
        caught = _first_violation(range(BUDGET), config)
    assert caught is not None, f"{variant.__name__}: no violation in {BUDGET} seeds"
    assert any(expected in v for v in caught.violations), caught.describe()
    clean = _first_violation(range(caught.seed + 1), config)
    assert clean is None, "the unbroken protocol fails the same seeds:\n" + clean.describe()
