"""The journal's records: a batch's record and its states, the epoch owner record, and the intent gate they imply.

What the coordinator writes to a state store and reads back, as plain serialisable values: no store, no Spark, no
target. The committables inside a batch record are in `committable.py`; the label, attempt and gate formats in
`labels.py`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .batch_plan import BatchPlan
from .committable import BASE_FORMAT, JOURNAL_FORMAT, Committable, check_format
from .errors import JournalFormatError
from .labels import GATE_OPEN, GATE_SEALED, replay_gate


class BatchState(str, Enum):
    """What the journal knows of a micro-batch.

    Only PREPARED and COMMITTED are ever stored. BEGUN is what `status` shows for a batch with intents and no
    record (a crashed or running write); a stored record never holds it."""

    PREPARED = "PREPARED"  # the commit point: every committable in the record will be committed
    COMMITTED = "COMMITTED"  # every committable is visible; re-running the batch changes nothing
    BEGUN = "BEGUN"  # intents, no record: nothing was decided, everything begun is aborted (I3)


#: The timing a COMMITTED record adds to its `timings`: when it was written (a moment, not a duration like the others).
COMMITTED_AT = "committed_at"

#: The states a batch record can be stored with.
STORED_STATES = (BatchState.PREPARED, BatchState.COMMITTED)


def intent_gate(record: BatchRecord | None) -> str:
    """Which writer attempts may still record intents for a batch, as a store keeps it beside the record
    (the formats: `labels.py`): any (no record), none (COMMITTED), or only the open replay pass's (PREPARED)."""
    if record is None:
        return GATE_OPEN
    if record.state is BatchState.COMMITTED:
        return GATE_SEALED
    return replay_gate(record.open_attempt)


@dataclass(frozen=True)
class BatchRecord:
    """The journal entry of one micro-batch of one streaming query. Frozen: `BatchLog` writes each next one."""

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
    # labels listed in `sent` whose commit the phase that listed them never sent, as it failed first (N8): maybe still
    # prepared, so the next phase sends them as if first listed, and from that send on they count as sent
    not_sent: list[str] = field(default_factory=list)
    # the source range Spark planned the batch with: the text of the checkpoint's offsets/N (None: unknown)
    source: str | None = None
    # why the driver stopped on this batch for an operator: {"error", "section", "message", "at"} (None: it did not)
    stop: dict[str, Any] | None = None
    # labels an operator gave up (`settle --accept-loss`): never committed here, their rows re-ingested by other means
    discarded: list[str] = field(default_factory=list)
    # the batch's plan when it commits in waves (None: one round, as before waves), and how many of its waves the
    # record holds: each wave's committables and checksums are added by the wave's own round (`BatchLog.add_wave`)
    plan: BatchPlan | None = None
    waves_prepared: int = 1

    @property
    def next_wave(self) -> int | None:
        """The wave still to be written after the recorded ones (None: the record holds the whole batch)."""
        if self.plan is None or self.waves_prepared >= len(self.plan.waves):
            return None
        return self.waves_prepared

    def unwritten_tables(self) -> list[str]:
        """The tables of the waves never written (none once the record holds the whole batch): only the batch's re-run
        holds their rows, and a batch given up (`settle --accept-loss`) leaves them to the operator."""
        wave = self.next_wave
        return [] if wave is None or self.plan is None else [t for tables in self.plan.waves[wave:] for t in tables]

    def rerun_differences(self, counted: Mapping[str, int]) -> list[str]:
        """Where a re-run that counted `counted` rows per table would write the batch's unwritten waves otherwise than
        its first run routed them ([] when it routes alike), e.g. ["dead_letters: 6 rows first, 3 now"].

        The plan's counts are the first run's routing, every table included. A plan recorded without them (an
        earlier release) leaves what the record itself proves: the recorded waves' tables hold their committables'
        rows, and a table the plan does not name had none. That is what a duplicate or a loss needs (a message moved
        between a recorded wave and the rest); a move among unwritten tables is then not seen, and harmless."""
        assert self.plan is not None
        if self.plan.rows:
            first = dict(self.plan.rows)
        else:
            recorded = {t for tables in self.plan.waves[: self.waves_prepared] for t in tables}
            first = {t: 0 for t in recorded}
            for c in self.live_committables():
                if c.table in recorded:
                    first[c.table] += c.rows + c.filtered_rows + c.unselected_rows
            first |= {t: 0 for t in counted if t not in self.plan.writers}
        return [f"{table}: {first.get(table, 0)} rows first, {counted.get(table, 0)} now"
                for table in sorted(set(first) | (set(counted) if self.plan.rows else set()))
                if first.get(table, 0) != counted.get(table, 0)]

    def live_committables(self) -> list[Committable]:
        """The transactions whose rows the batch delivers: not those replayed under new labels or given up."""
        gone = set(self.lost) | set(self.discarded)
        return [c for c in self.committables if c.label not in gone]

    def encode(self) -> dict[str, Any]:
        return {
            # a release before waves would take the first wave for the whole batch; one-round records it reads right
            "v": JOURNAL_FORMAT if self.plan is not None and len(self.plan.waves) > 1 else BASE_FORMAT,
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
            "not_sent": self.not_sent,
            "source": self.source,
            "stop": self.stop,
            "discarded": self.discarded,
            **({} if self.plan is None else {"plan": json.loads(self.plan.to_json()), "waves_prepared": self.waves_prepared}),
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> BatchRecord:
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
            state=_stored_state(state),
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
            not_sent=list(data.get("not_sent", [])),
            source=data.get("source"),
            stop=dict(data["stop"]) if data.get("stop") else None,
            discarded=list(data.get("discarded", [])),
            plan=BatchPlan.from_json(json.dumps(data["plan"])) if data.get("plan") else None,
            waves_prepared=int(data.get("waves_prepared", 1)),
        )

    def to_json(self) -> str:
        return json.dumps(self.encode(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BatchRecord:
        return cls.decode(json.loads(text))


def owner_record(owner: str, at: float, epoch: int | None = None) -> dict[str, Any]:
    """The epoch record as a store writes it: who took the job's epoch and when (Redis adds the epoch itself)."""
    record: dict[str, Any] = {"v": BASE_FORMAT, "owner": owner, "at": at}
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


def _stored_state(value: str) -> BatchState:
    """A record's state as stored: BEGUN is never one (a record saying so is as unreadable as any unknown state)."""
    state = BatchState(value)
    if state not in STORED_STATES:
        raise ValueError(f"{value!r} is not a stored batch state")
    return state
