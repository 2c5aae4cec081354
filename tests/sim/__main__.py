"""Replay schedules and print their traces: `python -m tests.sim <seed> [<seed> ...] [key=value ...] [-v]`.

`key=value` sets a `Config` field (e.g. `store_rollback=True`), as a failing test's replay line says.
"""
import ast
import logging
import sys

logging.disable(logging.CRITICAL)

from .harness import Config, run_schedule  # noqa: E402

if __name__ == "__main__":
    arguments = sys.argv[1:]
    settings = dict(a.split("=", 1) for a in arguments if "=" in a)
    config = Config(**{k: ast.literal_eval(v) for k, v in settings.items()})
    failed = 0
    for seed in [int(a) for a in arguments if a.lstrip("-").isdigit()]:
        outcome = run_schedule(seed, config)
        print(outcome.describe() if outcome.violations else f"seed {seed}: ok (stopped={outcome.stopped})")
        if "-v" in arguments and not outcome.violations:
            print("\n".join(outcome.trace))
        failed += bool(outcome.violations)
    sys.exit(1 if failed else 0)
