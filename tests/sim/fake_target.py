"""An in-memory OLAP server with real transaction semantics, and a `Target` client for it.

The server keeps what a StarRocks or Doris frontend keeps: one transaction per label with its
state (begun, prepared, visible, aborted) and its rows, a clock, prepared and running transactions
that expire (-> aborted), and finished labels that it forgets after a while or beyond a count
(after which a commit by that label answers LOST: the server cannot tell committed from never
committed). The client (`FakeTarget`) talks to it through `self.server`, which the simulation
replaces by a fault-injecting proxy: every server call is then a point where the answer can be
lost, the caller killed, or another actor scheduled.

Two shapes, as the real targets have:
* `per_flush=False` (StarRocks): one transaction per (table, writer attempt), label chunk 0,
  begin at the first write, several loads, one prepare;
* `per_flush=True` (Doris): each flush is its own pre-committed transaction under its own label,
  so a writer attempt returns one prepared part per flush.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import pyarrow as pa

from streaming_sink.batch_plan import ServerLimits
from streaming_sink.committable import Committable, TxnRef
from streaming_sink.targets.base import (
    CommitOutcome,
    CommittedNotChosenError,
    NewRef,
    PreparedPart,
    RecordIntent,
    TableTransaction,
    Target,
    TargetError,
)


class SimulatedTimeout(TimeoutError):
    """A call whose answer never came back; whether it was applied is for the caller to find out."""


class TxnState(str, Enum):
    BEGUN = "BEGUN"
    PREPARED = "PREPARED"
    VISIBLE = "VISIBLE"
    ABORTED = "ABORTED"


OPEN = (TxnState.BEGUN, TxnState.PREPARED)


class SimClock:
    """Simulated seconds; the scheduler moves it, nothing sleeps."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Txn:
    label: str
    table: str
    txn_id: int
    owner: str  # the simulated process that began it
    began_at: float
    state: TxnState = TxnState.BEGUN
    ids: list[int] = field(default_factory=list)
    prepared_at: float | None = None
    finished_at: float | None = None
    why: str = ""  # how it ended, for failure reports
    commit_epochs: list[int | None] = field(default_factory=list)  # the sender's epoch of each commit it received


