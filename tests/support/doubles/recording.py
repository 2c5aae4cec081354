"""A stand-in target that records the commits and aborts the coordinator sends it, for protocol tests
that look at what was sent rather than at rows (tests/unit/test_task_attempts.py,
tests/integration/test_protocol_findings.py)."""
from __future__ import annotations

from typing import Any

from streaming_sink.committable import TxnRef
from streaming_sink.targets.base import CommitOutcome


class RecordingTarget:
    """Records commits and aborts; commits always succeed."""

    kind, database, commit_parallelism = "recording", "db", 4
    commits_per_table = False  # commits part by part, as `Target.commit_table`'s default

    def __init__(self, on_commit: Any = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.on_commit = on_commit

    def commit(self, committable: Any) -> CommitOutcome:
        self.calls.append(("commit", committable.label))
        if self.on_commit:
            self.on_commit()
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self.calls.append(("abort", ref.label))
