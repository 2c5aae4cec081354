"""Named crash points: kill -9 this process at a protocol step, for the exactly-once tests.

`STREAMING_SINK_CRASH_AT=<point>[@<batch>]` makes the driver SIGKILL itself when it reaches that
point (in that batch, or in any batch). Without the variable these calls do nothing. The driver is
the Python process and the Spark JVM it launched: both die at once, as with a lost machine, so the
JVM cannot go on to write anything after the Python side is gone.
"""
from __future__ import annotations

import os
import signal

ENV = "STREAMING_SINK_CRASH_AT"

POINTS = (
    "after-writers-prepared",  # every writer prepared, no PREPARED record yet: recovery must abort
    "after-prepared-record",  # PREPARED record durable, nothing committed: recovery must commit
    "after-first-commit",  # one committable committed, others not: recovery must finish
    "after-committed-record",  # COMMITTED record written, Spark's commit log not: re-run changes nothing
)

# Points only a batch committed in waves reaches (docs/design.md, "Waves"; tests/integration/test_commit_waves.py).
WAVE_POINTS = (
    "between-waves",  # a wave committed, the next not yet opened: recovery writes the remaining waves
    "after-wave-prepared",  # a later wave's committables recorded, none of them committed: recovery commits them
)

# Points of the packaged job between batches (job.py): no @<batch>.
JOB_POINTS = (
    "after-columns-added",  # a table gained columns for new fields, the batch that carries them not yet re-run
)
# Points inside one target's commit, declared by the target's module (`target_point`). A target does not know
# the batch, so these take no @<batch>: the first commit that reaches the point kills the driver.
TARGET_POINTS: set[str] = set()


def target_point(name: str) -> str:
    """Declare a crash point inside a target's own protocol; returns the name for the target to pass to `crash_point`."""
    TARGET_POINTS.add(name)
    return name


def crash_point(name: str, batch_id: int) -> None:
    """Hard-exit here if the environment asks for it (never returns in that case)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, batch = wanted.partition("@")
    known = (*POINTS, *WAVE_POINTS, *JOB_POINTS, *sorted(TARGET_POINTS))
    if point not in known:
        raise ValueError(f"{ENV}={wanted!r}: unknown point; known: {', '.join(known)}")
    if point == name and (not batch or int(batch) == batch_id):
        jvm = _local_spark_jvm_pid()
        if jvm is not None:
            os.kill(jvm, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _local_spark_jvm_pid() -> int | None:
    """The pid of the JVM that PySpark started for this driver, if it started one."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    process = getattr(SparkContext._gateway, "proc", None)
    return getattr(process, "pid", None)
