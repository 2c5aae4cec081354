"""ExactlyOnceSink: the `foreachBatch` callable that coordinates one two-phase commit per micro-batch.

Spark writes `offsets/N` before calling us with batch N and `commits/N` after we return, and re-runs
an uncommitted batch with the same N and the same data. Inside that window:

1. recover — COMMITTED: return; PREPARED: commit it (replaying lost parts), return; otherwise abort
   the batch's leftover intents; sweep older batches;
2. write   — writers (tasks or driver) record intents, load and prepare, return committables;
3. decide  — one atomic PREPARED record with every committable: the commit point;
4. commit  — commit each committable, record progress, mark COMMITTED, abort unchosen intents.
"""
from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .batch_log import BatchLog
from .batch_plan import BatchPlan
from .changes import OP_COLUMN, POSITION_COLUMN, VERSION_COLUMN
from .checkpoint import kafka_layout_changes, planned_offsets, same_source, source_ranges
from .checkpoint_marker import CheckpointMarker
from .committable import Committable
from .committer import Committer
from .crash import crash_point
from .errors import (
    BatchDoesNotAddUpError,
    KafkaOffsetsMovedError,
    ReplayLostAgainError,
    ReplayMismatchError,
    RerunRoutedDifferentlyError,
    SourceReplannedError,
    StopForOperator,
    StreamingSinkError,
    UnplannedTableError,
    transient_cause,
)
from .job_id import JOB_ID as _JOB_ID
from .labels import partition_wave, pass_prefix
from .liveness import HEARTBEAT_SECONDS, Heartbeat, process_owner
from .records import COMMITTED_AT, BatchState
from .replay import ReplayPlan
from .retry import RetryPolicy
from .routing import Router
from .state import BatchRecord, FileStateStore, StateStore, StateStoreLostError
from .targets.base import ConfigurationError, Target, TransactionLimitError
from .waves import BatchPlanner, too_many_transactions
from .writer import PartitionResult, WriteContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("streaming_sink")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: A batch's first write pass that failed on a transient fault (`errors.TRANSIENT_CAUSES`) is aborted and written
#: again under fresh labels, this often: nothing of it is recorded yet, and the sink holds the batch.
REWRITES = RetryPolicy(retries=2, backoff_s=1.0, backoff_max_s=10.0, deadline_s=120.0)


class WriterRunner(Protocol):
    """Runs one writer per partition of a micro-batch and returns what each prepared.

    The default runs Spark tasks (`execution.SparkWriterRunner`); the simulation runs in-memory
    Arrow batches, so the coordinator itself never needs Spark. A runner may also `keep(data)` for the passes of
    a planned batch (its count keeps it too) and `release()` what it kept, which the sink calls when each batch ends.
    """

    def run(
        self, data: Any, target: Target, router: Router, context: WriteContext, store: StateStore
    ) -> list[PartitionResult]: ...

    def writer_count(self, data: Any, target: Target) -> int:
        """Writers the batch has without a plan (its partitions, or one for writers in the driver)."""
        ...

    def table_rows(self, data: Any, router: Router) -> dict[str, int]:
        """Rows per table in the batch, tables without rows left out: what a `BatchPlan` is made from."""
        ...


@dataclass
class BatchReport:
    """What one call did, for logs, metrics and tests."""

    batch_id: int
    action: str  # written | empty | recovered-prepared | already-committed
    records_in: int = 0  # rows the batch delivered to the writers
    rows: int = 0  # rows made visible, all tables together (= records_in)
    rows_by_table: dict[str, int] | None = None
    dead_letters: int = 0  # of `rows`, those in the dead-letter table
    bytes: int = 0
    transactions: int = 0
    waves: int = 1  # the two-phase rounds the batch was committed in (`waves.py`)
    replayed: int = 0
    timings: dict[str, float] | None = None


