"""Moved to tests/support/targets/doris.py; these names stay for one release."""
from tests.support.targets.doris import (  # noqa: F401
    PASSWORD, USER, DorisAdapter, DorisPipeline, Rule, ScriptedDoris, batch_txns,
)

DorisCrashTarget = DorisAdapter
