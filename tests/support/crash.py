"""What the end-to-end exactly-once suites share: where a kill at a protocol point must leave the journal, the seeds,
and the task hooks that the hooked targets obey (faults only a Spark task can have).

A target's hooked variant registers through `streaming_sink.targets.register` in the driver child: the pipeline runs
`python -m tests.support.crash` with `SS_TEST_HOOKED_TARGET=<module>` (`hooked_driver_settings`), which registers
that module's `HOOKED` descriptor (`hooked_descriptor`) and runs the packaged job.

The hooks are environment variables that Spark's Python workers inherit from the driver child:

* `SS_TEST_DIE_AFTER_PREPARE=<batch>:<partition>`: the first attempt of that task hard-exits its
  Python worker right after its transactions are prepared (no abort runs, like a lost executor);
  `spark.master=local[2,3]` lets Spark retry the task.
* `SS_TEST_TWIN=<batch>:<partition>`: that task also writes and prepares everything through a twin
  attempt whose result is thrown away, which is what a speculative attempt that lost the race
  leaves behind (Spark runs no speculative copies in local mode, where every executor is one host).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from streaming_sink.committable import TxnRef
from streaming_sink.records import BatchState
from streaming_sink.targets.base import NewRef, PreparedPart, RecordIntent, TableTransaction, Target
from streaming_sink.targets.descriptor import TargetDescriptor

DIE_AFTER_PREPARE = "SS_TEST_DIE_AFTER_PREPARE"
TWIN = "SS_TEST_TWIN"
HOOKED_TARGET = "SS_TEST_HOOKED_TARGET"  # the module whose `HOOKED` descriptor the driver child registers


def assert_stopped_at(scenario: Any, point: str, batch: int, commits_in_parallel: bool = False) -> None:
    """The kill happened where it was asked to: the journal of `batch` shows that exact protocol step.
    With commits in parallel, others may have finished before the kill at the first landed, never all."""
    record, intents, done = scenario.batch_state(batch)
    if point == "after-writers-prepared":
        assert record is None and intents, "writers should have prepared with intents, and no record yet"
    elif point == "after-prepared-record":
        assert record.state is BatchState.PREPARED and not done
    elif point == "after-first-commit":
        most = len(record.committables) - 1 if commits_in_parallel else 1
        assert record.state is BatchState.PREPARED and 1 <= len(done) <= most < len(record.committables)
    elif point == "after-committed-record":
        assert record.state is BatchState.COMMITTED
    else:
        raise AssertionError(point)


def kill_seeds(default: str = "23") -> list[int]:
    """One seed per run of a suite (the soak, scripts/soak.sh, kills dozens of times); KILL_SEEDS=11,23,37 runs more."""
    return [int(s) for s in os.environ.get("KILL_SEEDS", default).split(",")]


# -- task hooks (run in the driver child's Spark tasks, inside the hooked targets) ----------------------------------


def task_matches(variable: str) -> bool:
    """True in the first attempt of the task the variable names (`<batch>:<partition>`)."""
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is None or task.attemptNumber() != 0:
        return False
    batch, partition = wanted.split(":")
    return task.getLocalProperty("streaming.sql.batchId") == batch and task.partitionId() == int(partition)


def hooked_begin(begin: Callable[[str, NewRef, RecordIntent], TableTransaction], table: str, new_ref: NewRef,
                 record_intent: RecordIntent, twin_label: Callable[[str], str]) -> TableTransaction:
    """A target's `begin`, its transaction obeying the hooks; a twin's transactions are labelled `twin_label(label)`."""
    inner = begin(table, new_ref, record_intent)
    if not task_matches(TWIN):
        return HookedTransaction(inner, None)

    def twin_ref(chunk: int) -> TxnRef:
        ref = new_ref(chunk)
        return replace(ref, label=twin_label(ref.label), attempt=ref.attempt + "twin")

    return HookedTransaction(inner, begin(table, twin_ref, record_intent))


class HookedTransaction(TableTransaction):
    """A task's transaction, with its losing twin (TWIN) and its worker's death after prepare (DIE_AFTER_PREPARE)."""

    def __init__(self, inner: TableTransaction, twin: TableTransaction | None) -> None:
        self._inner, self._twin = inner, twin

    def write(self, chunk: pa.Table) -> None:
        if self._twin is not None:
            self._twin.write(chunk)
        self._inner.write(chunk)

    def prepare(self) -> list[PreparedPart]:
        if self._twin is not None:
            self._twin.prepare()  # prepared, and its result dropped: the loser of a speculative race
        parts = self._inner.prepare()
        if task_matches(DIE_AFTER_PREPARE):
            sys.stderr.write("test hook: Python worker dies after prepare\n")
            sys.stderr.flush()
            os._exit(17)
        return parts

    def abort(self) -> None:
        self._inner.abort()


# -- the hooked driver: the packaged job with a target's hooked descriptor registered -------------------------------


def hooked_descriptor(descriptor: TargetDescriptor, hooked: type[Target]) -> TargetDescriptor:
    """`descriptor`, its targets built as `hooked` (a subclass of its target class whose `begin` obeys the hooks)."""
    return replace(descriptor, factory=_HookedFactory(descriptor, hooked))


class _HookedFactory:
    """The descriptor's factory, then the target's class swapped for the hooked one (same state)."""

    def __init__(self, descriptor: TargetDescriptor, hooked: type[Target]) -> None:
        self.descriptor, self.hooked = descriptor, hooked

    def __call__(self, address: str, database: str, user: str | None, password: str | None,
                 options: Mapping[str, Any]) -> Target:
        target = self.descriptor.factory(address, database, user, password, options)
        if not isinstance(target, self.hooked.__mro__[1]):
            return target
        hooked = self.hooked.__new__(self.hooked)
        hooked.__dict__.update(target.__dict__)
        return hooked


def hooked_driver_settings(module: str) -> dict[str, Any]:
    """`LocalPipeline` arguments that run the driver child with `module`'s `HOOKED` descriptor registered."""
    return {"driver_module": "tests.support.crash", "driver_env": {HOOKED_TARGET: module}}


def main() -> int:
    import importlib

    from streaming_sink import job
    from streaming_sink.targets import register

    register(importlib.import_module(os.environ[HOOKED_TARGET]).HOOKED)
    return job.main()


if __name__ == "__main__":
    sys.exit(main())
