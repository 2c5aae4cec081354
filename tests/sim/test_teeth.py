"""The simulation has teeth: each deliberately broken protocol variant is caught within a seed budget,
and the unbroken protocol passes the very same seeds."""
from __future__ import annotations

import logging
from typing import Callable

import pytest

from . import broken
from .harness import Outcome, run_schedule

BUDGET = 400  # seeds each broken variant gets


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _first_violation(seeds: range) -> Outcome | None:
    for seed in seeds:
        outcome = run_schedule(seed)
        if outcome.violations:
            return outcome
    return None


@pytest.mark.parametrize("variant, expected", [
    (broken.commit_before_prepared_record, "I1"),
    (broken.abort_without_epoch_check, "I5"),
    (broken.replay_lost_after_commit_sent, "duplicate rows"),
    (broken.labels_without_attempt, ""),
    (broken.no_recheck_after_begin, "I3"),
], ids=lambda v: getattr(v, "__name__", v))
def test_broken_protocol_is_caught(variant: Callable, expected: str) -> None:
    with variant():
        caught = _first_violation(range(BUDGET))
    assert caught is not None, f"{variant.__name__}: no violation in {BUDGET} seeds"
    assert any(expected in v for v in caught.violations), caught.describe()
    clean = _first_violation(range(caught.seed + 1))
    assert clean is None, "the unbroken protocol fails the same seeds:\n" + clean.describe()
