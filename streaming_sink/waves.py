"""Whether a micro-batch is planned, and its plan: how many transactions it may hold, spread and waves.

The sink asks once per batch, on its first pass (a re-run follows the plan its record holds). Most batches need
no plan: then nothing is counted and the batch is written as before plans existed, in one round. A planned batch
whose tables do not fit one round commits in waves, each its own two-phase round in the journal (docs/design.md,
"Waves"); the per-wave budget is a share of the tighter of the server's limits (`batch_plan.py`).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any, Protocol

from .batch_plan import BatchPlan, ServerLimits, TransactionBudget, needs_plan, plan_batch
from .committable import TxnRef
from .routing import Router
from .targets.base import ConfigurationError, Target, TransactionLimitError

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
        if not (hasattr(runner, "writer_count") and hasattr(runner, "table_rows")):
            return None  # a runner written before plans existed cannot count: every batch in one round, as then
        per_wave = self.budget.per_wave
        in_driver = target.runs_writers_in_driver  # one writer: nothing to spread, waves only
        spread = self.spread != "never" and not in_driver
        if per_wave is None and (not spread or tables == 1):  # no waves, and spreading one table lowers nothing
            return None
        writers = runner.writer_count(data, target)
        if writers == 0:  # no partition, no row: Kafka gives a batch of empty offset ranges none
            return None
        if self.spread != "always" and not needs_plan(tables, writers, per_wave, self.spread_above):
            return None
        plan = plan_batch(runner.table_rows(data, router), writers, per_wave, spread)
        for note in plan.notes:
            log.warning("batch plan: %s", note)
        return plan if plan.waves else None


def too_many_transactions(job_id: str, batch_id: int, held: Iterable[TxnRef], refused: TransactionLimitError,
                          plan: BatchPlan | None = None, wave: int = 0) -> str:
    """What the batch (its unrecorded wave) needs and what the server allows, in one line: it cannot fit, and retrying
    it the same way fails the same way (docs/protocol.md, StarRocks: concurrency and limits; Doris: timeouts and
    label retention). With a plan, what the refused wave holds by it (the waves before it are committed and hold
    none, N5); without, `held`: the batch's intents when the server refused."""
    if plan is not None:
        tables = plan.waves[wave]
        needed, table_count = plan.transactions(wave), len(tables)
        writers = f"{max(plan.writers[t] for t in tables)} writers"
    else:
        pairs = {(ref.table, ref.partition) for ref in held}
        needed, table_count = len(pairs), len({t for t, _ in pairs})
        writers = f"{len({p for _, p in pairs})} writers so far"
    limit = re.search(r"larger than limit (\d+)", str(refused))
    return (
        f"job {job_id} batch {batch_id} needs at least {needed} transactions open at once (one per table "
        f"per writer: {table_count} tables, {writers}), but the "
        f"server allows {limit.group(1) if limit else 'fewer'} running transactions per database "
        "(max_running_txn_num_per_db; a prepared transaction counts until the batch commits). Everything the "
        f"batch held beyond its record is rolled back. The server said: {str(refused).splitlines()[0]} " + TransactionLimitError.RUNBOOK
    )
