"""StarRocks in the tests: the emulator's target with the tests' defaults, and `StarRocksAdapter`, the one adapter
of the pipeline and the crash matrix.

The emulator runs in the pytest process; the driver child (and its Spark tasks) reach it over
loopback with a password, so every FE->BE 307 must carry the credentials again.

Task-side faults cannot come from the server (a task that dies *after* its prepare succeeded, a
speculative duplicate), so the driver child registers `HOOKED`: the StarRocks descriptor building
`HookedStarRocksTarget`, which obeys the task hooks of tests/support/crash.py (`SS_TEST_DIE_AFTER_PREPARE`,
`SS_TEST_TWIN`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from streaming_sink.targets import starrocks
from streaming_sink.targets.base import NewRef, RecordIntent, TableTransaction
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.crash import DIE_AFTER_PREPARE, TWIN, hooked_begin, hooked_descriptor
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.pipeline import DB
from tests.support.targets.base import EmulatorAdapter

__all__ = ["DIE_AFTER_PREPARE", "FAST", "HOOKED", "PASSWORD", "TWIN", "HookedStarRocksTarget", "StarRocksAdapter",
           "starrocks_target"]
PASSWORD = "s3cret"
OPEN_STATES = ("PREPARE", "PREPARED")

#: the fast defaults of a target on an emulator in this process (no backoff, a short read timeout)
FAST = {"backoff_s": 0.0, "backoff_max_s": 0.0, "read_timeout": 5.0}


def starrocks_target(emulator: Any, database: str = "db", **options: Any) -> StarRocksTarget:
    """A StarRocksTarget on `emulator` (tests/support/doubles/emulators/starrocks.py) as its user, with `FAST` under `options`."""
    return StarRocksTarget(emulator.fe_url, database, emulator.user, emulator.password, **{**FAST, **options})


class StarRocksAdapter(EmulatorAdapter):
    """The StarRocks emulator. In the matrix: 180 messages, 45 a trigger over 3 partitions (3 tasks a batch), writers
    in Spark tasks that may retry (`local[2,3]`), the hooked driver."""

    name = "starrocks"
    default_seed = "29"
    random_kill_wait_s = 2.0
    chain_options = {"commit_parallelism": 1}  # so "after-first-commit" leaves exactly one of the batch's commits done
    pipeline_defaults = {"messages_per_partition": 60, "max_offsets_per_trigger": 45,
                         "spark_conf": {"spark.master": "local[2,3]"}}
    hooked_module = __name__
    defaults: ClassVar[dict[str, Any]] = {"backoff_s": 0.05, "backoff_max_s": 0.5, "read_timeout": 20.0}
    emulator: StarRocksEmulator

    @classmethod
    def new_emulator(cls, root: Path) -> StarRocksEmulator:
        return StarRocksEmulator(root / "starrocks", password=PASSWORD)

    def open_labels(self) -> list[str]:
        """Transactions begun or prepared and not settled, in any batch."""
        return [t["label"] for t in self.emulator.transactions(DB) if t["state"] in OPEN_STATES]


# -- the hooked target (built in the driver child and, pickled, in its Spark tasks) ----------------------------------


class HookedStarRocksTarget(StarRocksTarget):
    """A StarRocksTarget whose transactions obey the task hooks (a twin's label: the label's first 110 characters + `_twin`)."""

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return hooked_begin(super().begin, table, new_ref, record_intent, lambda label: label[:110] + "_twin")


HOOKED = hooked_descriptor(starrocks.DESCRIPTOR, HookedStarRocksTarget)