class ExactlyOnceSink:
    """Use as `df.writeStream.foreachBatch(ExactlyOnceSink(...))`. One driver per `job_id` at a time."""

    def __init__(
        self,
        target: Target,
        state: StateStore,
        job_id: str,
        table: str | None = None,
        table_column: str | None = None,
        flush_bytes: int = 64 * 1024 * 1024,
        retain_batches: int = 100,
        table_slots: Mapping[str, tuple[tuple[str, str], ...]] | None = None,
        dead_letter_table: str | None = None,
        listeners: list[Callable[[BatchReport], None]] | None = None,
        runner: WriterRunner | None = None,
        checkpoint_location: str | None = None,
        accept_empty_state: bool = False,
        heartbeat_seconds: float | None = HEARTBEAT_SECONDS,
        transaction_share: float = 0.5,
        spread: str = "auto",
        spread_above: int = 100,
        change_key: Sequence[str] = (),
    ) -> None:
        if not _JOB_ID.match(job_id):
            raise ConfigurationError(f"job_id {job_id!r}: 1-64 characters of letters, digits, '.', '_' or '-'")
        if (table is None) == (table_column is None):
            raise ConfigurationError("give exactly one of table=... or table_column=...")
        if flush_bytes <= 0:
            raise ConfigurationError(f"flush_bytes must be positive, got {flush_bytes}")
        if retain_batches < 1:
            raise ConfigurationError(f"retain_batches must be at least 1 (batch N proves the store by N-1), got {retain_batches}")
        # a batch holds at most this share of the server's transaction limits at once, in waves if need be
        self.planner = BatchPlanner(transaction_share, spread, spread_above)
        self.target, self.state, self.job_id = target, state, job_id
        self.table, self.table_column = table, table_column
        self.flush_bytes, self.retain_batches = flush_bytes, retain_batches
        self.table_slots = table_slots  # with table_column: each table's columns in slots of the data (Router)
        # rows with `__op` set are changes of the key these columns name, within their table (latest_changes.py)
        self.change_key = tuple(change_key)
        self.dead_letter_table = dead_letter_table  # only to report dead letters apart from loaded rows
        self.listeners = list(listeners or [])  # told of every batch's report (metrics)
        self.runner = runner if runner is not None else _spark_runner()
        # Where the epoch's high-water mark lives (the streaming checkpoint): epochs never go back (R2). In a
        # streaming query it is found from Spark when not given, so the marker and the offset log are always read.
        self.checkpoint_location = checkpoint_location
        # Start on a store that holds nothing for this job although Spark is past batch 0 (deliberate fresh store).
        self.accept_empty_state = accept_empty_state
        # How often the driver tells operators' commands it is alive (None: never; the simulation's drivers)
        self.heartbeat_seconds = heartbeat_seconds
        self._heartbeat: Heartbeat | None = None
        self._spark: Any = None
        self._marker: CheckpointMarker | None = None
        self._leftovers_swept = False  # the first batch of this driver clears the server's unnamed leftovers
        self._router: Router | None = None
        self._expected_tables: frozenset[str] = frozenset()  # `expect_tables`
        self._seen_tables: frozenset[str] = frozenset()  # the tables this driver's committed batches held
        self._committer: Committer | None = None
        self._query_id: str | None = None  # the query of the batch being processed
        self._write_passes: tuple[tuple[str, int] | None, int] = (None, 0)  # (batch, passes written by this driver)
        self.last_report: BatchReport | None = None

    # -- start-up ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Check the target and take the fencing epoch; idempotent. Fails before any data moves."""
        if self._committer is not None:
            return
        tables = self.target.routable_tables()
        self.planner.start(self.target)
        self._router = Router(
            frozenset(tables) if tables is not None else None, self.table, self.table_column, self.table_slots
        )
        marker = CheckpointMarker(self.checkpoint_location, self.job_id, self._spark) if self.checkpoint_location else None
        floor = marker.epoch() if marker else 0
        if self.state.current_epoch(self.job_id) < floor:
            log.warning("job %s: the state store's epoch is below the %d this checkpoint saw: it lost state; "
                        "taking a higher one (the first batch checks the journal)", self.job_id, floor)
        epoch = self.state.take_epoch(self.job_id, owner=process_owner(), at_least=floor + 1)
        if marker:
            marker.advance_epoch(epoch)
        self._marker = marker
        self._committer = Committer(self.target, self.state, self.job_id, epoch)
        self._committer.before_send = self._mark_sending
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.heartbeat_seconds is not None:
            self._heartbeat = Heartbeat(self.state, self.job_id, epoch, self.heartbeat_seconds)
            weakref.finalize(self, self._heartbeat.stop)  # a sink dropped without close() stops beating too
        log.info("job %s: driver took fencing epoch %d", self.job_id, epoch)

    def close(self) -> None:
        """The driver is done: its heartbeat stops (operators' commands may act at once), then the target and
        the state store it was given are closed."""
        if self._heartbeat is not None:
            self._heartbeat.end()
        self.target.close()
        self.state.close()

    @property
    def known_tables(self) -> set[str] | None:
        """The tables the target said rows may go to (None: it cannot tell)."""
        assert self._router is not None, "start() first"
        return set(self._router.known_tables) if self._router.known_tables is not None else None

    def expect_tables(self, tables: Collection[str]) -> None:
        """The tables rows may route to, when the caller knows them and the target cannot list them (the packaged job
        resolves its own): a batch of few known tables is then written without counting its rows to plan it."""
        self._expected_tables = frozenset(tables)

    def route_by_slots(self, table_slots: Mapping[str, tuple[tuple[str, str], ...]]) -> None:
        """Where each table's columns are in the data (`Router.table_slots`), when the caller lays them out only once
        the target's tables are known (the packaged job, after `start`); before the first batch."""
        self.table_slots = table_slots
        if self._router is not None:
            self._router = replace(self._router, table_slots=table_slots)

    @property
    def epoch(self) -> int:
        assert self._committer is not None, "start() first"
        return self._committer.epoch

    # -- the foreachBatch callable ----------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise ConfigurationError(
                "ExactlyOnceSink must run as a streaming query's foreachBatch (no streaming query id found)"
            )
        if self._spark is None:
            self._spark = spark
            self._check_store_reaches_writers(spark.sparkContext.master)
            if self.checkpoint_location is None:
                self.checkpoint_location = _checkpoint_root(spark, query_id)
                if self._committer is not None and self.checkpoint_location is not None:
                    self._committer = None  # started before the checkpoint was known: take the epoch again above its mark
        self.process(df, int(batch_id), query_id)

    def _check_store_reaches_writers(self, master: str | None) -> None:
        """A file store is local to one machine: writers in tasks on other hosts would not see it (O3).

        Only a `local` master runs the tasks on this machine; None (a running SparkContext always has a master)
        is not known to be local."""
        if isinstance(self.state, FileStateStore) and not self.target.runs_writers_in_driver and (
            master is None or not master.startswith("local")
        ):
            raise ConfigurationError(
                f"the file state store {self.state.url} is local to this machine, but {self.target.kind} writers run "
                f"in Spark tasks on the cluster ({master}); use a Redis state store that the driver and every executor reach"
            )

    def process(self, df: Any, batch_id: int, query_id: str) -> BatchReport:
        self.start()
        self._check_offset_versions(df, batch_id, query_id)
        df = self._one_change_per_key(df)
        try:
            report = self._process(df, batch_id, query_id)
        except StreamingSinkError as stop:
            if stop.runbook_section:  # a documented stop an operator must act on, whatever its class (F6, N5)
                self._record_stop(query_id, batch_id, stop)
            raise
        finally:  # what a planned batch's passes kept (`keep`) goes with the batch, however it ended
            release = getattr(self.runner, "release", None)
            if release is not None:
                release()
        self.last_report = report
        log.info("streaming_sink.batch %s", json.dumps({"job": self.job_id, **report.__dict__}, sort_keys=True))
        for listener in self.listeners:
            listener(report)
        return report

    def _check_offset_versions(self, df: Any, batch_id: int, query_id: str) -> None:
        """Versions that are Kafka offsets (`__version` equal to the row's `__position`, the offset: Debezium without
        `source.lsn`) order a key's changes only while the key stays in one partition of one topic. A topic that gained
        or lost partitions since the journal's previous batch may have moved keys to partitions with lower offsets,
        and a re-created one starts its offsets again: newer changes would then lose to older ones, in the batch's own
        reduction and in every version-ordered table. Stop before writing such a batch. Rows without `__position`
        cannot tell, and are taken for offsets. Checked once per batch of one checkpoint, before its record exists
        (docs/runbook.md, 'Kafka partitions or offsets changed under offset versions')."""
        if not self.change_key or self._marker is None or batch_id == 0:
            return
        previous = self.state.get_batch(self.job_id, query_id, batch_id - 1)
        changed = kafka_layout_changes(previous.source if previous else None, planned_offsets(self._marker.folder, batch_id))
        if not changed or self.state.get_batch(self.job_id, query_id, batch_id) is not None:
            return
        if hasattr(df, "sparkSession") and POSITION_COLUMN in df.columns:
            from pyspark.sql import functions as F

            offsets = df.filter(F.col(OP_COLUMN).isNotNull() & (F.col(VERSION_COLUMN) == F.col(POSITION_COLUMN)))
            if not offsets.limit(1).count():
                return
        raise KafkaOffsetsMovedError(
            f"job {self.job_id} batch {batch_id}: {'; '.join(changed)} since batch {batch_id - 1}; its change events' "
            "versions are Kafka offsets, which no longer order a key's changes. " + KafkaOffsetsMovedError.RUNBOOK)

    def _one_change_per_key(self, df: Any) -> Any:
        """A Spark batch of change rows, one change per (table, key) (`latest_changes.py`): two changes of a key in two
        transactions would land in whatever order they commit, and in one StarRocks load its deletes apply after its
        upserts (docs/protocol.md). The key is the caller's to name, never taken from the server: a sink of several
        tables has no one key, and a server that cannot tell it would make the same job reduce on one release and
        not on another. Data other runners lay out themselves (Arrow partitions) is the caller's."""
        if self.change_key:
            from .latest_changes import latest_changes

            return latest_changes(df, self.table_column, self.change_key)
        if hasattr(df, "sparkSession") and OP_COLUMN in df.columns:
            key = self.target.table_key(self.table) if self.table is not None else None
            fix = f"change_key={list(key)!r} (table {self.table}'s key)" if key else "change_key=[<the key columns>]"
            raise ConfigurationError(
                f"job {self.job_id}: the batch holds change rows (column {OP_COLUMN!r}) but the sink was given no "
                f"change_key, so two changes of one key could land in any order; give ExactlyOnceSink({fix})")
        return df

    def _process(self, df: Any, batch_id: int, query_id: str) -> BatchReport:
        committer = self._committer
        assert committer is not None
        committer.check_epoch()  # a fenced driver stops here, before it reads or writes anything
        self._query_id = query_id
        planned = planned_offsets(self._marker.folder, batch_id) if self._marker else None
        record = self.state.get_batch(self.job_id, query_id, batch_id)
        if record is not None:
            self._check_record_complete(record)
            self._check_same_source(record, planned)
            if record.stop:  # the operator resolved what stopped it: the batch goes on
                batch = committer.log_of(record)
                batch.resume()
                record = batch.record
        if record is not None and record.state is BatchState.COMMITTED:
            # killed after the COMMITTED record: only the unchosen attempts may still need aborting
            committer.abort_intents(query_id, batch_id, keep={c.label for c in record.committables})
            report = BatchReport(batch_id, "already-committed")
        elif record is not None:
            report = self._recover_prepared(df, record)
        else:
            self._check_journal_continues(query_id, batch_id)
            self._resume_after_stop(query_id, batch_id)
            self._abort_leftovers_once(query_id)
            committer.abort_intents(query_id, batch_id)
            committer.sweep(skip=(query_id, batch_id), retain_batches=self.retain_batches)
            report = self._write_and_commit(df, query_id, batch_id, planned)
        return report

    def _check_record_complete(self, record: BatchRecord) -> None:
        """The record must list every label the checkpoint says commits were sent for: one that lacks some is an
        older copy (a store rolled back or failed over inside a replay, F3), and replaying again could duplicate."""
        position = self._marker.prepared() if self._marker else None
        if position is None or (position.query_id, position.batch_id) != (record.query_id, record.batch_id):
            return
        if position.missing_from(record.sent):
            raise StateStoreLostError(
                self.job_id, self.epoch, self.state.current_epoch(self.job_id),
                f"the checkpoint says commits were sent for {position.sent} label(s) of batch {record.batch_id} of "
                f"query {record.query_id}, but the state store's record of that batch lists {len(record.sent)} that "
                "do not include them all",
            )

    def _check_same_source(self, record: BatchRecord, planned: str | None) -> None:
        """Spark re-runs a batch with the range it planned, unless its offsets/N went (deleted as a corrupt last
        offset file, or a checkpoint restored from a snapshot): then it plans batch N again with another range.
        Taking that as the recorded batch would drop its new rows (F2); writing it could duplicate the old ones."""
        if same_source(record.source, planned):
            return
        raise SourceReplannedError(
            f"job {self.job_id} batch {record.batch_id} of query {record.query_id}: Spark planned this batch with "
            f"source offsets {_brief(planned)}, but the journal records it {record.state.value} with "
            f"{_brief(record.source)} (the checkpoint's offsets/{record.batch_id} was deleted or rolled back). Nothing "
            "was written. Run `streaming-sink restore-offsets` to give Spark the recorded range back, then restart. "
            + SourceReplannedError.RUNBOOK
        )

    def _record_stop(self, query_id: str, batch_id: int, stop: StreamingSinkError) -> None:
        """Keep why the job stopped in the record of the batch it is about (the running one, unless the stop names
        an older query's), so `status` tells an operator (F6); best effort. A batch stopped before its first record
        (a server that refused its first wave's transactions, N5) has its stop kept in the record of the batch before
        it, naming it, until it goes on (`_resume_after_stop`)."""
        if isinstance(stop, StopForOperator) and stop.batch_id is not None and stop.query_id is not None:
            query_id, batch_id = stop.query_id, stop.batch_id
        said = {"error": type(stop).__name__, "section": stop.runbook_section, "message": str(stop)[:2000],
                "at": time.time()}
        try:
            record = self.state.get_batch(self.job_id, query_id, batch_id)
            if record is None and batch_id > 0:
                record = self.state.get_batch(self.job_id, query_id, batch_id - 1)
                said |= {"query_id": query_id, "batch_id": batch_id}
            if record is None:
                log.error("job %s batch %s: no record to keep why the job stopped in: %s", self.job_id, batch_id, stop)
                return
            assert self._committer is not None
            self._committer.log_of(record).record_stop(said)
        except Exception as error:  # the stop itself is what the caller must see
            log.error("job %s batch %s: could not record why the job stopped (%s)", self.job_id, batch_id, error)

    def _resume_after_stop(self, query_id: str, batch_id: int) -> None:
        """A batch that stopped before its first record goes on: the stop kept for it in the batch before is cleared."""
        previous = self.state.get_batch(self.job_id, query_id, batch_id - 1) if batch_id > 0 else None
        if previous is not None and previous.stop and previous.stop.get("batch_id") == batch_id:
            assert self._committer is not None
            self._committer.log_of(previous).resume()

    def _mark_sending(self, record: BatchRecord) -> None:
        """Before the commits of this query's batch go out: the checkpoint keeps which labels were sent (I9, F3)."""
        if self._marker is not None and record.query_id == self._query_id:
            self._marker.record_sending(record.query_id, record.batch_id, record.sent)

    def _check_journal_continues(self, query_id: str, batch_id: int) -> None:
        """Spark calls batch N only after batch N-1 returned, and every batch leaves a record: no record
        of N-1 means the store lost or rolled back state, and writing N could duplicate what it forgot (R2)."""
        prepared = self._marker.prepared() if self._marker else None
        if prepared is not None and prepared.query_id == query_id and prepared.batch_id >= batch_id:
            raise StateStoreLostError(
                self.job_id, self.epoch, self.state.current_epoch(self.job_id),
                f"the checkpoint says batch {prepared.batch_id} of query {query_id} was PREPARED (commits may have "
                f"been sent), but the state store has no record of batch {batch_id}",
            )
        if batch_id == 0 or self.state.get_batch(self.job_id, query_id, batch_id - 1) is not None:
            return
        # a crashed first attempt at this very batch may have left intents: the store is still empty of history
        if self.accept_empty_state and set(self.state.batch_keys(self.job_id)) <= {(query_id, batch_id)}:
            log.warning("job %s: starting at batch %d of query %s on an empty state store (accept_empty_state)",
                        self.job_id, batch_id, query_id)
            return
        raise StateStoreLostError(
            self.job_id, self.epoch, self.state.current_epoch(self.job_id),
            f"Spark is at batch {batch_id} of query {query_id}, but the state store has no record of batch "
            f"{batch_id - 1}, which every processed batch leaves (to start deliberately on an empty store, set "
            "accept_empty_state once)",
        )

    def _abort_leftovers_once(self, query_id: str) -> None:
        """After a restart, before writing: what a dead process or a lost intent left on the server goes (I3)."""
        if not self._leftovers_swept:
            self._committer.abort_leftovers(query_id)  # type: ignore[union-attr]
            self._leftovers_swept = True

    # -- steps -----------------------------------------------------------------------------------

    def _write(self, df: Any, query_id: str, batch_id: int, replay: ReplayPlan | None = None,
               plan: BatchPlan | None = None, wave: int = 0, admitted: frozenset[str] | None = None) -> list[PartitionResult]:
        write_pass = self._write_pass(query_id, batch_id)
        self._write_passes = ((query_id, batch_id), write_pass + 1)
        context = WriteContext(self.job_id, query_id, batch_id, self.epoch, write_pass, self.flush_bytes, replay,
                               plan, wave)
        assert self._router is not None
        router = self._router if admitted is None else replace(self._router, admitted_tables=admitted)
        try:
            return self.runner.run(df, self.target, router, context, self.state)
        except TransactionLimitError as refused:
            held = self.state.intents(self.job_id, query_id, batch_id)  # read before the abort forgets them
            self._abort_unprepared(query_id, batch_id)
            raise TransactionLimitError(too_many_transactions(self.job_id, batch_id, held, refused, plan, wave)) from refused
        except BaseException:
            self._abort_unprepared(query_id, batch_id)
            raise

    def _first_pass(self, df: Any, query_id: str, batch_id: int, plan: BatchPlan | None,
                    admitted: frozenset[str] | None = None) -> list[PartitionResult]:
        """The batch's first write pass, written again (`REWRITES`) after a transient fault: a writer's statement
        whose answer was lost and which cannot be sent again blindly (a staging table's CREATE), a task whose
        executor was lost. The failed pass's transactions are aborted first (`_write`)."""
        return REWRITES.run(f"job {self.job_id} batch {batch_id}: the write pass",
                            lambda: self._write(df, query_id, batch_id, plan=plan, admitted=admitted),
                            lambda error: transient_cause(error) is not None, level="write")

    def _write_pass(self, query_id: str, batch_id: int) -> int:
        """How many times this driver has written the batch: the next pass's number (labels differ per pass)."""
        return self._write_passes[1] if self._write_passes[0] == (query_id, batch_id) else 0

    def _abort_unprepared(self, query_id: str, batch_id: int) -> None:
        """A failed write leaves no transaction behind, unless the state store itself is unreachable."""
        assert self._committer is not None
        try:
            record = self.state.get_batch(self.job_id, query_id, batch_id)
            if record is not None:  # a failed replay: close the gate before aborting
                self._committer.log_of(record).close_gate()
            keep = {c.label for c in record.committables} if record else set()
            self._committer.abort_intents(query_id, batch_id, keep)
        except Exception as error:
            log.error("job %s batch %s: could not abort after a failed write (%s); the next start will", self.job_id, batch_id, error)

    def _added_up(self, results: list[PartitionResult], query_id: str, batch_id: int) -> list[Committable]:
        """The pass's committables, once its rows add up: every row the writers received was prepared."""
        committables = [c for r in results for c in r.committables]
        records_in = sum(r.rows for r in results)
        # Rows the server filtered under the user's max_filter_ratio are accounted for, not lost.
        accounted = sum(c.rows + c.filtered_rows + c.unselected_rows for c in committables)
        if records_in != accounted:
            self._abort_unprepared(query_id, batch_id)
            raise BatchDoesNotAddUpError(
                f"job {self.job_id} batch {batch_id}: the writers received {records_in} rows but prepared "
                f"{accounted} (filtered included); refusing to commit a batch that does not add up"
            )
        return committables

    def _write_and_commit(self, df: Any, query_id: str, batch_id: int, planned: str | None) -> BatchReport:
        committer = self._committer
        assert committer is not None
        started = time.time()
        assert self._router is not None
        tables = 1 if self.table is not None else len(self.known_tables or self._expected_tables) or None
        seen = self._seen_tables if tables is None and self._seen_tables else None
        plan = self.planner.plan(self.runner, df, self.target, self._router, len(seen) if seen else tables)
        try:
            # Uncounted, on the guess that the batch holds only tables seen before: its writers begin transactions
            # for those only, so the pass holds no more than the budget allowed them; a row of another table stops it
            results = self._first_pass(df, query_id, batch_id, plan, admitted=seen if plan is None else None)
        except UnplannedTableError as unplanned:
            log.info("job %s batch %s: %s; counting and planning the batch", self.job_id, batch_id, unplanned)
            plan = self.planner.plan(self.runner, df, self.target, self._router, None)
            results = self._first_pass(df, query_id, batch_id, plan)
        written = time.time()
        crash_point("after-writers-prepared", batch_id)
        committables = self._added_up(results, query_id, batch_id)
        more_waves = plan is not None and len(plan.waves) > 1
        batch = BatchLog.prepare(self.state, self.job_id, self.epoch, BatchRecord(
            query_id=query_id,
            batch_id=batch_id,
            state=BatchState.PREPARED if committables or more_waves else BatchState.COMMITTED,
            epoch=self.epoch,
            committables=committables,
            checksums={r.partition: r.checksum for r in results},
            timings={"write_s": written - started},
            records_in=sum(r.rows for r in results),
            source=planned,
            plan=plan,
        ))
        recorded = time.time()
        batch.note_timing("record_s", recorded - written)
        if batch.record.state is BatchState.COMMITTED:
            committer.abort_intents(query_id, batch_id)
            return BatchReport(batch_id, "empty", timings=batch.record.timings)
        crash_point("after-prepared-record", batch_id)
        return self._report(batch_id, "written", self._commit_prepared(df, batch, started_commit=recorded))

    def _recover_prepared(self, df: Any, record: BatchRecord) -> BatchReport:
        """Batch N was prepared by an earlier driver and Spark re-runs it: roll it forward."""
        committer = self._committer
        assert committer is not None
        log.warning("job %s batch %s: found PREPARED by epoch %d; committing it", self.job_id, record.batch_id, record.epoch)
        keep = getattr(self.runner, "keep", None)
        if record.next_wave is not None:
            if keep is not None:
                keep(df)  # its unwritten waves, each a pass over the re-run batch, read it once
            self._check_routed_alike(df, record)
        committer.abort_intents(record.query_id, record.batch_id, keep={c.label for c in record.committables})
        self._abort_leftovers_once(record.query_id)
        committed = self._commit_prepared(df, committer.log_of(record), started_commit=time.time())
        committer.sweep(skip=(record.query_id, record.batch_id), retain_batches=self.retain_batches)
        return self._report(record.batch_id, "recovered-prepared", committed)

    def _check_routed_alike(self, df: Any, record: BatchRecord) -> None:
        """A re-run writes the unwritten waves of a batch, and must route its rows as the first run did: a restart that
        resolved a new topic's table or followed a changed column would move a message between a recorded wave and the
        rest, so it would be loaded twice or never (N1). Counted once over the re-run batch, before anything is sent."""
        assert self._router is not None and record.plan is not None
        differences = record.rerun_differences(self.runner.table_rows(df, self._router))
        if not differences:
            return
        shown = "; ".join(differences[:10]) + ("; ..." if len(differences) > 10 else "")
        raise RerunRoutedDifferentlyError(
            f"job {self.job_id} batch {record.batch_id} of query {record.query_id} commits in {len(record.plan.waves)} "
            f"waves, {record.waves_prepared} of them recorded, and its re-run routes rows to other tables than its first "
            f"run did ({shown}): writing the other waves from it would load some messages twice and others never. "
            "Nothing was written. Restart the job with the tables and columns of its first run (undo the table or "
            "column change, or the restart that resolved a new topic's table) until the batch is COMMITTED, then "
            "make the change again. " + RerunRoutedDifferentlyError.RUNBOOK
        )

    def _commit_prepared(self, df: Any, batch: BatchLog, started_commit: float) -> BatchRecord:
        """Commit every committable (replaying lost ones), mark COMMITTED, abort the unchosen attempts."""
        assert self._committer is not None

        def replay(lost: list[Committable]) -> bool:
            self._replay(df, batch, lost)
            return True

        committed = self._committer.roll_forward(batch, replay, started=started_commit,
                                                 on_wave=lambda wave: self._write_wave(df, batch, wave))
        assert committed is not None, "a replay that returns replayed every lost part"
        self._seen_tables |= {c.table for c in committed.committables}
        return committed

    def _write_wave(self, df: Any, batch: BatchLog, wave: int) -> None:
        """The next wave of a batch committed in waves: its own round, under the gate the record opens for it, its
        committables and checksums added to the record (the wave's commit point). Its rows must add up alone."""
        record = batch.record
        assert record.plan is not None
        query_id, batch_id = record.query_id, record.batch_id
        batch.open_wave(pass_prefix(self.epoch, self._write_pass(query_id, batch_id)))
        results = self._write(df, query_id, batch_id, plan=record.plan, wave=wave)
        batch.add_wave(wave, self._added_up(results, query_id, batch_id), {r.partition: r.checksum for r in results},
                       sum(r.rows for r in results))
        log.info("job %s batch %s: wave %d of %d prepared (%d transactions)", self.job_id, batch_id, wave + 1,
                 len(record.plan.waves), sum(len(r.committables) for r in results))
        crash_point("after-wave-prepared", batch_id)

    def _replay(self, df: Any, batch: BatchLog, lost: list[Committable]) -> None:
        """Load the lost parts again from the re-run batch, under fresh labels, proved identical by checksum: one
        pass per wave they belong to, which rewrites that wave's tables as its first pass did."""
        committer = self._committer
        assert committer is not None
        record = batch.record
        for wave in sorted({partition_wave(c.partition) for c in lost}):
            in_wave = [c for c in lost if partition_wave(c.partition) == wave]
            plan = ReplayPlan.of(batch.record, in_wave, self.job_id, wave)
            batch.open_replay(pass_prefix(self.epoch, self._write_pass(record.query_id, record.batch_id)))
            results = self._write(df, record.query_id, record.batch_id, replay=plan, plan=record.plan, wave=wave)
            try:
                plan.check(results, self.job_id, record.batch_id)
            except ReplayMismatchError:
                self._abort_unprepared(record.query_id, record.batch_id)
                raise
            event = batch.close_replay(in_wave, [c for r in results for c in r.committables])
            log.warning("job %s batch %s: %s", self.job_id, record.batch_id, event)
        still_lost = committer.commit_pending(batch)
        if still_lost:
            raise ReplayLostAgainError(
                f"job {self.job_id} batch {record.batch_id}: replayed transactions were lost again "
                f"({[c.label for c in still_lost]}); the target is discarding prepared data faster than it can be committed"
            )

    def _report(self, batch_id: int, action: str, record: BatchRecord) -> BatchReport:
        live = record.live_committables()
        by_table: dict[str, int] = {}
        for c in live:
            by_table[c.table] = by_table.get(c.table, 0) + c.rows
        return BatchReport(
            batch_id,
            action,
            records_in=record.records_in,
            rows=sum(by_table.values()),
            rows_by_table=by_table,
            dead_letters=by_table.get(self.dead_letter_table, 0) if self.dead_letter_table else 0,
            bytes=sum(c.bytes for c in live),
            transactions=len(live),
            waves=len(record.plan.waves) if record.plan is not None else 1,
            replayed=len(record.lost),
            timings={name: seconds for name, seconds in record.timings.items() if name != COMMITTED_AT},
        )


