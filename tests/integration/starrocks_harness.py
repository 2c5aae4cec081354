"""The StarRocks emulator in the crash matrix (`StarRocksCrashTarget`), its `devstack.pipeline.TargetAdapter`, and task hooks.

The emulator runs in the pytest process; the driver child (and its Spark tasks) reach it over
loopback with a password, so every FE->BE 307 must carry the credentials again.

Task-side faults cannot come from the server (a task that dies *after* its prepare succeeded, a
speculative duplicate), so the driver child runs `tests.integration.starrocks_driver` instead of
`streaming_sink.job`:
it is the packaged job with the StarRocks target wrapped by `HookedStarRocksTarget`, which obeys the
task hooks of tests/integration/exactly_once.py (`SS_TEST_DIE_AFTER_PREPARE`, `SS_TEST_TWIN`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from devstack.pipeline import DB
from streaming_sink import job
from streaming_sink.targets.base import NewRef, RecordIntent, TableTransaction
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.emulators.starrocks import StarRocksEmulator
from tests.integration.crash_targets import EmulatorAdapter, EmulatorCrashTarget
from tests.integration.exactly_once import DIE_AFTER_PREPARE, TWIN, hooked_begin

__all__ = ["DIE_AFTER_PREPARE", "TWIN", "HookedStarRocksTarget", "StarRocksCrashTarget", "StarRocksEmulatorAdapter",
           "hooked_target_from_url"]
PASSWORD = "s3cret"
OPEN_STATES = ("PREPARE", "PREPARED")


class StarRocksEmulatorAdapter(EmulatorAdapter):
    """The driver reaches the emulator over HTTP; the test reads it directly (it is in this process)."""

    emulator: StarRocksEmulator
    defaults = {"backoff_s": 0.05, "backoff_max_s": 0.5, "read_timeout": 20.0}


class StarRocksCrashTarget(EmulatorCrashTarget):
    """180 messages, 45 a trigger over 3 partitions (3 tasks a batch), writers in Spark tasks that may retry
    (`local[2,3]`), the hooked driver below."""

    name = "starrocks"
    default_seed = "29"
    random_kill_wait_s = 2.0
    chain_options = {"commit_parallelism": 1}  # so "after-first-commit" leaves exactly one of the batch's commits done
    emulator: StarRocksEmulator

    @classmethod
    def new_emulator(cls, root: Path) -> StarRocksEmulator:
        return StarRocksEmulator(root / "starrocks", password=PASSWORD)

    def pipeline_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages_per_partition": 60, "max_offsets_per_trigger": 45,
            "adapter": StarRocksEmulatorAdapter(self.emulator, dict(options)),
            "driver_module": "tests.integration.starrocks_driver",
            "spark_conf": {"spark.master": "local[2,3]"},
        }

    def open_labels(self) -> list[str]:
        """Transactions begun or prepared and not settled, in any batch."""
        return [t["label"] for t in self.emulator.transactions(DB) if t["state"] in OPEN_STATES]


# -- the hooked driver (runs in the driver child and, pickled, in its Spark tasks) ----------------


class HookedStarRocksTarget(StarRocksTarget):
    """A StarRocksTarget whose transactions obey the task hooks (a twin's label: the label's first 110 characters + `_twin`)."""

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return hooked_begin(super().begin, table, new_ref, record_intent, lambda label: label[:110] + "_twin")


def hooked_target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Any:
    """`target_from_url`, with the StarRocks target swapped for the hooked one (same state)."""
    target = _real_target_from_url(url, database, options)
    hooked = HookedStarRocksTarget.__new__(HookedStarRocksTarget)
    hooked.__dict__.update(target.__dict__)
    return hooked


_real_target_from_url = job.target_from_url
