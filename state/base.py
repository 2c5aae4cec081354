"""The state store contract: batch records, intents, per-committable progress and fencing.

The coordinator keeps its two-phase-commit journal here. Every mutation carries the writer's
fencing epoch and is refused once a newer driver of the same job has taken a newer epoch
(invariant I5). A batch's record is written in one atomic operation: its `PREPARED` version is
the commit point of the batch.
"""
from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from streaming_sink.committable import BatchState, Committable, TxnRef


class StateStoreError(RuntimeError):
    """The state store refused or failed an operation."""


class FencedError(StateStoreError):
    """A newer driver of the same job took over; this one must stop writing."""

    def __init__(self, job_id: str, held: int, current: int | None) -> None:
        super().__init__(
            f"job {job_id!r}: this driver holds fencing epoch {held}, but epoch {current} was taken "
            f"by a newer driver of the same job_id; this driver may no longer write state or commit. "
            f"Stop it (two drivers must never run one job), or give it its own job_id."
        )
        self.job_id, self.held, self.current = job_id, held, current


class BatchSealedError(StateStoreError):
    """An intent arrived for a batch already COMMITTED: a zombie task must not begin anything."""


@dataclass
class BatchRecord:
    """The journal entry of one micro-batch of one streaming query."""

    query_id: str
    batch_id: int
    state: BatchState
    epoch: int
    committables: list[Committable]
    checksums: dict[int, str] = field(default_factory=dict)  # writer partition -> content checksum
    lost: list[str] = field(default_factory=list)  # labels that could not be committed and were replayed
    created_at: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # recovery events, for operators
    records_in: int = 0  # rows the writers received; equals the rows of all committables

    def live_committables(self) -> list[Committable]:
        lost = set(self.lost)
        return [c for c in self.committables if c.label not in lost]

    def to_json(self) -> str:
        return json.dumps(
            {
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "state": self.state.value,
                "epoch": self.epoch,
                "committables": [json.loads(c.to_json()) for c in self.committables],
                "checksums": {str(k): v for k, v in self.checksums.items()},
                "lost": self.lost,
                "created_at": self.created_at,
                "timings": self.timings,
                "events": self.events,
                "records_in": self.records_in,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "BatchRecord":
        data: dict[str, Any] = json.loads(text)
        return cls(
            query_id=data["query_id"],
            batch_id=int(data["batch_id"]),
            state=BatchState(data["state"]),
            epoch=int(data["epoch"]),
            committables=[Committable(**c) for c in data["committables"]],
            checksums={int(k): v for k, v in data.get("checksums", {}).items()},
            lost=list(data.get("lost", [])),
            created_at=float(data.get("created_at", 0.0)),
            timings=dict(data.get("timings", {})),
            events=list(data.get("events", [])),
            records_in=int(data.get("records_in", 0)),
        )


class StateStore(ABC):
    """Where the coordinator and the writers keep the journal of a job.

    Keys are (job_id, query_id, batch_id): the query id is the streaming query's persistent id,
    so a new checkpoint starts a fresh namespace while the old one can still be swept.
    Implementations must make each method atomic, and each mutating method must check `epoch`
    against the job's current epoch inside the same atomic step.
    """

    url: str

    @abstractmethod
    def take_epoch(self, job_id: str, owner: str) -> int:
        """Start a driver: a new, larger epoch; older holders are fenced from now on."""

    @abstractmethod
    def current_epoch(self, job_id: str) -> int:
        """The newest epoch taken for the job (0 when none was)."""

    @abstractmethod
    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        """Who took the current epoch and when: {"epoch", "owner", "at"} (for operators)."""

    @abstractmethod
    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        """Record that a transaction is about to begin. Raises BatchSealedError on a COMMITTED batch."""

    @abstractmethod
    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        """The transactions recorded as begun (or about to be) for a batch."""

    @abstractmethod
    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        """Forget intents whose transactions are committed or aborted."""

    @abstractmethod
    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        """Write a batch record in one atomic step (the PREPARED write is the commit point)."""

    @abstractmethod
    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        """The batch's record, or None when it was never prepared."""

    @abstractmethod
    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        """Record that one committable is committed (progress inside a PREPARED batch)."""

    @abstractmethod
    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        """Labels recorded as committed for a batch."""

    @abstractmethod
    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        """Every (query_id, batch_id) that has a record or intents, oldest batch first."""

    @abstractmethod
    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        """Forget a batch entirely (retention of COMMITTED records)."""

    def close(self) -> None:
        """Release connections; the default has none."""
