"""One writer partition of one micro-batch: route, buffer per table, flush into transactions, prepare.

The writer runs in a Spark task (network targets) or in the driver (embedded targets). It holds at
most `flush_bytes` of Arrow data, across all its tables, before sending the largest buffer, so its
memory grows neither with the batch nor with the number of tables. It records an intent in the
state store before any transaction begins (through the target's `record_intent` callback),
confirms it after the begin (a writer that began after the driver's final abort aborts its own
transaction), and returns committables carrying the partition's checksum.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

import pyarrow as pa

from .batch_plan import BatchPlan
from .committable import Committable, TxnRef
from .errors import ReplayAlignmentError
from .labels import Attempt, make_label, wave_partition
from .replay import ReplayPlan
from .routing import Router
from .state import StateStore
from .targets.base import NewRef, TableTransaction, Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteContext:
    """Everything a writer needs to know about the batch; small and picklable, shipped to tasks."""

    job_id: str
    query_id: str
    batch_id: int
    epoch: int
    write_pass: int  # how many times this driver has written this batch before (fresh labels each pass)
    flush_bytes: int
    replay: ReplayPlan | None = None  # what a replay pass reloads and skips; None: a first pass writes everything
    plan: BatchPlan | None = None  # writers per table and waves (`batch_plan.py`); None: every table, unspread
    wave: int = 0  # the wave of `plan` this pass writes

    def attempt(self, task_attempt: int) -> str:
        return str(Attempt(self.epoch, self.write_pass, task_attempt))

    def writes(self, table: str) -> bool:
        """Whether this pass writes `table`'s rows: every table without a plan; with one, `BatchPlan.in_wave`."""
        return self.plan is None or self.plan.in_wave(table, self.wave)


@dataclass
class PartitionResult:
    """What one writer returns to the driver."""

    partition: int
    attempt: str
    checksum: str
    rows: int
    committables: list[Committable] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["committables"] = [c.encode() for c in self.committables]
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> PartitionResult:
        data = json.loads(text)
        data["committables"] = [Committable.decode(c) for c in data["committables"]]
        return cls(**data)


#: Marks a checksum whose sources were the Arrow batches themselves (`ContentChecksum.update` without a source).
PER_BATCH = "per-batch:"


def digested_per_batch(checksum: str) -> bool:
    """Whether a recorded checksum took each Arrow batch as its own source (unmarked: a source per Spark partition,
    as the driver's writer digested before it read its batches untagged)."""
    return checksum.partition(":")[2].startswith(PER_BATCH)


class ContentChecksum:
    """Digest of a writer's Arrow batches: order-sensitive within each source, not across sources.

    Spark re-runs a batch with the same offsets, so a replayed Kafka partition delivers the same
    rows in the same order, cut into the same Arrow batches; a different digest means the source
    did not replay the same data. A task's writer has one source, its Spark partition: its
    checksum is that source's digest. The driver's one writer takes every partition of a batch,
    in the order they finish and under numbers a re-run may change, and does not know which
    partition a batch came from (tagging every row with it costs Spark a copy of every row), so
    each Arrow batch is a source of its own (`update(batch)` with no source; marked `PER_BATCH`).
    Several sources' digests are combined sorted.
    """

    def __init__(self) -> None:
        self._digests: dict[int, hashlib._Hash] = {}
        self._per_batch = False
        self.rows = 0

    @property
    def sources(self) -> int:
        """Sources that delivered rows."""
        return len(self._digests)

    def update(self, batch: pa.RecordBatch, source: int | None = 0) -> None:
        """`source` None: the batch is a source of its own."""
        if batch.num_rows == 0:
            return  # no content; and the driver-side path never sees empty batches
        if source is None:
            self._per_batch, source = True, -1 - len(self._digests)  # partitions, where given, are never negative
        digest = self._digests.get(source)
        if digest is None:
            digest = self._digests[source] = hashlib.sha256()
        digest.update(batch.serialize())
        self.rows += batch.num_rows

    def hexdigest(self) -> str:
        digests = sorted(d.hexdigest() for d in self._digests.values())
        if len(digests) == 1:
            combined = digests[0]
        else:
            combined = hashlib.sha256("".join(digests).encode()).hexdigest()
        return f"{self.rows}:{PER_BATCH if self._per_batch else ''}{combined[:32]}"