class FakeOlapServer:
    """The server side. Methods are its RPCs; `who` names the caller (set by the simulation)."""

    def __init__(
        self,
        tables: list[str],
        clock: SimClock,
        txn_timeout: float = 600.0,  # running and prepared transactions abort after this
        label_keep_seconds: float = 3 * 86400.0,  # finished labels are forgotten after this
        label_keep_count: int | None = None,  # and beyond this many finished labels (Doris label_num_threshold)
        # StarRocks label_keep_max_num: running transactions count against label_keep_count too
        keep_count_includes_running: bool = False,
    ) -> None:
        self.tables = list(tables)
        self.clock = clock
        self.txn_timeout, self.label_keep_seconds, self.label_keep_count = txn_timeout, label_keep_seconds, label_keep_count
        self.keep_count_includes_running = keep_count_includes_running
        self.txns: dict[str, Txn] = {}
        self.forgotten: dict[str, Txn] = {}  # what the server no longer knows, kept for the checker only
        self.visible: dict[str, list[tuple[int, str]]] = {t: [] for t in tables}  # (row id, label)
        self.history: list[Txn] = []  # every transaction ever begun, in order
        self._next_id = 1
        self.who: Callable[[], str] = lambda: "?"
        self.on_visible: Callable[[Txn], None] = lambda txn: None  # the checker's hook (I1)
        self.on_abort_call: Callable[[str, Txn | None], None] = lambda label, txn: None  # the checker's hook (I5)
        self.on_commit_call: Callable[[str, Txn | None], None] = lambda label, txn: None  # the checker's hook (I5)
        self.epoch_of: Callable[[], int | None] = lambda: None  # the fencing epoch of the caller (set by the simulation)
        self.on_label_reuse: Callable[[Txn], None] = lambda earlier: None  # the checker's hook (I4)

    # -- time ------------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.clock.now
        for txn in self.txns.values():
            started = txn.prepared_at if txn.state is TxnState.PREPARED else txn.began_at
            if txn.state in OPEN and started is not None and now - started > self.txn_timeout:
                txn.state, txn.finished_at, txn.why = TxnState.ABORTED, started + self.txn_timeout, "expired"
        finished = sorted((t for t in self.txns.values() if t.finished_at is not None), key=lambda t: t.finished_at)
        drop = [t for t in finished if now - t.finished_at > self.label_keep_seconds]
        if self.label_keep_count is not None:
            kept = [t for t in finished if t not in drop]
            room = self.label_keep_count
            if self.keep_count_includes_running:
                room -= sum(1 for t in self.txns.values() if t.state in OPEN)
            drop += kept[: max(len(kept) - max(room, 0), 0)]
        for txn in drop:
            self.forgotten[txn.label] = self.txns.pop(txn.label)

    # -- RPCs ------------------------------------------------------------------------------------

    def begin(self, label: str, table: str) -> int:
        self._tick()
        if table not in self.tables:
            raise TargetError(f"unknown table {table!r}")
        earlier = self.txns.get(label) or self.forgotten.get(label)
        if earlier is not None:
            self.on_label_reuse(earlier)
        if label in self.txns:
            raise LabelAlreadyUsed(label, self.txns[label].state)
        txn = Txn(label, table, self._next_id, self.who(), self.clock.now)
        self._next_id += 1
        self.txns[label] = txn
        self.history.append(txn)
        return txn.txn_id

    def load(self, label: str, ids: list[int]) -> None:
        self._tick()
        txn = self.txns.get(label)
        if txn is None or txn.state is not TxnState.BEGUN:
            raise TargetError(f"load into label {label}: {txn.state.value if txn else 'unknown'}, not BEGUN")
        txn.ids.extend(ids)

    def prepare(self, label: str) -> int:
        self._tick()
        txn = self.txns.get(label)
        if txn is not None and txn.state is TxnState.PREPARED:
            return len(txn.ids)
        if txn is None or txn.state is not TxnState.BEGUN:
            raise TargetError(f"prepare of label {label}: {txn.state.value if txn else 'unknown'}, not BEGUN")
        txn.state, txn.prepared_at = TxnState.PREPARED, self.clock.now
        return len(txn.ids)

    def load_2pc(self, label: str, table: str, ids: list[int]) -> int:
        """Doris: one stream load with two_phase_commit = begin, load and pre-commit in one request."""
        txn_id = self.begin(label, table)
        self.load(label, ids)
        self.prepare(label)
        return txn_id

    def commit(self, label: str) -> str:
        self._tick()
        txn = self.txns.get(label)
        self.on_commit_call(label, txn)
        if txn is not None:
            txn.commit_epochs.append(self.epoch_of())
        if txn is None:
            return CommitOutcome.LOST.value
        if txn.state is TxnState.ABORTED:
            return CommitOutcome.ABORTED.value
        if txn.state is TxnState.BEGUN:
            raise TargetError(f"commit of label {label}: the transaction was never prepared")
        if txn.state is TxnState.PREPARED:
            txn.state, txn.finished_at, txn.why = TxnState.VISIBLE, self.clock.now, f"committed by {self.who()}"
            self.visible[txn.table].extend((i, label) for i in txn.ids)
            self.on_visible(txn)
        return CommitOutcome.COMMITTED.value

    def abort(self, label: str) -> None:
        self._tick()
        txn = self.txns.get(label)
        self.on_abort_call(label, txn)
        if txn is None or txn.state is TxnState.ABORTED:
            return
        if txn.state is TxnState.VISIBLE:
            raise CommittedNotChosenError(f"label {label} is already committed and cannot be aborted")
        txn.state, txn.finished_at, txn.why = TxnState.ABORTED, self.clock.now, f"aborted by {self.who()}"

    def state(self, label: str) -> str:
        self._tick()
        txn = self.txns.get(label)
        return txn.state.value if txn else "UNKNOWN"

    # -- what a reader sees (not an RPC: no faults) ----------------------------------------------

    def open_labels(self, prefix: str) -> list[str]:
        """What a server that can list its open transactions answers (ClickHouse lists staging tables)."""
        self._tick()
        return sorted(label for label, t in self.txns.items() if t.state in OPEN and label.startswith(prefix))

    def visible_rows(self, table: str) -> list[int]:
        return [i for i, _ in self.visible[table]]

    def open_txns(self) -> list[Txn]:
        self._tick()
        return [t for t in self.txns.values() if t.state in OPEN]


class LabelAlreadyUsed(TargetError):
    def __init__(self, label: str, state: TxnState) -> None:
        super().__init__(f"label {label} already used ({state.value})")
        self.state = state


