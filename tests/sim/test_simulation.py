"""The sink's protocol under seeded schedules of crashes, lost answers, zombies, operators and store loss.

Fast loop: a few hundred seeds, one test each. Slow suite (CI): 2,000 more; extended suite: 12,000
beyond those (`SIM_SEEDS=<n>` changes either count). `SIM_SEED=<n>` runs one seed in both. A failure prints the seed, the broken
invariant, the trace and the replay command (`python -m tests.sim <seed> ...`).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from .harness import NEVER_SENT, Config, Outcome, run_schedule

FAST_SEEDS = 300
SLOW_SEEDS = 2_000
SLOW_FIRST = 100_000  # the slow run explores seeds the fast loop does not
EXTENDED_SEEDS = 12_000  # and the extended run seeds neither explores


def _seeds(first: int, count: int) -> list[int]:
    if os.environ.get("SIM_SEED"):
        return [int(os.environ["SIM_SEED"])]
    return list(range(first, first + count))


pytestmark = pytest.mark.usefixtures("quiet_logs")  # tests/support/fixtures.py


@pytest.mark.parametrize("seed", _seeds(0, FAST_SEEDS))
def test_schedule_keeps_exactly_once(seed: int) -> None:
    outcome = run_schedule(seed)
    assert not outcome.violations, outcome.describe()


def _failing(seeds: list[int]) -> list[Outcome]:
    """One worker's share of the seeds (a schedule runs on one core: its actors hand one baton around)."""
    logging.disable(logging.CRITICAL)
    return [o for o in map(run_schedule, seeds) if o.violations]


@pytest.mark.slow
def test_two_thousand_schedules_keep_exactly_once() -> None:
    _run_in_parallel(_seeds(SLOW_FIRST, int(os.environ.get("SIM_SEEDS", SLOW_SEEDS))))


@pytest.mark.slow
@pytest.mark.extended  # about 250 s on two cores; CI runs the 2,000 above
def test_twelve_thousand_more_schedules_keep_exactly_once() -> None:
    _run_in_parallel(_seeds(SLOW_FIRST + SLOW_SEEDS, int(os.environ.get("SIM_SEEDS", EXTENDED_SEEDS))))


def _run_in_parallel(seeds: list[int]) -> None:
    workers = min(os.cpu_count() or 1, 4)
    shares = [seeds[i::workers] for i in range(workers)]
    started = time.monotonic()
    # spawned, not forked: the test process may hold a JVM gateway and its threads
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failures = sorted((o for share in pool.map(_failing, shares) for o in share), key=lambda o: o.seed)
    elapsed = time.monotonic() - started
    print(f"{len(seeds)} schedules in {elapsed:.0f}s on {workers} processes")
    assert not failures, f"{len(failures)} failing seed(s): {[o.seed for o in failures]}\n" + failures[0].describe()


ROLLBACK = Config(store_rollback=True, store_wipe=False, zombie_driver=False, operator=False)


@pytest.mark.parametrize("seed", [771, 909])
def test_store_rolled_back_mid_batch(seed: int) -> None:
    """Found by this simulation: a store restored to a snapshot taken inside batch N, with N-1's record
    kept. 771: an older version of a record no longer names a committed attempt (loud stop, no duplicate);
    909: lost intents left prepared transactions behind (the restart's leftover sweep aborts them)."""
    outcome = run_schedule(seed, ROLLBACK)
    assert not outcome.violations, outcome.describe()


def test_store_wiped_during_the_first_batch() -> None:
    """Found by this simulation (seed 109225): no batch N-1 to miss, and the wipe lost the intents of
    prepared attempts; the checkpoint's prepared mark and the leftover sweep close it."""
    outcome = run_schedule(109225)
    assert not outcome.violations, outcome.describe()


def test_a_speculative_twin_killed_between_its_late_begin_and_its_first_load() -> None:
    """Found by a 40,000-seed run (seed 237347): the twin's intent came before the driver's final abort,
    its begin after it, and it died before loading or confirming. Its empty transaction is left to the
    server's timeout (its process is dead; runbook section 'Late writers and leftovers on the server').
    The checker used to call that an I6 breach."""
    outcome = run_schedule(237347)
    assert not outcome.violations, outcome.describe()


def test_a_late_twins_abort_whose_answer_is_lost_is_sent_again() -> None:
    """Found while looking for N8's schedules (seed 18 of this config): a speculative twin shut out of a committed batch
    aborted its transaction once, the answer was lost, and the simulated client gave up where the real targets send
    their idempotent rollback again; the checker reported the transaction left PREPARED (I3). The simulated target now
    sends it again too."""
    outcome = run_schedule(18, Config(commit_parallelism=1, label_memory=2, fault_kinds=("timeout-before",), faults=4))
    assert not outcome.violations, outcome.describe()


# Review F4: a label that answered LOST in the commit phase that first sent it provably never committed. Before
# d163fce nothing recorded that, so when the replay that followed was cut short (448: the replaying driver fenced by a
# new one; 644: killed) the next phase read the label as sent before and stopped with ReplayAmbiguousError: a stop
# the judgement calls needless (both seeds fail on 4a01413 with the sim of this commit). Now the label is recorded
# `never_committed` before the replay starts, and the next phase replays it. (448's schedule changed when operators'
# `recover` came to keep the checkpoint's marker, review N2; 45 took its place: without the proofs it stops with
# ReplayAmbiguousError. 45's changed when a commit unit came to count as sent from its epoch check on, review N8; 96,
# another schedule with a LOST first send, took its place.)
F4 = Config(faults=6, checkpoint_faults=False)


