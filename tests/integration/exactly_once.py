"""What the end-to-end exactly-once suites share: where a kill at a protocol point must leave the journal, and the seeds."""
from __future__ import annotations

import os
from typing import Any

from streaming_sink.committable import BatchState


def assert_stopped_at(scenario: Any, point: str, batch: int) -> None:
    """The kill happened where it was asked to: the journal of `batch` shows that exact protocol step."""
    record, intents, done = scenario.batch_state(batch)
    if point == "after-writers-prepared":
        assert record is None and intents, "writers should have prepared with intents, and no record yet"
    elif point == "after-prepared-record":
        assert record.state is BatchState.PREPARED and not done
    elif point == "after-first-commit":
        assert record.state is BatchState.PREPARED and len(done) == 1 < len(record.committables)
    elif point == "after-committed-record":
        assert record.state is BatchState.COMMITTED
    else:
        raise AssertionError(point)


def kill_seeds(default: str = "23") -> list[int]:
    """One seed per run of a suite (the soak, scripts/soak.sh, kills dozens of times); KILL_SEEDS=11,23,37 runs more."""
    return [int(s) for s in os.environ.get("KILL_SEEDS", default).split(",")]
