"""The batch plan: writers per table and waves, a pure function of the batch's counts and the budget."""
from __future__ import annotations

import pytest

from streaming_sink.batch_plan import BatchPlan, ServerLimits, TransactionBudget, needs_plan, plan_batch


def test_budget_is_a_share_of_the_tighter_limit() -> None:
    assert TransactionBudget(ServerLimits(1000, 1000), share=0.5).per_wave == 500
    assert TransactionBudget(ServerLimits(100, 2000), share=0.5).per_wave == 50
    assert TransactionBudget(ServerLimits(None, 1000), share=0.25).per_wave == 250
    assert TransactionBudget(ServerLimits()).per_wave is None
    assert TransactionBudget(ServerLimits(1, None), share=0.1).per_wave == 1


def test_a_single_table_or_a_small_batch_needs_no_plan() -> None:
    assert not needs_plan(1, 1, 50, spread_above=100)
    assert not needs_plan(2, 4, 50, spread_above=100)  # 8 transactions at most
    assert needs_plan(20, 4, 50, spread_above=100)  # 80 > the budget of 50
    assert needs_plan(300, 4, None, spread_above=100)  # 1200 > 100: spread even where the server has no limit
    assert needs_plan(None, 4, None, spread_above=100)  # the target cannot say how many tables


def test_spread_gives_small_tables_one_writer_and_big_ones_more() -> None:
    plan = plan_batch({"big": 9000, "small": 10, "tiny": 1}, writers=8, budget=None, spread=True)
    assert plan.writers == {"big": 8, "small": 1, "tiny": 1}
    assert plan.waves == (("big", "small", "tiny"),)
    assert plan.transactions(0) == 10


def test_without_spread_a_table_reaches_at_most_its_rows_in_writers() -> None:
    plan = plan_batch({"a": 2, "b": 40}, writers=4, budget=None, spread=False)
    assert plan.writers == {"a": 2, "b": 4}


def test_waves_pack_tables_in_name_order_within_the_budget() -> None:
    rows = {f"t{i:03d}": 40 for i in range(300)}
    plan = plan_batch(rows, writers=4, budget=50, spread=True)
    assert all(plan.transactions(w) <= 50 for w in range(len(plan.waves)))
    assert [t for wave in plan.waves for t in wave] == sorted(rows)
    assert len(plan.waves) == 6  # 300 one-writer tables, 50 per wave
    unspread = plan_batch(rows, writers=4, budget=50, spread=False)
    assert len(unspread.waves) == 25 and all(unspread.transactions(w) <= 50 for w in range(len(unspread.waves)))


def test_a_table_wider_than_the_budget_is_cut_to_it_when_spread_and_noted_when_not() -> None:
    assert plan_batch({"big": 10_000}, writers=64, budget=16, spread=True).writers == {"big": 16}
    alone = plan_batch({"a": 1, "big": 10_000, "c": 1}, writers=64, budget=16, spread=False)
    assert alone.waves == (("a",), ("big",), ("c",)) and alone.notes


def test_the_same_counts_make_the_same_plan_and_it_survives_the_journal() -> None:
    rows = {f"t{i}": i * 7 + 1 for i in range(50)}
    first, again = plan_batch(rows, 6, 20, True), plan_batch(dict(reversed(list(rows.items()))), 6, 20, True)
    assert first == again
    assert BatchPlan.from_json(first.to_json()) == first


def test_no_writers_is_a_mistake() -> None:
    with pytest.raises(ValueError):
        plan_batch({"a": 1}, 0, None, True)


def test_a_table_the_plan_does_not_name_belongs_to_the_last_wave_only() -> None:
    plan = BatchPlan({"a": 1, "b": 1}, (("a",), ("b",)))
    assert [plan.in_wave("a", w) for w in (0, 1)] == [True, False]
    assert [plan.in_wave("dead_letters", w) for w in (0, 1)] == [False, True]