@pytest.mark.parametrize("seed", [96, 644])
def test_a_label_lost_on_its_first_send_is_replayed_after_a_cut_short_replay(seed: int) -> None:
    outcome = run_schedule(seed, F4)
    assert outcome.proved, "the schedule no longer answers LOST on a first send: pick another seed"
    assert not outcome.violations and outcome.stopped is None, outcome.describe()


def test_a_commit_that_landed_unheard_and_was_evicted_by_count_stops_rather_than_replays() -> None:
    """Issue 23: StarRocks counts running transactions against its label memory (label_keep_max_num), so a batch
    larger than it forgets its own labels while it commits. Here a commit lands, its answer is lost, and the label
    is gone when the target asks: the job stops (ReplayAmbiguousError) instead of replaying it. Before
    LOST_AFTER_SEND the target called it LOST, the first-send rule took that as proof of no commit, and the
    batch's row arrived twice."""
    outcome = run_schedule(647)
    assert any("timeout-after at server.commit" in line for line in outcome.trace), "no lost commit answer: pick another seed"
    assert not outcome.violations and outcome.stopped == "ReplayAmbiguousError", outcome.describe()


def test_a_label_lost_on_its_first_send_is_kept_when_the_commit_phase_fails_after_it() -> None:
    """Issue 23: outcomes are recorded as they arrive. Here a commit answers LOST on its first send (proof that it
    never committed), then the phase fails on a store timeout before its end; the next driver must not stop on that
    label. Before, the proof was written only at the phase's end, so it was lost, and the job stopped needlessly
    (ReplayAmbiguousError)."""
    outcome = run_schedule(32, Config(label_memory=2, fault_kinds=("timeout-after",), faults=4))
    assert outcome.proved, "the schedule no longer answers LOST on a first send: pick another seed"
    assert not outcome.violations and outcome.stopped is None, outcome.describe()


def test_a_commit_phase_stopped_at_an_epoch_check_records_that_unit_as_never_sent() -> None:
    """Review N8: the commit phase counted a unit as sent before its epoch check; that check timed out, so the
    unit's labels stayed listed as sent though no commit of them went out, and after downtime the restart stopped on
    them (ReplayAmbiguousError, a needless stop: seen failing with the unit counted before its check). A unit counts
    from its check on, and the restart replays those labels."""
    outcome = run_schedule(31, NEVER_SENT)
    assert any("timeout-before at store.current_epoch" in line for line in outcome.trace), "no epoch check timed out"
    assert not outcome.violations and outcome.stopped is None, outcome.describe()


def test_a_replanned_batch_stops_and_ends_exact_after_restore_offsets() -> None:
    """Review F2: the checkpoint is restored from a snapshot after a crash and Spark plans batch 2, PREPARED in the
    journal, with another range; the job stops (SourceReplannedError, nothing sent), the operator runs
    restore-offsets, and the job ends exact. On 4a01413 the same seed loses rows 4-6 and duplicates others."""
    outcome = run_schedule(5, Config(checkpoint_faults=True))
    assert outcome.remedies == 1, outcome.describe()
    assert not outcome.violations and outcome.stopped is None, outcome.describe()


def test_an_operator_after_a_store_rollback_never_aborts_a_newer_epochs_leftovers() -> None:
    """Found by the extended run (seed 110046): the store went back to a snapshot from epoch 1 while a driver of
    epoch 3 wrote a batch in waves; that driver stopped (StateStoreLostError), and an operator's `recover` took epoch 2
    from the rolled-back store and aborted the epoch-3 transactions it found on the server (I5). A leftover of a newer
    epoch than the process's own now stops it, as an intent of one does: that driver may still be alive."""
    outcome = run_schedule(110046)
    assert not outcome.violations, outcome.describe()


# Review N1: a batch in waves (a server that allows one transaction at a time) is re-run by a driver whose frame routes
# a message elsewhere (a table resolved for a new topic, a column changed). Each message must be visible once, in some
# table; the judge takes the stop as necessary only when the frame changed, and the operator undoes the change.
REROUTED = Config(txn_budget=1, reroute=True)


def test_a_restart_that_routes_a_message_of_a_batch_in_waves_elsewhere_stops_until_it_is_undone() -> None:
    """Seed 14: killed between the waves of batch 2, restarted with message 18 routed from t2 to t0; the re-run stops
    (RerunRoutedDifferentlyError) before writing, the operator restores the routing, and every message is loaded once.
    Without the check the message is in neither table."""
    outcome = run_schedule(14, REROUTED)
    assert outcome.remedies == 1 and any("FRAME message 18" in line for line in outcome.trace), outcome.describe()
    assert not outcome.violations and outcome.stopped is None, outcome.describe()


@pytest.mark.slow
@pytest.mark.extended
def test_a_thousand_schedules_with_frames_that_change_at_restarts_keep_exactly_once() -> None:
    failures = [o for o in (run_schedule(seed, REROUTED) for seed in _seeds(200_000, 1_000)) if o.violations]
    assert not failures, f"{len(failures)} failing seed(s): {[o.seed for o in failures]}\n" + failures[0].describe()


@pytest.mark.slow
@pytest.mark.extended
def test_a_thousand_schedules_with_a_store_rollback_in_each_keep_exactly_once() -> None:
    """The suite draws a rollback in 5 % of schedules; here every schedule has one (review 2026-11-27: the judge took
    proofs erased by the rollback as kept, seeds 959 and 2385 of such a run)."""
    config = Config(rollback_share=1.0)
    failures = [o for o in (run_schedule(seed, config) for seed in _seeds(300_000, 1_000)) if o.violations]
    assert not failures, f"{len(failures)} failing seed(s): {[o.seed for o in failures]}\n" + failures[0].describe()
