"""Moved to tests/support/targets/starrocks.py; these names stay for one release."""
from tests.support.targets.starrocks import (  # noqa: F401
    DIE_AFTER_PREPARE, PASSWORD, TWIN, HookedStarRocksTarget, StarRocksAdapter,
)

StarRocksCrashTarget = StarRocksEmulatorAdapter = StarRocksAdapter
