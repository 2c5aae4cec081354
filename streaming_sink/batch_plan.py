"""How a micro-batch's tables reach writers and transactions, within what the server allows.

A batch of T tables written by P writers can hold T x P transactions open at once: every writer that sees a
table's rows begins a transaction for it. Servers cap that (StarRocks and Doris: running transactions per
database, prepared ones included; both also remember only so many labels), and each transaction costs round trips
whatever its rows. So when a batch could pass the budget (`needs_plan`), its tables are counted and planned:

* **spread**: each table's rows go to a bounded number of writers, sized from its share of the batch (one for a
  small table, up to P for the biggest), so the batch holds about T transactions, not T x P;
* **waves**: tables are packed, in name order, into waves whose transactions fit the budget; each wave is its own
  two-phase round in the journal (prepared, recorded, committed), so a batch of any number of tables fits.

The plan is a pure function of the batch's per-table row counts, the writers' number and the budget, so a re-run
of the same batch plans the same; the journal keeps it anyway (`to_json`), and recovery follows the recorded one.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: The share of a server's limits one batch may take by default: other jobs and loads share the database.
DEFAULT_SHARE = 0.5


@dataclass(frozen=True)
class ServerLimits:
    """What a target's server allows at once, per database; None: no such limit (or unknown and unbounded)."""

    running_transactions: int | None = None  # begun and not yet committed or aborted, prepared ones included
    label_memory: int | None = None  # labels the server remembers (running + finished) before it forgets the oldest
    source: str = "none"  # where the numbers come from, for `doctor` ("read from the server", "release default …")


@dataclass(frozen=True)
class TransactionBudget:
    """The transactions one batch (one wave of it) may hold open: a share of the tighter of the server's limits."""

    limits: ServerLimits
    share: float = DEFAULT_SHARE

    @property
    def per_wave(self) -> int | None:
        """At most this many transactions per wave (None: unbounded)."""
        caps = [cap for cap in (self.limits.running_transactions, self.limits.label_memory) if cap]
        return max(1, math.floor(min(caps) * self.share)) if caps else None


def needs_plan(tables: int | None, writers: int, budget: int | None, spread_above: int) -> bool:
    """Whether a batch may hold more transactions than the budget or `spread_above` (tables x writers at most), so
    its tables are worth counting and planning. `tables` None: the target cannot say how many there may be."""
    if tables is None:
        return True
    bound = tables * writers
    return bound > spread_above or (budget is not None and bound > budget)


@dataclass(frozen=True)
class BatchPlan:
    """Writers per table and the batch's waves. `spread` False: rows stay in the partition they arrived in (a table
    then reaches at most `writers[table]` writers: the partitions, or its rows when fewer)."""

    writers: Mapping[str, int]  # table -> the most writers its rows reach (its transactions in the batch)
    waves: tuple[tuple[str, ...], ...]  # the tables of each wave, in commit order
    spread: bool = False
    budget: int | None = None  # the per-wave budget the plan was made for (None: unbounded)
    notes: tuple[str, ...] = field(default=())  # what could not fit, for logs and `doctor`
    #: the writers the batch had when planned: a spread wave runs on at most this many Spark partitions (None: one
    #: per slot), so many small tables share a task instead of each paying for one
    partitions: int | None = None
    #: the rows per table the plan was made from (tables without rows left out): a re-run that writes a later wave
    #: must route as the first run did (`BatchRecord.rerun_differences`). Empty in a plan an earlier release recorded.
    rows: Mapping[str, int] = field(default_factory=dict)

    def in_wave(self, table: str, wave: int) -> bool:
        """Whether `wave` writes `table`'s rows: a planned table in its wave; every table the plan does not name (a
        routing the plan's count could not see) in the last wave, so no row is left out of every wave. The writers
        (`WriteContext.writes`) and the Spark runner's filter (`spread.py`) both follow this rule."""
        if table in self.writers:
            return table in self.waves[wave]
        return wave == len(self.waves) - 1

    def wave_of(self, table: str) -> int:
        for index, tables in enumerate(self.waves):
            if table in tables:
                return index
        raise KeyError(table)

    def transactions(self, wave: int) -> int:
        """The most transactions `wave` holds open at once."""
        return sum(self.writers[table] for table in self.waves[wave])

    def to_json(self) -> str:
        return json.dumps({"writers": dict(sorted(self.writers.items())), "waves": [list(w) for w in self.waves],
                           "spread": self.spread, "budget": self.budget, "notes": list(self.notes),
                           "partitions": self.partitions, "rows": dict(sorted(self.rows.items()))}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BatchPlan:
        data = json.loads(text)
        return cls({str(t): int(n) for t, n in data["writers"].items()}, tuple(tuple(w) for w in data["waves"]),
                   bool(data["spread"]), data["budget"], tuple(data.get("notes", ())), data.get("partitions"),
                   {str(t): int(n) for t, n in data.get("rows", {}).items()})


def plan_batch(table_rows: Mapping[str, int], writers: int, budget: int | None, spread: bool) -> BatchPlan:
    """The plan for a batch with `table_rows` (table -> rows, tables without rows left out) over `writers` writers.

    Spread: a table gets writers in proportion to its rows (at least one, at most `writers`, at most the budget).
    Not spread: a table reaches at most min(writers, rows) writers, which spreading cannot lower; a table that alone
    passes the budget gets a wave of its own and the server decides (the sink then says what the batch needed).
    Waves pack tables in name order, first fit, so the same counts always make the same waves.
    """
    if writers < 1:
        raise ValueError(f"writers must be at least 1, got {writers}")
    total = sum(table_rows.values())
    per_table: dict[str, int] = {}
    notes: list[str] = []
    for table in sorted(table_rows):
        rows = table_rows[table]
        if spread:
            wanted = max(1, min(writers, math.ceil(writers * rows / total) if total else 1))
            count = min(wanted, budget) if budget is not None else wanted
        else:
            count = max(1, min(writers, rows))
            if budget is not None and count > budget:
                notes.append(f"table {table!r} alone reaches {count} writers, over the budget of {budget} transactions")
        per_table[table] = count
    waves: list[tuple[str, ...]] = []
    current: list[str] = []
    held = 0
    for table in sorted(per_table):
        count = per_table[table]
        if current and budget is not None and held + count > budget:
            waves.append(tuple(current))
            current, held = [], 0
        current.append(table)
        held += count
    if current:
        waves.append(tuple(current))
    return BatchPlan(per_table, tuple(waves), spread, budget, tuple(notes), writers, dict(table_rows))
