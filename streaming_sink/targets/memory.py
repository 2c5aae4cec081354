"""In-memory target: the `Target` contract without a database, for your own tests.

Pair it with `MemoryStateStore` (the journal without a server) to run `ExactlyOnceSink.process` in
milliseconds, with or without Spark, and read what was committed with `rows(table)`. It keeps what a
StarRocks or Doris frontend keeps for the sink: one transaction per label, with its state and its rows,
and answers as they do (a label it does not know is LOST; aborting a committed label is refused).

Two cheap faults stand in for the ones a real server inflicts: `fail_next_commit` (a commit that fails,
or whose answer is lost after it took effect) and `forget` (a label the server no longer remembers).

Writers run in the driver (`runs_writers_in_driver`), so with Spark it works in a local session only and
the target is never pickled. Not durable, not shared between processes: never use it for a real job.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NoReturn

import pyarrow as pa

from ..committable import Committable, TxnRef
from .base import (
    CommitOutcome,
    CommittedNotChosenError,
    NewRef,
    PreparedPart,
    RecordIntent,
    TableTransaction,
    Target,
    TargetError,
)


class MemoryTxnState(str, Enum):
    """What the target knows of one label."""

    BEGUN = "BEGUN"  # rows are being written; not prepared yet
    PREPARED = "PREPARED"  # durable but invisible: only commit or abort remain
    COMMITTED = "COMMITTED"  # its rows are in `rows(table)`
    ABORTED = "ABORTED"  # rolled back: never visible


@dataclass
class _Txn:
    label: str
    table: str
    txn_id: str
    state: MemoryTxnState = MemoryTxnState.BEGUN
    rows: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0


class MemoryTarget(Target):
    """A database in a dict. `tables`: the tables rows may be routed to (None: any table, created on first write).

    `per_flush=False` is StarRocks-shaped (one transaction per table and writer attempt, however many flushes);
    `per_flush=True` gives each flush a transaction of its own, under its own label, as the Doris target did before
    it streamed a writer's flushes into one load (records of that release still replay that way: `replay.FlushKey`).
    """

    kind = "memory"

    def __init__(self, tables: Iterable[str] | None = None, database: str = "memory", per_flush: bool = False) -> None:
        self.database = database
        self.per_flush = per_flush
        self._tables = None if tables is None else frozenset(tables)
        self._lock = threading.RLock()
        self._txns: dict[str, _Txn] = {}
        self._visible: dict[str, list[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._failing_commits: list[bool] = []  # one entry per armed failure: does the commit apply first?

    def __getstate__(self) -> NoReturn:
        raise TypeError("MemoryTarget lives in one process; its writers run in the driver, never in Spark tasks")

    # -- what a test reads ---------------------------------------------------------------------------

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The committed rows of `table`, in commit order (a copy)."""
        with self._lock:
            return [dict(row) for row in self._visible.get(table, [])]

    def state(self, label: str) -> MemoryTxnState | None:
        """The state of the transaction a label names (None: never begun, or forgotten)."""
        with self._lock:
            txn = self._txns.get(label)
            return txn.state if txn is not None else None

    def labels(self, state: MemoryTxnState | None = None) -> list[str]:
        """Every label the target knows (in `state` only, if given), in the order they began."""
        with self._lock:
            return [label for label, txn in self._txns.items() if state is None or txn.state is state]

    # -- faults a test can inflict ------------------------------------------------------------------

    def fail_next_commit(self, times: int = 1, applied: bool = False) -> None:
        """The next `times` commits raise TargetError. `applied`: the commit takes effect first and only its
        answer is lost (a connection cut after the server acted), so the caller cannot tell what happened."""
        if times < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._failing_commits.extend([applied] * times)

    def forget(self, label: str) -> None:
        """Forget a label, as a server does once its retention has passed: a commit by it is then LOST.
        Committed rows stay visible."""
        with self._lock:
            self._txns.pop(label, None)

    # -- the Target contract -------------------------------------------------------------------------

    @property
    def runs_writers_in_driver(self) -> bool:
        return True

    def routable_tables(self) -> set[str] | None:
        return set(self._tables) if self._tables is not None else None

    def leftover_transactions(self, label_prefix: str) -> list[str] | None:
        open_states = (MemoryTxnState.BEGUN, MemoryTxnState.PREPARED)
        with self._lock:
            return sorted(label for label, txn in self._txns.items() if label.startswith(label_prefix) and txn.state in open_states)

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        if self._tables is not None and table not in self._tables:
            raise TargetError(f"memory target: unknown table {table!r}; known: {sorted(self._tables)}")
        return _MemoryTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        with self._lock:
            fail = self._failing_commits.pop(0) if self._failing_commits else None
            if fail is False:
                raise TargetError(f"memory target: the commit of {committable.label} failed (injected)")
            outcome = self._commit(committable.label)
            if fail:
                raise TargetError(f"memory target: the answer to the commit of {committable.label} was lost (injected)")
            return outcome

    def _commit(self, label: str) -> CommitOutcome:
        txn = self._txns.get(label)
        if txn is None:
            return CommitOutcome.LOST
        if txn.state is MemoryTxnState.ABORTED:
            return CommitOutcome.ABORTED
        if txn.state is MemoryTxnState.BEGUN:
            raise TargetError(f"memory target: label {label} was never prepared")
        if txn.state is MemoryTxnState.PREPARED:
            txn.state = MemoryTxnState.COMMITTED
            self._visible.setdefault(txn.table, []).extend(txn.rows)
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self._abort(ref.label)

    def _abort(self, label: str) -> None:
        with self._lock:
            txn = self._txns.get(label)
            if txn is None or txn.state is MemoryTxnState.ABORTED:
                return
            if txn.state is MemoryTxnState.COMMITTED:
                raise CommittedNotChosenError(f"memory target: label {label} is committed and cannot be aborted")
            txn.state = MemoryTxnState.ABORTED

    # -- for the transactions ------------------------------------------------------------------------

    def _begin(self, label: str, table: str) -> _Txn:
        with self._lock:
            old = self._txns.get(label)
            if old is not None and old.state is not MemoryTxnState.ABORTED:
                raise TargetError(f"memory target: label {label} is already used ({old.state.value})")
            txn = _Txn(label, table, str(next(self._ids)))
            self._txns.pop(label, None)  # a label begun again goes to the end of `labels()`
            self._txns[label] = txn
            return txn

    def _write(self, txn: _Txn, chunk: pa.Table) -> None:
        with self._lock:
            if txn.state is not MemoryTxnState.BEGUN:
                raise TargetError(f"memory target: label {txn.label} is {txn.state.value}; it takes no more rows")
            txn.rows.extend(chunk.to_pylist())
            txn.bytes += chunk.nbytes

    def _prepare(self, txn: _Txn) -> None:
        with self._lock:
            if txn.state is not MemoryTxnState.BEGUN:
                raise TargetError(f"memory target: label {txn.label} is {txn.state.value}; it cannot be prepared")
            txn.state = MemoryTxnState.PREPARED


class _MemoryTransaction(TableTransaction):
    """One table's rows from one writer attempt: one label (per_flush=False) or one per flush (per_flush=True)."""

    def __init__(self, target: MemoryTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table, self._new_ref, self._record_intent = target, table, new_ref, record_intent
        self._parts: list[tuple[TxnRef, _Txn]] = []

    def write(self, chunk: pa.Table) -> None:
        if not self._parts or self._target.per_flush:
            ref = self._new_ref(len(self._parts))
            self._record_intent(ref)  # the intent is durable before anything begins
            self._parts.append((ref, self._target._begin(ref.label, self._table)))
        ref, txn = self._parts[-1]
        self._target._write(txn, chunk)
        if self._target.per_flush:
            self._target._prepare(txn)  # per flush: each flush ends pre-committed

    def prepare(self) -> list[PreparedPart]:
        parts = []
        for ref, txn in self._parts:
            if txn.state is MemoryTxnState.BEGUN:
                self._target._prepare(txn)
            parts.append(PreparedPart(ref, txn.txn_id, len(txn.rows), txn.bytes))
        return parts

    def abort(self) -> None:
        for ref, _ in self._parts:
            self._target._abort(ref.label)
