"""Moved to tests/support/crash.py (kill points, seeds, task hooks); this name stays for one release."""
from tests.support.crash import (  # noqa: F401
    DIE_AFTER_PREPARE, TWIN, HookedTransaction, assert_stopped_at, hooked_begin, kill_seeds, task_matches,
)
