"""The bench's rounds: a goal's ratio is taken within each round and judged on the median round."""
from __future__ import annotations

from bench.__main__ import _medians, goals


def run(mode: str, round_number: int, rows_per_s: float) -> dict:
    return {"mode": mode, "round": round_number, "rows_per_s": rows_per_s, "seconds": 1.0}


def test_a_goal_is_judged_on_the_median_of_its_per_round_ratios_not_on_the_median_runs() -> None:
    # the machine slows down in round 1: each mode's median run is not the one its ratio should be taken against
    runs = {"noop": [run("noop", 0, 100), run("noop", 1, 60), run("noop", 2, 90)],
            "alo-chdb-hand": [run("alo-chdb-hand", 0, 80), run("alo-chdb-hand", 1, 50), run("alo-chdb-hand", 2, 70)],
            "eo-chdb-file": [run("eo-chdb-file", 0, 84), run("eo-chdb-file", 1, 51), run("eo-chdb-file", 2, 77)]}
    throughput = _medians(runs)
    by_mode = {r["mode"]: r for r in throughput}
    assert by_mode["eo-chdb-file"]["rows_per_s"] == 77  # the median run
    assert [r["vs_noop"] for r in by_mode["eo-chdb-file"]["rounds"]] == [0.84, 0.85, 0.856]
    assert by_mode["eo-chdb-file"]["vs_noop"] == 0.85  # the median round's ratio, not the median run's (0.856)
    goal = next(g for g in goals({"throughput": throughput}) if "hand-written" in g["goal"])
    assert goal["rounds"] == [1.02, 1.05, 1.1]  # 51/50, 84/80, 77/70, sorted
    assert goal["value"] == 1.05 and goal["met"] is True


def test_a_single_round_is_judged_as_before_and_a_mode_missing_a_round_is_compared_where_both_ran() -> None:
    runs = {"noop": [run("noop", 0, 100), run("noop", 1, 100)], "eo-chdb-file": [run("eo-chdb-file", 1, 70)]}
    judged = goals({"throughput": _medians(runs)})
    goal = next(g for g in judged if g["goal"].startswith("embedded ClickHouse exactly-once (file store) >= 0.8"))
    assert goal["value"] == 0.7 and goal["met"] is False and "rounds" not in goal
