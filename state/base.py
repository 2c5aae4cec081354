"""The state store contract: where batch records, intents and per-committable progress go, fenced by epoch.

The coordinator keeps its two-phase-commit journal here. Every mutation carries the writer's
fencing epoch and is refused once a newer driver of the same job has taken a newer epoch
(invariant I5). A batch's record is written in one atomic operation: its `PREPARED` version is
the commit point of the batch.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from streaming_sink.committable import TxnRef
from streaming_sink.errors import (  # noqa: F401  moved to streaming_sink/errors.py
    BatchSealedError,
    FencedError,
    StateStoreError,
    StateStoreLostError,
)
from streaming_sink.records import BatchRecord


def fencing_error(job_id: str, held: int, current: int | None) -> FencedError:
    """The right error when the stored epoch is not the one held: newer driver, or a store that went back."""
    if current is None or current < held:
        return StateStoreLostError(job_id, held, current)
    return FencedError(job_id, held, current)


@dataclass(frozen=True)
class Durability:
    """A store's answer to "could a restart or a failover lose what you acknowledged?"."""

    found: str  # what the store runs with (persistence, replication), in one line
    warning: str | None = None  # how acknowledged writes could be lost; None: no known way


class StateStore(ABC):
    """Where the coordinator and the writers keep the journal of a job.

    Keys are (job_id, query_id, batch_id): the query id is the streaming query's persistent id,
    so a new checkpoint starts a fresh namespace while the old one can still be swept.
    Implementations must make each method atomic, and each mutating method must check `epoch`
    against the job's current epoch inside the same atomic step.
    """

    url: str

    @abstractmethod
    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        """Start a driver: a new epoch, larger than any taken before and at least `at_least`
        (the high-water mark kept beside the checkpoint, so epochs never go back after a store loss)."""

    @abstractmethod
    def current_epoch(self, job_id: str) -> int:
        """The newest epoch taken for the job (0 when none was)."""

    @abstractmethod
    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        """Who took the current epoch, when, and when it last beat: {"epoch", "owner", "at", "seen"} (seen: None
        before the first heartbeat). Operators' commands read it to tell a running driver from a dead one."""

    @abstractmethod
    def beat(self, job_id: str, epoch: int, at: float) -> None:
        """The epoch's holder is alive at `at` (a running driver's heartbeat); fenced like every write."""

    @abstractmethod
    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        """Record that a transaction is about to begin. Raises BatchSealedError when the batch's gate
        (`records.intent_gate`) does not admit `ref.attempt`."""

    @abstractmethod
    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        """After a begin: raise unless the intent is still recorded and the gate still admits it.

        With `add_intent` before the begin and the driver closing the gate before its final abort,
        a transaction begun too late is either aborted by the driver or by its writer, never neither.
        """

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

    def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        """Record several committables as committed in one atomic write (the commit phase's group of progress
        marks). Stores override it with one write; this default, one `mark_done` per label, keeps the contract."""
        for label in labels:
            self.mark_done(job_id, epoch, query_id, batch_id, label)

    @abstractmethod
    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        """Labels recorded as committed for a batch."""

    @abstractmethod
    def job_ids(self) -> list[str]:
        """Every job the store holds an epoch or a batch for, sorted. Reads only: lets `status` tell an unknown
        (mistyped) job from an idle one, and name the jobs that are there."""

    @abstractmethod
    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        """Every (query_id, batch_id) that has a record or intents, oldest batch first."""

    @abstractmethod
    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        """Forget a batch entirely (retention of COMMITTED records)."""

    def durability(self) -> Durability:
        """What keeps acknowledged writes through a restart or a failover, and why they could be lost. For `doctor`."""
        return Durability(f"{self.url}: no known way to lose acknowledged writes on a restart")

    def close(self) -> None:  # noqa: B027 - a store with no connections has nothing to release
        """Release connections; the default has none."""
