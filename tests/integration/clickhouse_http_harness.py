"""Moved to tests/support/targets/clickhouse.py; these names stay for one release."""
from tests.support.targets.clickhouse import (  # noqa: F401
    DIE_AFTER_PREPARE, TWIN, ClickHouseHttpAdapter, HookedClickHouseTarget, clickhouse_adapter, twin_label,
)

ClickHouseHttpCrashTarget = ClickHouseFrontAdapter = ClickHouseHttpAdapter