def _brief(offset_log_text: str | None, limit: int = 300) -> str:
    """A source range for a message: the sources' end offsets, cut short."""
    if offset_log_text is None:
        return "none"
    text = json.dumps(source_ranges(offset_log_text), sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def _checkpoint_root(spark: Any, query_id: str) -> str | None:
    """The running query's resolved checkpoint folder, read from Spark (None where this Spark does not say).

    The batch's own session is a clone that does not list the query; the session that started it does
    (usually the default one)."""
    try:
        jvm = spark.sparkContext._jvm
        sessions = [spark._jsparkSession]
        for found in (jvm.org.apache.spark.sql.SparkSession.getDefaultSession(),
                      jvm.org.apache.spark.sql.SparkSession.getActiveSession()):
            if found.isDefined():
                sessions.append(found.get())
        for session in sessions:
            query = session.streams().get(query_id)
            if query is not None:
                return str(query.streamingQuery().resolvedCheckpointRoot())
        raise LookupError(f"no session lists query {query_id}")
    except Exception as error:  # Spark Connect, or a Spark that names it otherwise: no marker, as before
        log.warning("could not read the streaming query's checkpoint folder from Spark (%s); give "
                    "checkpoint_location= so the sink keeps its marker there", error)
        return None


def _spark_runner() -> WriterRunner:
    from .execution import SparkWriterRunner  # imports PySpark only when a Spark job uses the sink

    return SparkWriterRunner()
