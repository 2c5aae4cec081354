"""BatchLog: the life of one batch's journal record, as named transitions, each one store write.

    (no record) --prepare--> PREPARED --mark_sent--> (commits go out) --mark_done--> (progress)
        PREPARED --open_replay--> replay open --close_replay--> PREPARED (more committables) --mark_committed--> COMMITTED
        PREPARED (waves 0..k, committed) --open_wave--> wave k+1 open --add_wave--> PREPARED (waves 0..k+1)

A transition builds the next record (`BatchRecord` is frozen) and writes it whole, fenced by the driver's epoch:
the store holds the record the transition names or the one before it, never a half. `put_batch` is called nowhere
else. Progress marks (`mark_done`) are not the record: they go to the store's per-label set.
"""
from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from .committable import Committable
from .crash import crash_point
from .records import COMMITTED_AT, BatchRecord, BatchState
from .state import StateStore


class BatchLog:
    """One batch's record as the coordinator (or an operator's command) moves it on, under `epoch`."""

    def __init__(self, store: StateStore, job_id: str, epoch: int, record: BatchRecord) -> None:
        self._store, self._job_id, self._epoch = store, job_id, epoch
        self._record = record

    @property
    def record(self) -> BatchRecord:
        """The record as last written (or as read, before the first transition)."""
        return self._record

    @classmethod
    def prepare(cls, store: StateStore, job_id: str, epoch: int, record: BatchRecord) -> BatchLog:
        """The decision: the batch's first record, PREPARED with every committable (COMMITTED when it has none)."""
        log = cls(store, job_id, epoch, record)
        log._write(record)
        return log

    def note_timing(self, name: str, seconds: float) -> None:
        """Keep a timing that is known only after a write: it is stored with the next transition, not on its own
        (the time the PREPARED write took is measured after it; an empty batch's record is never written again)."""
        self._record = replace(self._record, timings={**self._record.timings, name: seconds})

    def resume(self) -> None:
        """The operator resolved what stopped the job on this batch: the stop is cleared and the batch goes on."""
        stop = self._record.stop or {}
        self._write(replace(self._record, stop=None, events=[*self._record.events, f"resumed after {stop.get('error')}"]))

    def record_stop(self, stop: dict[str, Any]) -> None:
        """Why the driver stopped on this batch for an operator: {"error", "section", "message", "at"} (F6)."""
        self._write(replace(self._record, stop=stop))

    def mark_sent(self, labels: list[str], again: Collection[str] = ()) -> None:
        """Commits are about to be sent for these labels: a later LOST answer for one of them is ambiguous (R1, I8).
        `again`: labels of `not_sent` whose commit is about to be sent after all (N8)."""
        record = self._record
        self._write(replace(record, sent=[*record.sent, *labels],
                            not_sent=[label for label in record.not_sent if label not in again]))

    def mark_not_sent(self, labels: list[str], event: str) -> None:
        """A failed commit phase never sent these labels' commits, though `sent` lists them (N8)."""
        record = self._record
        added = [label for label in labels if label not in record.not_sent]
        self._write(replace(record, not_sent=[*record.not_sent, *added], events=[*record.events, event]))

    def mark_never_committed(self, labels: list[str], event: str | None = None) -> None:
        """These labels provably never committed (LOST on the commit that first reached the server, F4, or an
        operator's verdict): a later phase may replay them. `sent` only grows (the checkpoint marker counts it)."""
        record = self._record
        events = record.events if event is None else [*record.events, event]
        added = [label for label in labels if label not in record.never_committed]
        self._write(replace(record, never_committed=[*record.never_committed, *added], events=events))

    def mark_done(self, labels: list[str]) -> None:
        """These committables are committed (progress inside a PREPARED batch, one store write for the group)."""
        record = self._record
        self._store.mark_done_many(self._job_id, self._epoch, record.query_id, record.batch_id, labels)

    def settle_committed(self, label: str) -> None:
        """An operator's verdict: the label is committed on the target, so it is recorded as done."""
        record = self._record
        self._store.mark_done(self._job_id, self._epoch, record.query_id, record.batch_id, label)

    def open_replay(self, write_pass: str) -> None:
        """The replay's writers (attempts of `write_pass`, a `labels.pass_prefix`), and only they, may begin."""
        self._write(replace(self._record, open_attempt=write_pass))

    def open_wave(self, write_pass: str) -> None:
        """The next wave's writers (attempts of `write_pass`), and only they, may begin: the recorded waves are
        committed, and the batch's record stays the gate, as for a replay."""
        self._write(replace(self._record, open_attempt=write_pass,
                            events=[*self._record.events, f"wave {self._record.next_wave} opened"]))

    def add_wave(self, wave: int, fresh: list[Committable], checksums: dict[int, str], records_in: int) -> None:
        """Wave `wave` prepared `fresh`: the record takes them (the wave's commit point) and the gate closes."""
        record = self._record
        if wave != record.next_wave:
            raise ValueError(f"batch {record.batch_id}: wave {wave} recorded, but the next is {record.next_wave}")
        self._write(replace(
            record,
            committables=[*record.committables, *fresh],
            checksums={**record.checksums, **checksums},
            records_in=record.records_in + records_in,
            waves_prepared=wave + 1,
            open_attempt=None,
        ))

    def close_gate(self) -> None:
        """A replay failed: no writer may begin any more (written only when a replay was open)."""
        if self._record.open_attempt:
            self._write(replace(self._record, open_attempt=None))

    def close_replay(self, lost: list[Committable], fresh: list[Committable]) -> str:
        """The replay prepared `fresh` in place of `lost`: the record takes them and the gate closes before anything
        is committed, so late writers cannot begin. Returns the event it records."""
        event = f"replayed {len(lost)} lost transaction(s) {[c.label for c in lost]} as {[c.label for c in fresh]}"
        record = self._record
        self._write(replace(
            record,
            lost=sorted(set(record.lost) | {c.label for c in lost}),
            committables=[*record.committables, *fresh],
            open_attempt=None,
            events=[*record.events, event],
        ))
        return event

    def mark_committed(self, timings: dict[str, float] | None = None) -> BatchRecord:
        """Every live committable is committed: the batch is COMMITTED under this epoch."""
        self._write(self._committed(self._record, timings))
        crash_point("after-committed-record", self._record.batch_id)
        return self._record

    def accept_loss(self, given_up: Collection[Committable]) -> BatchRecord:
        """An operator gives up these committables and the waves never written (their rows re-ingested by other
        means) and closes the batch: recorded as discarded and COMMITTED in one write."""
        record = self._record
        event = (f"operator accepted the loss of {len(given_up)} transaction(s) "
                 f"({sum(c.rows for c in given_up)} rows): {[c.label for c in given_up]}")
        unwritten = record.unwritten_tables()
        if unwritten:
            event += f"; and of the {len(unwritten)} table(s) never written: {unwritten}"
        settled = replace(record, discarded=sorted(set(record.discarded) | {c.label for c in given_up}), stop=None,
                          events=[*record.events, event])
        self._write(self._committed(settled, None))
        crash_point("after-committed-record", record.batch_id)
        return self._record

    def _committed(self, record: BatchRecord, timings: dict[str, float] | None) -> BatchRecord:
        return replace(record, state=BatchState.COMMITTED, epoch=self._epoch,
                       timings={**record.timings, **(timings or {}), COMMITTED_AT: time.time()})

    def _write(self, record: BatchRecord) -> None:
        self._store.put_batch(self._job_id, self._epoch, record)
        self._record = record
