"""Replay one schedule and print its trace: `python -m tests.sim <seed> [<seed> ...]`."""
import logging
import sys

logging.disable(logging.CRITICAL)

from .harness import run_schedule

if __name__ == "__main__":
    failed = 0
    for seed in [int(a) for a in sys.argv[1:] if a != "-v"]:
        outcome = run_schedule(seed)
        print(outcome.describe() if outcome.violations else f"seed {seed}: ok (stopped={outcome.stopped})")
        if "-v" in sys.argv or outcome.violations:
            print("\n".join(outcome.trace))
        failed += bool(outcome.violations)
    sys.exit(1 if failed else 0)
