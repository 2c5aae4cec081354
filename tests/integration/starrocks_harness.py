"""The StarRocks emulator as a `devstack.pipeline.TargetAdapter`, and the task-side fault hooks.

The emulator runs in the pytest process; the driver child (and its Spark tasks) reach it over
loopback with a password, so every FE->BE 307 must carry the credentials again.

Task-side faults cannot come from the server (a task that dies *after* its prepare succeeded, a
speculative duplicate), so the driver child runs `tests.integration.starrocks_driver` instead of
`streaming_sink.job`:
it is the packaged job with the StarRocks target wrapped by `HookedStarRocksTarget`, which reads
its instructions from environment variables that Spark's Python workers inherit:

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
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streaming_sink import job
from streaming_sink.committable import TxnRef
from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from streaming_sink.targets.base import NewRef, PreparedPart, RecordIntent, TableTransaction
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.emulators.starrocks import StarRocksEmulator

DIE_AFTER_PREPARE = "SS_TEST_DIE_AFTER_PREPARE"
TWIN = "SS_TEST_TWIN"
COLUMNS = [("id", "BIGINT"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"),
           ("kafka_offset", "BIGINT")]
OPEN_STATES = ("PREPARE", "PREPARED")


@dataclass
class StarRocksEmulatorAdapter:
    """Reads the emulator directly (it is in this process); the driver reaches it over HTTP."""

    emulator: StarRocksEmulator
    options: dict[str, Any] = field(default_factory=dict)

    def target_url(self) -> str:
        return f"starrocks://127.0.0.1:{self.emulator.fe_port}"

    def target_options(self) -> dict[str, Any]:
        from devstack.pipeline import TABLES

        return {"tables": TABLES, "backoff_s": 0.05, "backoff_max_s": 0.5, "read_timeout": 20.0, **self.options}

    def env(self) -> dict[str, str]:
        return {USER_ENV: self.emulator.user, PASSWORD_ENV: self.emulator.password}

    def create_tables(self, database: str, tables: list[str]) -> None:
        for table in tables:
            self.emulator.create_table(database, table, COLUMNS)

    def rows(self, database: str, table: str) -> list[tuple]:
        return sorted(self.emulator.visible_rows(database, table))

    def problems(self, database: str) -> list[str]:
        """Transactions left open, and labels with more than one committed transaction."""
        txns = self.emulator.transactions(database)
        found = [f"{t['label']} left {t['state']}" for t in txns if t["state"] in OPEN_STATES]
        committed: dict[str, int] = {}
        for t in txns:
            if t["state"] in ("COMMITTED", "VISIBLE"):
                committed[t["label"]] = committed.get(t["label"], 0) + 1
        found += [f"{label} committed {n} times" for label, n in committed.items() if n > 1]
        return found


# -- the hooked driver (runs in the driver child and, pickled, in its Spark tasks) ----------------


def _task_matches(variable: str) -> bool:
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


class HookedStarRocksTarget(StarRocksTarget):
    """A StarRocksTarget whose transactions obey the test hooks above."""

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        inner = super().begin(table, new_ref, record_intent)
        twin = None
        if _task_matches(TWIN):
            def twin_ref(chunk: int) -> TxnRef:
                ref = new_ref(chunk)
                return TxnRef(ref.target, ref.database, ref.table, ref.label[:110] + "_twin",
                              ref.partition, ref.attempt + "twin")

            twin = super().begin(table, twin_ref, record_intent)
        return _HookedTransaction(inner, twin)


class _HookedTransaction(TableTransaction):
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
        if _task_matches(DIE_AFTER_PREPARE):
            sys.stderr.write("test hook: Python worker dies after prepare\n")
            sys.stderr.flush()
            os._exit(17)
        return parts

    def abort(self) -> None:
        self._inner.abort()


def hooked_target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Any:
    """`target_from_url`, with the StarRocks target swapped for the hooked one (same state)."""
    target = _real_target_from_url(url, database, options)
    hooked = HookedStarRocksTarget.__new__(HookedStarRocksTarget)
    hooked.__dict__.update(target.__dict__)
    return hooked


_real_target_from_url = job.target_from_url
