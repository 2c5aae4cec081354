"""Whether a micro-batch is planned, and its plan: how many transactions it may hold, spread and waves.

The sink asks once per batch, on its first pass (a re-run follows the plan its record holds). Most batches need
no plan: then nothing is counted and the batch is written as before plans existed, in one round. A planned batch
whose tables do not fit one round commits in waves, each its own two-phase round in the journal (docs/design.md,
"Waves"); the per-wave budget is a share of the tighter of the server's limits (`batch_plan.py`).
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

from .batch_plan import BatchPlan, ServerLimits, TransactionBudget, needs_plan, plan_batch
from .routing import Router
from .targets.base import ConfigurationError, Target

log = logging.getLogger(__name__)

#: `spread`: "auto" spreads a table's rows over a bounded number of writers when the batch is planned, "always"
#: plans and spreads every batch, "never" keeps rows in the partition they arrived in (waves only).
SPREADS = ("auto", "always", "never")


class BatchCounts(Protocol):
    """What a plan is made from: the part of the sink's `WriterRunner` that counts a batch."""

    def writer_count(self, data: Any, target: Target) -> int: ...

    def table_rows(self, data: Any, router: Router) -> dict[str, int]: ...


class BatchPlanner:
    """The job's transaction budget and how its batches are planned: fixed at start-up, asked once per batch."""

    def __init__(self, share: float, spread: str, spread_above: int) -> None:
        if not 0 < share <= 1:
            raise ConfigurationError(f"transaction_share must be above 0 and at most 1, got {share}")
        if spread not in SPREADS:
            raise ConfigurationError(f"spread {spread!r}: one of {', '.join(SPREADS)}")
        if spread_above < 1:
            raise ConfigurationError(f"spread_above must be at least 1, got {spread_above}")
        self.share, self.spread, self.spread_above = share, spread, spread_above
        self.budget = TransactionBudget(ServerLimits(), share)

    def start(self, target: Target) -> None:
        """Read the server's limits (once per driver: they are per database and change only with its config)."""
        self.budget = TransactionBudget(target.server_limits(), self.share)

    def plan(self, runner: BatchCounts, data: Any, target: Target, router: Router, tables: int | None) -> BatchPlan | None:
        """The batch's plan, or None: it cannot pass the budget (or `spread_above`), or nothing would change."""
        per_wave = self.budget.per_wave
        in_driver = target.runs_writers_in_driver  # one writer: nothing to spread, waves only
        spread = self.spread != "never" and not in_driver
        if per_wave is None and (not spread or tables == 1):  # no waves, and spreading one table lowers nothing
            return None
        writers = runner.writer_count(data, target)
        if self.spread != "always" and not needs_plan(tables, writers, per_wave, self.spread_above):
            return None
        plan = plan_batch(runner.table_rows(data, router), writers, per_wave, spread)
        for note in plan.notes:
            log.warning("batch plan: %s", note)
        return plan if plan.waves else None