class PartitionWriter:
    def __init__(
        self,
        context: WriteContext,
        target: Target,
        router: Router,
        store: StateStore,
        partition: int,
        task_attempt: int = 0,
    ) -> None:
        self._context, self._target, self._router, self._store = context, target, router, store
        # a wave's writers are numbered apart from the other waves' (their labels and checksums never collide)
        self._partition = partition if context.plan is None else wave_partition(context.wave, partition)
        self._wave_rows = 0  # with a plan: the rows of this wave's tables, all this pass delivers
        self._attempt = context.attempt(task_attempt)
        self._checksum = ContentChecksum()
        self._buffers: dict[str, list[pa.RecordBatch]] = {}
        self._buffered_bytes: dict[str, int] = {}
        self._transactions: dict[str, TableTransaction] = {}
        self.peak_buffered_bytes = 0  # the most this writer ever held unsent: the memory bound, measured
        self._flushes: dict[str, int] = {}  # flushes so far per table, skipped ones included
        self._written: dict[str, list[tuple[int, int]]] = {}  # per table: (flush number, rows) of each write
        self._unconfirmed: list[TxnRef] = []  # intents recorded whose begin has not been confirmed yet

    def add(self, batch: pa.RecordBatch, source: int | None = 0) -> None:
        """`source`: the Spark partition the batch came from, or None for the driver's writer, which takes several
        partitions untagged (`ContentChecksum`)."""
        self._checksum.update(batch, source)
        for table, rows in self._router.split(batch):
            if rows.num_rows == 0 or not self._context.writes(table):
                continue
            self._wave_rows += rows.num_rows
            # A replay keeps only the tables it reloads, but counts every table's bytes as the first
            # pass did, so flushes fall on the same rows and committed ones can be recognised.
            replay = self._context.replay
            if replay is None or replay.wants(table, self._partition):
                self._buffers.setdefault(table, []).append(rows)
            self._buffered_bytes[table] = self._buffered_bytes.get(table, 0) + rows.nbytes
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, sum(self._buffered_bytes.values()))
            self._flush_over_budget()

    def _flush_over_budget(self) -> None:
        """One bound for the whole writer, whatever the number of tables: while the buffers together
        hold `flush_bytes` or more, send the largest (ties by name, so a replay flushes the same rows)."""
        while self._buffered_bytes and sum(self._buffered_bytes.values()) >= self._context.flush_bytes:
            largest = max(self._buffered_bytes.items(), key=lambda item: (item[1], item[0]))[0]
            self._flush(largest)

    def add_all(self, batches: Iterable[pa.RecordBatch]) -> PartitionResult:
        """Write every batch and prepare; on any failure abort what this writer began, then re-raise."""
        try:
            for batch in batches:
                self.add(batch)
            return self.finish()
        except BaseException:
            self.abort()
            raise

    def finish(self) -> PartitionResult:
        for table in sorted(self._buffered_bytes):
            self._flush(table)
        committables = []
        checksum = self._checksum.hexdigest()
        for table in sorted(self._transactions):
            parts = self._transactions[table].prepare()
            written = self._written.get(table, [])
            # Only then can a replay tell committed flushes apart; and only with one source: the flushes of a
            # writer that takes several partitions fall where their arrival order put them, which a re-run changes.
            one_per_flush = len(parts) == len(written) and self._checksum.sources <= 1
            for index, part in enumerate(parts):
                flush, rows = written[index] if one_per_flush else (None, None)
                # the target's counts of rejected rows arrive in `extra`; the journal holds them typed
                committables.append(replace(part.committable(checksum), flush=flush, flush_rows=rows))
        # the checksum digests the whole partition (the same in every wave, so a replay matches partitions by it);
        # the rows are those this pass delivers, so each wave adds up on its own
        delivered = self._checksum.rows if self._context.plan is None else self._wave_rows
        return PartitionResult(self._partition, self._attempt, checksum, delivered, committables)

    def abort(self) -> None:
        for table, transaction in self._transactions.items():
            try:
                transaction.abort()
            except Exception as error:  # not fatal: the targets send their abort again on a lost answer already
                # while the batch is open, the driver's sweep aborts it from its intent; a late attempt's, shut out of
                # a closed batch, ends at the server's transaction timeout (or `recover`, where the server lists it)
                log.warning("abort of the %s transaction of partition %s failed (%s); it is left to the driver's "
                            "sweep, or to the server's timeout if its batch is closed", table, self._partition, error)

    def _flush(self, table: str) -> None:
        batches = self._buffers.pop(table, [])
        if self._buffered_bytes.pop(table, None) is None:
            return
        flush = self._flushes.get(table, 0)
        self._flushes[table] = flush + 1
        if not batches:
            return  # a table this replay does not reload: counted, not sent
        rows = sum(b.num_rows for b in batches)
        replay = self._context.replay
        committed = replay.committed_rows(table, self._partition, flush) if replay is not None else None
        if committed is not None:
            if committed != rows:
                raise ReplayAlignmentError(
                    f"replay of {table!r} partition {self._partition}: flush {flush} has {rows} rows but the committed "
                    f"one had {committed}; the flush size or Arrow batch size changed since the batch was prepared"
                )
            return  # committed before the rest of this (table, partition) was lost
        self._written.setdefault(table, []).append((flush, rows))
        if table not in self._transactions:
            self._transactions[table] = self._target.begin(table, self._new_ref_for(table), self._record_intent)
        self._transactions[table].write(pa.Table.from_batches(batches))
        self._confirm_intents()

    def _new_ref_for(self, table: str) -> NewRef:
        context = self._context

        def new_ref(chunk: int) -> TxnRef:
            label = make_label(
                context.job_id, context.query_id, context.batch_id, table, self._partition, self._attempt, chunk
            )
            return TxnRef(self._target.kind, self._target.database, table, label, self._partition, self._attempt)

        return new_ref

    def _record_intent(self, ref: TxnRef) -> None:
        c = self._context
        self._store.add_intent(c.job_id, c.epoch, c.query_id, c.batch_id, ref)
        self._unconfirmed.append(ref)

    def _confirm_intents(self) -> None:
        """After a begin, the intent must still stand (R6): if the driver aborted it or closed the batch in
        between, this raises and `add_all` (or the driver-side runner) aborts what this writer began."""
        c = self._context
        while self._unconfirmed:
            self._store.confirm_intent(c.job_id, c.epoch, c.query_id, c.batch_id, self._unconfirmed[0])
            self._unconfirmed.pop(0)
