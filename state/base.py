"""The state store contract: batch records, intents, per-committable progress and fencing.

The coordinator keeps its two-phase-commit journal here. Every mutation carries the writer's
fencing epoch and is refused once a newer driver of the same job has taken a newer epoch
(invariant I5). A batch's record is written in one atomic operation: its `PREPARED` version is
the commit point of the batch.
"""
from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping

from streaming_sink.committable import JOURNAL_FORMAT, BatchState, Committable, JournalFormatError, TxnRef, check_format
from streaming_sink.errors import (  # noqa: F401  moved to streaming_sink/errors.py
    BatchSealedError, FencedError, StateStoreError, StateStoreLostError,
)


def fencing_error(job_id: str, held: int, current: int | None) -> FencedError:
    """The right error when the stored epoch is not the one held: newer driver, or a store that went back."""
    if current is None or current < held:
        return StateStoreLostError(job_id, held, current)
    return FencedError(job_id, held, current)


def attempt_epoch(attempt: str) -> int | None:
    """The fencing epoch an attempt string (`e<epoch>w<pass>t<task>`) was written under."""
    match = _ATTEMPT.match(attempt)
    return int(match.group(1)) if match else None


_ATTEMPT = re.compile(r"^e(\d+)w")


def intent_gate(record: "BatchRecord | None") -> str:
    """Which writer attempts may still record intents for a batch, as stored beside the record.

    '' (no record: any attempt of the current epoch), 'COMMITTED' (none), or 'PREPARED:<prefix>'
    (only attempts of the replay pass `<prefix>`, e.g. 'e3w1'; none when the prefix is empty).
    Closing the gate before the final abort is what keeps a late writer from leaking a transaction (R6).
    """
    if record is None:
        return ""
    if record.state is BatchState.COMMITTED:
        return "COMMITTED"
    return f"PREPARED:{record.open_attempt or ''}"


def gate_admits(gate: str, attempt: str) -> bool:
    if gate == "":
        return True
    if gate.startswith("PREPARED:"):
        prefix = gate[len("PREPARED:"):]
        return bool(prefix) and attempt.startswith(prefix + "t")
    return False


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
    sent: list[str] = field(default_factory=list)  # labels a commit may have been sent for (R1: never replay those)
    open_attempt: str | None = None  # while PREPARED: the replay pass whose writers may still record intents
    # labels whose commit answered LOST in the very phase that first sent it: provably never committed (F4)
    never_committed: list[str] = field(default_factory=list)
    # the source range Spark planned the batch with: the text of the checkpoint's offsets/N (None: unknown)
    source: str | None = None
    # why the driver stopped on this batch for an operator: {"error", "section", "message", "at"} (None: it did not)
    stop: dict[str, Any] | None = None
    # labels an operator gave up (`settle --accept-loss`): never committed here, their rows re-ingested by other means
    discarded: list[str] = field(default_factory=list)

    def live_committables(self) -> list[Committable]:
        """The transactions whose rows the batch delivers: not those replayed under new labels or given up."""
        gone = set(self.lost) | set(self.discarded)
        return [c for c in self.committables if c.label not in gone]

    def encode(self) -> dict[str, Any]:
        return {
            "v": JOURNAL_FORMAT,
            "query_id": self.query_id,
            "batch_id": self.batch_id,
            "state": self.state.value,
            "epoch": self.epoch,
            "committables": [c.encode() for c in self.committables],
            "checksums": {str(k): v for k, v in self.checksums.items()},
            "lost": self.lost,
            "created_at": self.created_at,
            "timings": self.timings,
            "events": self.events,
            "records_in": self.records_in,
            "sent": self.sent,
            "open_attempt": self.open_attempt,
            "never_committed": self.never_committed,
            "source": self.source,
            "stop": self.stop,
            "discarded": self.discarded,
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> "BatchRecord":
        """A batch record of any readable version (see `JOURNAL_FORMAT`); unknown keys are ignored."""
        check_format(data, "batch record")
        try:
            query_id, batch_id, state, epoch = data["query_id"], data["batch_id"], data["state"], data["epoch"]
            committables = data["committables"]
        except KeyError as missing:
            raise JournalFormatError(
                f"batch record has no {missing}; it is not a streaming-sink journal record"
            ) from None
        return cls(
            query_id=query_id,
            batch_id=int(batch_id),
            state=BatchState(state),
            epoch=int(epoch),
            committables=[Committable.decode(c) for c in committables],
            checksums={int(k): v for k, v in data.get("checksums", {}).items()},
            lost=list(data.get("lost", [])),
            created_at=float(data.get("created_at", 0.0)),
            timings=dict(data.get("timings", {})),
            events=list(data.get("events", [])),
            records_in=int(data.get("records_in", 0)),
            sent=list(data.get("sent", [])),
            open_attempt=data.get("open_attempt"),
            never_committed=list(data.get("never_committed", [])),
            source=data.get("source"),
            stop=dict(data["stop"]) if data.get("stop") else None,
            discarded=list(data.get("discarded", [])),
        )

    def to_json(self) -> str:
        return json.dumps(self.encode(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchRecord":
        return cls.decode(json.loads(text))


@dataclass(frozen=True)
class Durability:
    """A store's answer to "could a restart or a failover lose what you acknowledged?"."""

    found: str  # what the store runs with (persistence, replication), in one line
    warning: str | None = None  # how acknowledged writes could be lost; None: no known way


def owner_record(owner: str, at: float, epoch: int | None = None) -> dict[str, Any]:
    """The epoch record as a store writes it: who took the job's epoch and when (Redis adds the epoch itself)."""
    record: dict[str, Any] = {"v": JOURNAL_FORMAT, "owner": owner, "at": at}
    if epoch is not None:
        record["epoch"] = epoch
    return record


def decode_owner(data: Mapping[str, Any], seen: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An epoch record of any readable version, as `StateStore.epoch_owner` returns it: {"epoch", "owner", "at",
    "seen"}; `seen` is the newest heartbeat ({"epoch", "at"}, kept apart by some stores), counted only for this epoch."""
    check_format(data, "epoch record")
    if "epoch" not in data:
        raise JournalFormatError("epoch record has no 'epoch'; it is not a streaming-sink journal record")
    epoch = int(data["epoch"])
    seen = seen if seen is not None else data.get("seen")
    beat = seen.get("at") if seen and int(seen.get("epoch", -1)) == epoch else None
    return {"epoch": epoch, "owner": data.get("owner"), "at": data.get("at"), "seen": beat}


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
        (`intent_gate`) does not admit `ref.attempt`."""

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

    def durability(self) -> "Durability":
        """What keeps acknowledged writes through a restart or a failover, and why they could be lost. For `doctor`."""
        return Durability(f"{self.url}: no known way to lose acknowledged writes on a restart")

    def close(self) -> None:
        """Release connections; the default has none."""