class FakeTarget(Target):
    """The client side, as careful as the real ones: it resolves lost answers through the label state."""

    kind = "sim"
    database = "db"

    def __init__(self, server: FakeOlapServer, per_flush: bool, lists_leftovers: bool = True, commit_parallelism: int = 1,
                 running_limit: int | None = None) -> None:
        self.server = server  # the simulation swaps in a fault-injecting proxy
        self.running_limit = running_limit  # what the sink is told the server allows (the fake enforces no limit)
        self.per_flush = per_flush
        self.lists_leftovers = lists_leftovers  # can the server list open transactions (like ClickHouse)?
        self._parallelism = commit_parallelism
        # told of every commit answer the client hands the sink (the checker's: which answers proved what)
        self.on_answer: Callable[[str, CommitOutcome], None] = lambda label, outcome: None

    @property
    def commit_parallelism(self) -> int:
        """Above 1 the sink's pool path runs; the simulation makes its threads simulated actors, so it stays seeded."""
        return self._parallelism

    def routable_tables(self) -> set[str] | None:
        return None  # like StarRocks: a wrong table fails at the server's begin

    def server_limits(self) -> ServerLimits:
        return ServerLimits(self.running_limit, None, "simulation")

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        if self.per_flush:
            return _PerFlushTransaction(self, table, new_ref, record_intent)
        return _PerWriterTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        outcome = self._commit(committable.label)
        self.on_answer(committable.label, outcome)
        return outcome

    def _commit(self, label: str) -> CommitOutcome:
        for _ in range(3):
            try:
                return CommitOutcome(self.server.commit(label))
            except SimulatedTimeout:
                state = self.server.state(label)  # the answer was lost: ask what happened
                if state == TxnState.VISIBLE.value:
                    return CommitOutcome.COMMITTED
                if state == TxnState.ABORTED.value:
                    return CommitOutcome.ABORTED
                if state == "UNKNOWN":  # the lost commit may have landed, and the label been forgotten since
                    return CommitOutcome.LOST_AFTER_SEND
                # still PREPARED: the commit did not get through; send it again
        raise TargetError(f"commit of {label} kept timing out")

    def leftover_transactions(self, label_prefix: str) -> list[str] | None:
        return self.server.open_labels(label_prefix) if self.lists_leftovers else None

    def abort(self, ref: TxnRef) -> None:
        """Sent again when its answer is lost, as the real targets send their idempotent rollback (a writer's one try
        left a late twin's transaction open, which no sweep names once its batch closed)."""
        for _ in range(3):
            try:
                self.server.abort(ref.label)
                return
            except SimulatedTimeout:
                continue
        raise TargetError(f"abort of {ref.label} kept timing out; it expires at the server's timeout")


class _PerWriterTransaction(TableTransaction):
    """StarRocks-like: one label for all chunks of one writer attempt's table."""

    def __init__(self, target: FakeTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table, self._new_ref, self._record_intent = target, table, new_ref, record_intent
        self._ref: TxnRef | None = None
        self._txn_id: int | None = None
        self._rows = 0

    def write(self, chunk: pa.Table) -> None:
        server = self._target.server
        if self._ref is None:
            ref = self._new_ref(0)
            self._record_intent(ref)
            self._ref = ref
            try:
                self._txn_id = server.begin(ref.label, ref.table)
            except (SimulatedTimeout, LabelAlreadyUsed) as error:
                # as the StarRocks client does: our own begin may have landed; adopt a running transaction
                if server.state(ref.label) != TxnState.BEGUN.value:
                    raise TargetError(f"begin of {ref.label} failed: {error}") from error
        ids = chunk.column("id").to_pylist()
        server.load(self._ref.label, ids)
        self._rows += len(ids)

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        server = self._target.server
        try:
            rows = server.prepare(self._ref.label)
        except SimulatedTimeout:
            if server.state(self._ref.label) != TxnState.PREPARED.value:
                raise
            rows = self._rows
        if rows != self._rows:  # a load whose answer was lost may or may not have landed
            raise TargetError(f"label {self._ref.label}: server holds {rows} rows, writer sent {self._rows}")
        return [PreparedPart(self._ref, str(self._txn_id), self._rows, 8 * self._rows)]

    def abort(self) -> None:
        if self._ref is not None:
            self._target.abort(self._ref)


class _PerFlushTransaction(TableTransaction):
    """Doris-like: every flush is one pre-committed transaction under its own label."""

    def __init__(self, target: FakeTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table, self._new_ref, self._record_intent = target, table, new_ref, record_intent
        self._parts: list[PreparedPart] = []
        self._refs: list[TxnRef] = []

    def write(self, chunk: pa.Table) -> None:
        ref = self._new_ref(len(self._refs))
        self._record_intent(ref)
        self._refs.append(ref)
        ids = chunk.column("id").to_pylist()
        try:
            txn_id = self._target.server.load_2pc(ref.label, ref.table, ids)
        except SimulatedTimeout as error:
            raise TargetError(f"stream load of {ref.label}: no answer") from error
        self._parts.append(PreparedPart(ref, str(txn_id), len(ids), 8 * len(ids), {"load_bytes": 8 * len(ids)}))

    def prepare(self) -> list[PreparedPart]:
        return list(self._parts)

    def abort(self) -> None:
        for ref in self._refs:
            self._target.abort(ref)
