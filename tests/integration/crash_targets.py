"""Moved to tests/support/targets/ (one adapter class per target); these names stay for one release."""
from tests.support.targets.base import (  # noqa: F401
    ABORTED, COLUMNS, COMMITTED, LABEL, OPEN, EmulatorAdapter, TargetAdapter, label_batch,
)
from tests.support.targets.clickhouse import ClickHouseAdapter

CrashTarget = TargetAdapter
EmulatorCrashTarget = EmulatorAdapter
ClickHouseCrashTarget = ClickHouseAdapter
