"""What the state store must never forget, kept beside the streaming checkpoint too (R2, I9).

A state store can lose its data (Redis restarted without persistence, a failover to a replica
that missed the last writes, a restore from a backup). The checkpoint outlives that, so the driver
keeps two facts there, in `<checkpoint>/streaming-sink/<job_id>.json`:

* the highest fencing epoch it took, written when it starts and before any writer begins: the next
  driver asks the store for a larger one, so a zombie driver never passes fencing again and labels
  never repeat, even when the store was wiped inside the very first batch;
* the batch whose commits it is about to send, with how many labels the record's `sent` lists and a
  digest of them, written after `sent` is durable and before any commit goes out. A store whose
  record of that batch is missing, or lists fewer or other sent labels, forgot commits that may have
  happened (a rollback inside a replay, F3), and the job stops instead of writing the batch again.
  A batch that never reached this point had no commit sent, so writing it again after a loss is safe.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .checkpoint import CheckpointFolder


@dataclass(frozen=True)
class Position:
    """The newest batch a driver sent commits for, and the first `sent` labels of its record then."""

    query_id: str
    batch_id: int
    sent: int = 0  # how many labels the record's `sent` held when the commits went out
    sent_digest: str = ""  # sent_digest() of those labels

    def missing_from(self, sent: Sequence[str]) -> bool:
        """Whether a record listing `sent` lacks labels this position says were sent (a rolled-back record)."""
        if self.sent == 0:  # written by a release that kept only the position, or nothing sent yet
            return False
        return len(sent) < self.sent or sent_digest(sent[: self.sent]) != self.sent_digest


def sent_digest(labels: Sequence[str]) -> str:
    """A short digest of labels in order: `sent` only grows at its end, so a prefix identifies what was sent."""
    return hashlib.sha256("\n".join(labels).encode()).hexdigest()[:32]


class CheckpointMarker:
    """`<checkpoint>/streaming-sink/<job_id>.json`: a local path, or any Hadoop filesystem through Spark."""

    def __init__(self, checkpoint_location: str, job_id: str, spark: Any = None) -> None:
        self.folder = CheckpointFolder(checkpoint_location, spark)
        self._relative = f"streaming-sink/{job_id}.json"
        self.location = f"{self.folder.location}/{self._relative}"
        self._data: dict[str, Any] | None = None

    def epoch(self) -> int:
        """The highest epoch a driver of this job took on this checkpoint (0: none yet)."""
        return int(self._read().get("epoch", 0))

    def prepared(self) -> Position | None:
        """The newest batch commits were sent for (read by `_check_journal_continues` and the record check)."""
        found = self._read().get("prepared")
        if not found:
            return None
        return Position(found["query_id"], int(found["batch_id"]), int(found.get("sent", 0)), found.get("sent_digest", ""))

    def advance_epoch(self, epoch: int) -> None:
        """Record `epoch` if it is higher than what is there (a driver never lowers the mark)."""
        if epoch > self.epoch():
            self._write({**self._read(), "epoch": epoch})

    def record_sending(self, query_id: str, batch_id: int, sent: Sequence[str]) -> None:
        """Called after the record listing `sent` is durable and before any of its commits goes out."""
        position = Position(query_id, batch_id, len(sent), sent_digest(sent))
        if position == self.prepared():
            return  # a later phase of the same batch that sends no new label: the mark already says it
        self._write({**self._read(), "prepared": {
            "query_id": query_id, "batch_id": batch_id, "sent": position.sent, "sent_digest": position.sent_digest}})

    def _read(self) -> dict[str, Any]:
        if self._data is None:
            text = self.folder.read(self._relative)
            self._data = json.loads(text) if text and text.strip() else {}
        return self._data

    def _write(self, data: dict[str, Any]) -> None:
        self.folder.write(self._relative, json.dumps(data, sort_keys=True))
        self._data = data
