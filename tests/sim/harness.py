"""A deterministic simulation of the sink's protocol: the real coordinator, writers and recovery,
an in-memory target and state store, and a seeded scheduler that interleaves everything that can
run at once in production.

Actors (driver, zombie driver, zombie and speculative tasks, operator) each run in their own
thread, but only the one holding the baton runs: every call into the target server or the state
store is a yield point where the scheduler, from `random.Random(seed)`, picks who goes on, and
where a planned fault fires (a kill before or after the call is applied, or a lost answer).
A kill is `SimulatedCrash`; the killed process's later calls fail at once (nothing it does after
a kill -9 can reach anything), so cleanup code that catches BaseException cannot cheat.

`run_schedule(seed)` returns an `Outcome`: its `violations` are broken invariants (empty = pass).
Replay one seed with `python -m tests.sim <seed>` (trace printed).
"""
from __future__ import annotations

import os
import random
import re
import tempfile
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streaming_sink import cli
from streaming_sink import committer as committer_module
from streaming_sink.actions import apply_recovery, plan_recovery
from streaming_sink.checkpoint_marker import CheckpointMarker
from streaming_sink.committer import Committer
from streaming_sink.errors import OperatorActionRefused, ReplayAmbiguousError, ReplayImpossibleError, ReplayMismatchError, StopForOperator
from streaming_sink.execution import _replay_identity
from streaming_sink.labels import attempt_epoch
from streaming_sink.records import BatchState
from streaming_sink.replay import writer_partition
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import BatchRecord, FencedError, StateStoreLostError
from streaming_sink.state.memory import MemoryStateStore
from streaming_sink.targets.base import CommitOutcome, CommittedNotChosenError, TargetError
from streaming_sink.writer import ContentChecksum, PartitionResult, PartitionWriter, WriteContext
from tests.support.batches import table_rows

try:  # the checks of a re-planned batch (I10); a release before them runs the simulation without its remedy
    from streaming_sink.errors import SourceReplannedError
except ImportError:  # pragma: no cover - only on an older checkout (tests/sim run against it to show a fix)
    class SourceReplannedError(StopForOperator):  # type: ignore[no-redef]
        """Never raised by a release that does not know it."""

from .fake_target import OPEN, FakeOlapServer, FakeTarget, SimClock, SimulatedTimeout, Txn, TxnState
from .spark_model import SparkCheckpoint

JOB = "simjob"
QUERY = "00000000-0000-4000-8000-00000000001a"
TABLES = ["t0", "t1", "t2"]
TXN_TIMEOUT = 600.0
LABEL_KEEP = 3 * 86400.0
MAX_RESTARTS = 40


class SimulatedCrash(BaseException):
    """kill -9 of one simulated process (driver, executor task, operator)."""


class ScheduleAbandoned(BaseException):
    """The scheduler tore the schedule down (step limit); unblocks and ends every actor thread."""


# -- processes, actors and the scheduler ----------------------------------------------------------

class _Signal:
    """A binary semaphore on a bare lock (threading.Semaphore is several times slower per hand-off)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def acquire(self) -> None:
        self._lock.acquire()


@dataclass
class Process:
    """One OS process of the simulated deployment; dies once, never comes back."""

    name: str
    kind: str  # driver | task | operator
    epoch: int | None = None
    dead: bool = False
    observed_fenced: bool = False  # it saw (through the store) that a newer epoch exists


class Actor:
    def __init__(self, name: str, weight: float) -> None:
        self.name, self.weight = name, weight
        self.go = _Signal()
        self.process: Process | None = None
        self.finished = False
        self.ready: Callable[[], bool] | None = None  # while waiting: whether it may run yet
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Scheduler:
    """One baton, handed from actor to actor at every call (directly: no scheduler thread in between).

    Whoever holds the baton picks the next holder from the seeded generator, runs the events planned
    for that step, and, if the pick is someone else, wakes it and sleeps until picked again.
    """

    def __init__(self, rng: random.Random, max_steps: int) -> None:
        self.rng, self.max_steps = rng, max_steps
        self.all_done = _Signal()
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self.steps = 0
        self.abandoned = False
        self.events: dict[int, list[Callable[[], None]]] = {}  # step -> things that happen then

    def spawn(self, name: str, body: Callable[[Actor], None], weight: float = 1.0) -> Actor:
        actor = Actor(name, weight)

        def main() -> None:
            actor.go.acquire()
            try:
                if self.abandoned:
                    raise ScheduleAbandoned()
                body(actor)
            except BaseException as error:  # the actor's end, whatever it was, is reported
                actor.error = error
            finally:
                actor.finished = True
                self._hand_over()

        actor.thread = threading.Thread(target=main, name=f"sim-{name}", daemon=True)
        self.actors.append(actor)
        actor.thread.start()
        return actor

    def _choose(self) -> Actor | None:
        if self.steps >= self.max_steps:
            self.abandoned = True
        if not self.abandoned:
            for event in self.events.pop(self.steps, []):
                event()
        self.steps += 1
        runnable = [a for a in self.actors if not a.finished]
        if not runnable:
            return None
        ready = [a for a in runnable if a.ready is None or a.ready()] or runnable
        if len(ready) == 1:
            return ready[0]
        return self.rng.choices(ready, weights=[a.weight for a in ready])[0]

    def wait_until(self, condition: Callable[[], bool]) -> None:
        """The running actor waits (lets others run) until `condition` holds."""
        actor = self.current
        assert actor is not None
        actor.ready = condition
        try:
            while not condition():
                self.pause()
        finally:
            actor.ready = None

    def _hand_over(self) -> None:
        nxt = self._choose()
        if nxt is None:
            self.current = None
            self.all_done.release()
            return
        self.current = nxt
        nxt.go.release()

    def pause(self) -> None:
        """Called by the running actor (any of its threads) at every call: maybe someone else goes first."""
        actor = self.current
        assert actor is not None
        nxt = self._choose()
        if nxt is not actor:
            assert nxt is not None
            self.current = nxt
            nxt.go.release()
            actor.go.acquire()
        if self.abandoned:
            raise ScheduleAbandoned()

    def run(self) -> None:
        """Run every actor spawned so far (and those they spawn) to its end."""
        self._hand_over()
        self.all_done.acquire()
        if self.abandoned:
            raise RuntimeError(f"schedule did not finish in {self.max_steps} steps")

    def abandon(self) -> None:
        self.abandoned = True


# -- faults ---------------------------------------------------------------------------------------

FAULT_KINDS = ("crash-before", "crash-after", "timeout-before", "timeout-after")


@dataclass
class Faults:
    """Planned faults by call number (of all calls into the server and the store). Aimed at some calls only
    (`aimed_at`, e.g. "store.current_epoch"), a fault planned for another call waits for the next one aimed at."""

    plan: dict[int, str] = field(default_factory=dict)
    enabled: bool = True
    calls: int = 0
    aimed_at: tuple[str, ...] = ()
    due: list[str] = field(default_factory=list)

    def next(self, call: str) -> str | None:
        self.calls += 1
        if not self.enabled:
            return None
        if self.calls in self.plan:
            self.due.append(self.plan[self.calls])
        if self.due and (not self.aimed_at or call in self.aimed_at):
            return self.due.pop(0)
        return None


# -- the simulation -------------------------------------------------------------------------------

#: How an operator command may end besides success: a refusal, a stop it reports, a target that kept timing out.
_OPERATOR_ANSWERS = (OperatorActionRefused, StopForOperator, TargetError)

LOUD = (ReplayAmbiguousError, ReplayImpossibleError, ReplayMismatchError, StateStoreLostError, CommittedNotChosenError,
        SourceReplannedError)


@dataclass
class Config:
    """What a schedule may contain; every choice inside is drawn from the seed."""

    batches: int = 4
    per_flush: bool | None = None  # None: drawn
    # Whether the server lists its open transactions by label prefix (ClickHouse staging tables can be
    # listed; StarRocks and Doris cannot over HTTP), so a restart can abort what nothing names.
    lists_leftovers: bool | None = None  # None: drawn
    faults: int | None = None  # planned faults; None: drawn 0..4
    zombie_driver: bool = True
    zombie_tasks: bool = True
    # Of the task attempts (with `zombie_tasks`): the share run on an executor of their own pace, which the driver
    # may declare lost while they go on, and the share that get a speculative twin: the attempts that act late.
    slow_tasks: float = 0.08
    speculative_tasks: float = 0.06
    operator: bool = True
    downtime: bool = True  # restarts after the prepared timeout or the label retention
    downtime_share: float = 0.15  # of the restarts
    store_wipe: bool = True  # the state store loses everything (epoch counter included)
    # The state store goes back to an earlier snapshot (lagging replica, backup), in this share of the schedules.
    store_rollback: bool = True
    rollback_share: float = 0.05
    # Operator commands racing the driver (abort --apply, recover --apply, settle, dry runs) besides the one
    # `operator` plans; None: drawn (none in most schedules, up to 3).
    operators: int | None = None
    operator_actions: tuple[str, ...] = ("abort", "recover", "settle", "abort-dry", "recover-dry")
    # The target's commit parallelism: above 1 the sink's commit pool runs (as simulated threads); None: drawn.
    commit_parallelism: int | None = None
    # Between a crash and the restart, the checkpoint folder suffers: its last offset file deleted, the folder
    # restored from a snapshot (Spark then plans a batch again, maybe with another range), or the sink's marker
    # lost (never with a store loss: the two together are beyond what the job can detect). None: drawn.
    checkpoint_faults: bool | None = None
    renumber: bool = True  # a re-run may number the batch's partitions differently
    # The server's label memory by count, running transactions included (StarRocks label_keep_max_num); None: drawn.
    label_memory: int | None = None
    fault_kinds: tuple[str, ...] = FAULT_KINDS  # the kinds the planned faults are drawn from
    faults_aimed_at: tuple[str, ...] = ()  # the calls planned faults land on ("store.current_epoch", …); (): any
    # The server's running-transaction limit, which the sink takes whole as its budget per wave: a batch over it
    # commits in waves (`waves.py`). 0: no limit; None: drawn (none in half the schedules, else 1 to 3).
    txn_budget: int | None = None
    # At a driver restart the job's frame may route one message of the batch it re-runs to another table (a table
    # resolved for a new topic, a column changed on a target table: review N1), and an operator undoes it when the
    # job stops on it (runbook section 'Batch in waves re-run with other tables').
    reroute: bool = False


#: Review N8's family: faults only at the store's epoch reads, so a commit phase stops at a unit's epoch check before
#: the unit sends anything, and every restart comes after downtime (a third of them after the labels expired and were
#: forgotten).
NEVER_SENT = Config(commit_parallelism=1, downtime_share=1.0, faults=3, fault_kinds=("timeout-before",),
                    faults_aimed_at=("store.current_epoch",))


@dataclass
class Outcome:
    seed: int
    config: Config
    violations: list[str]
    stopped: str | None  # the documented loud error the job stopped with, if any
    trace: list[str]
    steps: int
    calls: int
    proved: list[str] = field(default_factory=list)  # labels a first-send LOST proved never committed (F4)
    remedies: int = 0  # runbook remedies applied after necessary stops (restore-offsets)

    def describe(self) -> str:
        head = f"seed {self.seed}: {len(self.violations)} violation(s); stopped={self.stopped}; steps={self.steps}"
        changed = {k: v for k, v in vars(self.config).items() if getattr(Config(), k) != v}
        replay = f"python -m tests.sim {self.seed}" + "".join(f" {k}={v}" for k, v in changed.items())
        return "\n".join([head, *self.violations, "replay: " + replay, "trace (last 60):", *self.trace[-60:]])


class Simulation:
    def __init__(self, seed: int, config: Config, checkpoint: str) -> None:
        self.seed, self.config = seed, config
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = SimClock()
        keep_count = rng.choice([None, None, 4, 12]) if config.downtime else None
        # drawn apart from the schedule's own stream (below), so a seed's schedule does not depend on it
        counts_running = random.Random(f"keep-running-{seed}").random() < 0.5
        if config.label_memory is not None:
            keep_count, counts_running = config.label_memory, True
        self.server = FakeOlapServer(TABLES, self.clock, TXN_TIMEOUT, LABEL_KEEP, keep_count, counts_running)
        per_flush = rng.random() < 0.5 if config.per_flush is None else config.per_flush
        # drawn apart from the schedule's own stream, so a seed's schedule does not depend on it
        lists = random.Random(f"lists-{seed}").random() < 0.5 if config.lists_leftovers is None else config.lists_leftovers
        parallelism = (random.Random(f"parallel-{seed}").choice([1, 1, 2, 4]) if config.commit_parallelism is None
                       else config.commit_parallelism)
        budget = (random.Random(f"budget-{seed}").choice([0, 0, 0, 1, 2, 3]) if config.txn_budget is None
                  else config.txn_budget)
        self.target = FakeTarget(_ServerProxy(self), per_flush, lists, parallelism, running_limit=budget or None)
        self.raw_store = MemoryStateStore()
        self.store = _StoreProxy(self)
        self.checkpoint = checkpoint
        self.sched = Scheduler(rng, max_steps=20000)
        nfaults = rng.randint(0, 4) if config.faults is None else config.faults
        self.faults = Faults({rng.randint(1, 400): rng.choice(config.fault_kinds) for _ in range(nfaults)},
                             aimed_at=config.faults_aimed_at)
        self.flush_bytes = rng.choice([1, 64, 1 << 20])  # 1: one flush per Arrow batch
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.ever_prepared: set[str] = set()  # labels in a PREPARED record that was durably written (I1)
        self.label_epoch: dict[str, int] = {}  # label -> epoch of the attempt that recorded its intent
        self.stopped: BaseException | None = None
        self.task_attempts = 0
        self.store_lost = False
        self.clean = False
        self.downtime_taken = False
        self.processes = 0
        self.all_processes: dict[str, Process] = {}
        self.source, self.data = self._make_source()
        next_id = 1 + max((i for p in self.data for part in p for b in part for i in b.column("id").to_pylist()), default=0)
        self.spark = SparkCheckpoint(checkpoint, seed, QUERY, self.data, TABLES, next_id)
        self.ckpt_draw = random.Random(f"checkpoint-{seed}")  # apart from the schedule's stream: older seeds keep theirs
        self.checkpoint_faults = (self.ckpt_draw.random() < 0.15 if config.checkpoint_faults is None
                                  else config.checkpoint_faults)
        self.checkpoint_damaged = False
        self.runs: dict[int, int] = {}  # batch -> how many times a driver was called with it
        self.server_calls: dict[int, int] = {}  # actor -> server calls made
        self.stop_batch: int | None = None
        self.stop_record: BatchRecord | None = None  # the stopped batch's record at the moment of the stop
        self.store_may_be_lost = False  # a wipe or rollback is planned: the checkpoint keeps its marker then
        self.checked_actors = 0  # actors whose ends were judged already
        self.remedies = 0  # runbook remedies an operator applied after a necessary stop
        self.server.who = self._who
        self.server.on_visible = self._on_visible
        self.server.on_abort_call = self._on_abort_call
        self.server.on_label_reuse = self._on_label_reuse
        self.server.on_commit_call = self._on_commit_call
        self.server.epoch_of = lambda: self._process().epoch
        self.target.on_answer = self._on_answer
        # I5 for commits and aborts: which process holds the newest epoch, and whether it has acted since
        self.holder: tuple[int, str] | None = None
        self.holder_acted = False
        # (actor, process) -> what its last epoch check vouches for: None, the next commit or abort; a label, that one's
        # (a check covers one commit or abort, and the client's own retries of it: the inherent check-then-act window)
        self.vouched: dict[tuple[int, str], str | None] = {}
        # Whether a stop was necessary (F4): answers that proved a label never committed, and who could have kept them
        # label -> the process whose durable `sent` listed it last: first, or again after a failed phase recorded it
        # as not sent (N8); and the labels the journal lists as not sent
        self.sent_by: dict[str, str] = {}
        self.not_sent: set[str] = set()
        self.answered: set[tuple[str, str]] = set()  # (process, label) that got any commit answer
        self.proofs: dict[str, list[tuple[str, int]]] = {}  # label -> (process, call number) of a first-send LOST
        # process -> the call count when its last successful store write was issued (before the write's yield: what
        # it holds was decided then, so a proof that arrives while it waits is not in it)
        self.last_write: dict[str, int] = {}
        # N8: labels some process sent a commit of (whether it reached the server or not: a timeout leaves it open;
        # not one a server that had forgotten the label answered), and each process's last server call (counted when
        # attempted)
        self.commit_sent: set[str] = set()
        self.last_server_call: dict[str, int] = {}
        self.last_store_attempt: dict[str, int] = {}  # process -> the call number of its last epoch-checked write tried
        self.faulted_at: dict[str, list[int]] = {}  # process -> the call numbers of the faults it met
        self.failed_unfenced: dict[str, bool] = {}  # process -> whether it ended on an error while holding the epoch
        # N1: the table each rerouted message goes to now, and the routes each batch was recorded with
        self.routes: dict[int, str] = {}
        self.first_routes: dict[int, dict[int, str]] = {}
        self.reroute_draw = random.Random(f"reroute-{seed}")  # apart from the schedule's stream
        self.restores: list[int] = []  # the call count at each store wipe or rollback: what was written before may be gone

    # -- source ----------------------------------------------------------------------------------

    def _make_source(self) -> tuple[dict[str, list[int]], list[list[list[pa.RecordBatch]]]]:
        rng = self.rng
        source: dict[str, list[int]] = {t: [] for t in TABLES}
        data = []
        next_id = 0
        tables = TABLES[: rng.choice([2, 3])]
        for _ in range(self.config.batches):
            partitions = []
            for _ in range(rng.choice([1, 2, 3])):
                batches = []
                for _ in range(rng.choice([0, 1, 2])):
                    n = rng.randint(1, 4)
                    ids = list(range(next_id, next_id + n))
                    next_id += n
                    routed = [rng.choice(tables) for _ in ids]
                    for i, t in zip(ids, routed):
                        source[t].append(i)
                    batches.append(pa.RecordBatch.from_pydict({"__table": routed, "id": ids}))
                partitions.append(batches)
            data.append(partitions)
        return source, data

    # -- hooks -----------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        self.trace.append(f"[{self.sched.steps}] {text}")

    @property
    def committed_batches(self) -> int:
        """Spark's commit log: how many batches returned (the newest commit's id + 1)."""
        return self.spark.committed()

    def _process(self) -> Process:
        actor = self.sched.current
        assert actor is not None and actor.process is not None, "a call from outside any simulated process"
        return actor.process

    def _who(self) -> str:
        return self._process().name

    def violation(self, text: str) -> None:
        self.violations.append(f"step {self.sched.steps}: {text}")
        self.log("VIOLATION " + text)

    def _on_visible(self, txn: Txn) -> None:
        if txn.label not in self.ever_prepared:
            self.violation(f"I1: {txn.label} became visible with no durable PREPARED record naming it")
        seen = {i for i, label in self.server.visible[txn.table] if label != txn.label}
        dupes = sorted(seen & set(txn.ids)) or sorted({i for i in txn.ids if txn.ids.count(i) > 1})
        if dupes:
            self.violation(f"duplicate rows {dupes} in {txn.table} (commit of {txn.label} by {txn.why})")

    def _on_label_reuse(self, earlier: Txn) -> None:
        """Every writer attempt has labels of its own: a second begin of a label means two attempts share it."""
        self.violation(f"I4: {self._who()} begins {earlier.label}, already begun by {earlier.owner} ({earlier.state.value})")

    def _on_abort_call(self, label: str, txn: Txn | None) -> None:
        process = self._process()
        self._check_fenced_act("abort", label)
        if txn is None or txn.state not in OPEN:
            return
        if txn.state is TxnState.PREPARED and label in self.ever_prepared and not self.store_lost:
            # (a lost store may forget a PREPARED record before any commit was sent: writing the batch again is safe)
            self.violation(f"I2: {process.name} aborted {label}, which a durable PREPARED record names")
        if process.epoch is None:
            return
        owner_epoch = self.label_epoch.get(label)
        if owner_epoch is not None and owner_epoch > process.epoch:
            self.violation(f"I5: {process.name} (epoch {process.epoch}) aborted {label} of newer epoch {owner_epoch}")

    def _on_commit_call(self, label: str, txn: Txn | None) -> None:
        self._check_fenced_act("commit", label)

    def _check_fenced_act(self, what: str, label: str) -> None:
        """I5 for the driver's and the operator's commits and aborts: once a newer epoch was taken and its holder
        acted, a process of an older epoch may finish only the one commit or abort its last epoch check vouched for
        (check-then-act cannot close that window without a fencing token on the server); any further one is a breach."""
        actor = self.sched.current
        assert actor is not None and actor.process is not None
        process = actor.process
        key = (id(actor), process.name)
        vouched = key in self.vouched and self.vouched[key] in (None, label)
        self.vouched[key] = label
        if process.kind == "task" or process.epoch is None or self.holder is None or not self.holder_acted:
            return
        current = self.raw_store.current_epoch(JOB)
        if current == process.epoch or self.holder[0] != current:
            return
        if not vouched:
            self.violation(f"I5: {process.name} (epoch {process.epoch}) sent a {what} of {label} after epoch {current} "
                           f"was taken by {self.holder[1]} and acted, with no epoch check since its last commit or abort")

    def _on_answer(self, label: str, outcome: CommitOutcome) -> None:
        """A LOST answer to the process whose `sent` listed the label last, at its first answer: the commit of a label
        the server does not know commits nothing, so this proves it never committed (F4), if the process keeps it."""
        process = self._process()
        first = (process.name, label) not in self.answered
        self.answered.add((process.name, label))
        if outcome is CommitOutcome.LOST and first and self.sent_by.get(label) == process.name:
            self.proofs.setdefault(label, []).append((process.name, self.faults.calls))

    def call(self, where: str, name: str, apply: Callable[[], Any]) -> Any:
        """Every call into the server or the store: a yield point and a place for a fault."""
        process = self._process()
        if process.dead:
            raise SimulatedCrash(f"{process.name} is dead")
        self.sched.pause()
        self.clock.advance(0.01)
        if where == "server":
            actor = self.sched.current
            self.server_calls[id(actor)] = self.server_calls.get(id(actor), 0) + 1
            self.last_server_call[process.name] = self.faults.calls
        at = self.faults.calls
        fault = self.faults.next(f"{where}.{name}")
        if fault:
            self.log(f"FAULT {fault} at {where}.{name} in {process.name}")
            self.faulted_at.setdefault(process.name, []).append(at)
        if fault == "crash-before":
            process.dead = True
            raise SimulatedCrash(f"{process.name} killed before {where}.{name}")
        if fault == "timeout-before":
            raise SimulatedTimeout(f"{where}.{name}: no answer (not applied)")
        result = apply()
        holder = self.holder
        if holder is not None and process.epoch == holder[0] and name != "take_epoch":
            self.holder_acted = True
        if fault == "crash-after":
            process.dead = True
            raise SimulatedCrash(f"{process.name} killed after {where}.{name} was applied")
        if fault == "timeout-after":
            raise SimulatedTimeout(f"{where}.{name}: no answer (applied)")
        return result

    def new_process(self, actor: Actor, kind: str, name: str, epoch: int | None = None) -> Process:
        actor.process = self.register(Process(name, kind, epoch))
        return actor.process

    def register(self, process: Process) -> Process:
        self.processes += 1
        process.name = f"{process.name}#{self.processes}"
        self.all_processes[process.name] = process
        return process

    # -- actors ----------------------------------------------------------------------------------

    def make_sink(self) -> ExactlyOnceSink:
        return ExactlyOnceSink(
            self.target, self.store, JOB, table_column="__table", flush_bytes=self.flush_bytes,
            runner=SimRunner(self), checkpoint_location=self.checkpoint, heartbeat_seconds=None,
            transaction_share=1.0, spread="never",  # the simulated tasks keep rows in their partition
        )

    def driver(self, actor: Actor, role: dict) -> None:
        """Spark's driver: run batch `committed` until foreachBatch returns, restart after any failure."""
        sink: ExactlyOnceSink | None = None
        restarts = 0
        while True:
            batch = role["next"] if role["zombie"] else self.spark.next_batch()
            if batch >= self.config.batches or (role["zombie"] and sink is None):
                return
            if not role["zombie"] and not self.spark.plan(batch, int(self.clock.now * 1000), self.config.batches):
                self.violation(f"harness: Spark cannot plan batch {batch}: offsets/{batch - 1} is gone")
                return
            data = self._batch_frame(batch)
            if data is None:  # a zombie's Spark finds no offset file for its next batch: it fails, and is gone
                return
            if sink is None:
                self.new_process(actor, "driver", actor.name)
                sink = self.make_sink()
            calls = self.server_calls.get(id(actor), 0)
            try:
                sink.process(data, batch, QUERY)
                self.log(f"{actor.process.name}: batch {batch} returned ({sink.last_report.action})")
                if role["zombie"]:
                    role["next"] = batch + 1
                else:
                    self.spark.commit(batch)
                continue
            except SimulatedCrash as error:
                self.log(f"{actor.process.name}: crashed in batch {batch} ({error})")
            except LOUD as error:
                if isinstance(error, SourceReplannedError) and self.server_calls.get(id(actor), 0) != calls:
                    self.violation(f"I10: {actor.process.name} stopped with SourceReplannedError after calling the server")
                if role["zombie"]:
                    self.log(f"zombie {actor.process.name} stopped loudly: {type(error).__name__}")
                    return
                self.stopped, self.stop_batch = error, batch
                # judged on the journal as the driver read it: a later wipe or rollback must not change the verdict
                self.stop_record = self.raw_store.get_batch(JOB, QUERY, batch)
                self.log(f"{actor.process.name}: STOPPED LOUDLY {type(error).__name__}: {error}")
                return
            except Exception as error:
                self.log(f"{actor.process.name}: batch {batch} failed: {type(error).__name__}: {error}")
                # a failure it caught, not a kill: it could still write to the store, if not fenced (N8's judge)
                self.failed_unfenced[actor.process.name] = self.holder is not None and self.holder[0] == actor.process.epoch
            actor.process.dead = True
            sink = None
            if role["zombie"]:
                return
            restarts += 1
            if restarts > MAX_RESTARTS:
                self.violation(f"no progress: {restarts} restarts at batch {batch}")
                return
            self._maybe_downtime()
            self._maybe_damage_checkpoint()
            self._maybe_reroute(batch)

    def _batch_frame(self, batch: int) -> Any:
        """The batch as Spark hands it over now: from the offset files, partitions maybe renumbered on a re-run."""
        runs = self.runs.get(batch, 0)
        self.runs[batch] = runs + 1
        renumber = None
        if self.config.renumber and runs and not self.clean:
            draw = random.Random(f"renumber-{self.seed}-{batch}-{runs}")
            renumber = draw if draw.random() < 0.5 else None
        frame = self.spark.frame(batch, renumber)
        if self.raw_store.get_batch(JOB, QUERY, batch) is None:  # the run that records the batch plans it by these
            self.first_routes[batch] = dict(self.routes)
        if frame is None or not self.routes:
            return frame
        return [[_rerouted(b, self.routes) for b in batches] for batches in frame]

    def _maybe_reroute(self, batch: int) -> None:
        """At a restart: the job's frame routes one message of the batch it re-runs to another table (N1)."""
        if not self.config.reroute or self.reroute_draw.random() < 0.5:
            return
        frame = self.spark.frame(batch)
        rows = [(i, t) for batches in frame or [] for b in batches
                for i, t in zip(b.column("id").to_pylist(), b.column("__table").to_pylist())]
        if not rows:
            return
        message, table = self.reroute_draw.choice(rows)
        now = self.reroute_draw.choice([t for t in TABLES if t != self.routes.get(message, table)])
        self.routes[message] = now
        self.log(f"FRAME message {message} now goes to {now} (it went to {table}): a table or column changed at the restart")

    def _maybe_damage_checkpoint(self) -> None:
        """Between a crash and the restart: what an operator or a disk does to the checkpoint folder."""
        draw = self.ckpt_draw
        if not self.checkpoint_faults or draw.random() > 0.4:
            return
        kinds = ["drop-last-offsets", "restore-snapshot"]
        if not self.store_may_be_lost:
            kinds += ["lose-marker"]
        kind = draw.choice(kinds)
        if kind == "drop-last-offsets":
            dropped = self.spark.drop_last_offsets()
            self.log(f"CHECKPOINT offsets/{dropped} and commits/{dropped} deleted (a corrupt last offset file)")
        elif kind == "restore-snapshot" and not self.store_may_be_lost:
            index = self.spark.restore_snapshot(draw)
            self.log(f"CHECKPOINT restored from snapshot #{index} (taken at a commit)")
        elif kind == "restore-snapshot":  # the marker must not go back while the store may lose state: logs only
            self.log(f"CHECKPOINT offsets/{self.spark.drop_last_offsets()} deleted (instead of a snapshot restore)")
        else:
            self.spark.lose_marker()
            self.log("CHECKPOINT the sink's marker is lost")
        self.checkpoint_damaged = True

    def _maybe_downtime(self) -> None:
        if not self.config.downtime or self.rng.random() > self.config.downtime_share:
            return
        # past the prepared timeout; past the label retention; past both (prepared labels expired and forgotten)
        seconds = self.rng.choice([TXN_TIMEOUT + 1, LABEL_KEEP + 1, TXN_TIMEOUT + LABEL_KEEP + 1])
        self.downtime_taken = True
        self.clock.advance(seconds)
        self.log(f"downtime {seconds:.0f}s before the restart")

    def operator(self, actor: Actor, action: str | None = None) -> None:
        """One operator command, through the CLI's own functions, while the job may still be running."""
        self.new_process(actor, "operator", "operator")
        if action is None:  # the schedule's first operator: as drawn before there were more
            action = "recover-direct" if self.rng.random() < 0.5 else "abort"
        if action == "recover-direct":
            epoch = self.store.take_epoch(JOB, owner="operator recover")
            recovery = Committer(self.target, self.store, JOB, epoch)
            done = apply_recovery(recovery, plan_recovery(self.store, JOB, checkpoint_query=QUERY), lambda message: None,
                                  CheckpointMarker(self.checkpoint, JOB), QUERY)
            self.log(f"operator recover --apply: {[(a.batch_id, a.action) for a in done]}")
            return
        if action == "settle":
            self._settle_racing()
            return
        command, apply = action.split("-")[0], not action.endswith("-dry")
        args = _Args(command=command, apply=apply, batch=self.committed_batches,
                     checkpoint=self.checkpoint if command == "recover" else None)
        try:
            code = (cli.cmd_abort if command == "abort" else cli.cmd_recover)(args)
        except cli.CliError as error:  # a usage answer (no such batch yet): what an operator reads and retries
            code, args.said = error.code, str(error)
        self.log(f"operator {command} --batch {args.batch}{' --apply' if apply else ''}: exit {code}: {args.said[:200]}")

    def _settle_racing(self) -> None:
        """`settle` while the job runs, with the verdict an operator reads on the target: only for a label whose fate
        can no longer change (visible, aborted or forgotten uncommitted), so the verdict stays true after it is given."""
        for query_id, batch_id in self.raw_store.batch_keys(JOB):
            record = self.raw_store.get_batch(JOB, query_id, batch_id)
            if record is None or record.state is not BatchState.PREPARED:
                continue
            for committable in record.live_committables():
                fate = self._fate(committable.label)
                if fate is None:
                    continue
                args = _Args(command="settle", batch=batch_id, query_id=query_id, label=committable.label,
                             committed=fate)
                try:
                    code = cli.cmd_settle(args)
                except cli.CliError as error:  # the store was wiped under the command: it refuses, as it should
                    code, args.said = error.code, str(error)
                self.log(f"operator settle {committable.label} {'--committed' if fate else '--not-committed'}: exit {code}")
                return
        self.log("operator settle: nothing to settle")

    def _fate(self, label: str) -> bool | None:
        """What the target says of a label for good: True visible, False never will be, None still open."""
        txn = self.server.txns.get(label) or self.server.forgotten.get(label)
        if txn is None:
            return None
        if txn.state is TxnState.VISIBLE:
            return True
        return False if txn.state is TxnState.ABORTED else None

    # -- the schedule ----------------------------------------------------------------------------

    def plan_events(self) -> None:
        rng, config = self.rng, self.config
        if config.zombie_driver and rng.random() < 0.3:
            self.sched.events.setdefault(rng.randint(5, 300), []).append(self._fork_zombie_driver)
        if config.operator and rng.random() < 0.2:
            self.sched.events.setdefault(rng.randint(5, 300), []).append(
                lambda: self.sched.spawn("operator", self.operator))
        self._plan_operators()
        if config.store_wipe and rng.random() < 0.05:
            self.store_may_be_lost = True
            self.sched.events.setdefault(rng.randint(5, 300), []).append(lambda: self._lose_store(None))
        if config.store_rollback and rng.random() < config.rollback_share:
            self.store_may_be_lost = True
            snapshot_at, loss_at = sorted(rng.sample(range(5, 300), 2))
            snapshot: dict = {}
            self.sched.events.setdefault(snapshot_at, []).append(lambda: snapshot.update(self.raw_store.snapshot()))
            self.sched.events.setdefault(loss_at, []).append(lambda: self._lose_store(snapshot))
        if config.downtime and rng.random() < 0.1:  # a long pause of whoever runs (GC, VM freeze)
            self.sched.events.setdefault(rng.randint(5, 300), []).append(self._pause_everything)

    def _plan_operators(self) -> None:
        """More operator commands, racing the driver; drawn apart from the schedule's own stream (older seeds keep theirs)."""
        config = self.config
        if not config.operator:
            return
        draw = random.Random(f"operators-{self.seed}")
        count = config.operators if config.operators is not None else (0 if draw.random() < 0.6 else draw.randint(1, 3))
        for _ in range(count):
            action = draw.choice(config.operator_actions)
            weight = draw.choice([1.0, 3.0])
            self.sched.events.setdefault(draw.randint(5, 300), []).append(
                lambda action=action, weight=weight: self.sched.spawn(
                    "operator", lambda actor: self.operator(actor, action), weight=weight))

    def _fork_zombie_driver(self) -> None:
        """The cluster manager thinks the driver died and starts another; the old one keeps going."""
        old = self.main_role
        if old["zombie"]:
            return
        old["zombie"], old["next"] = True, self.committed_batches
        self.log("the driver becomes a zombie; a new driver starts")
        self.main_role = {"zombie": False, "next": 0}
        role = self.main_role
        self.sched.spawn("driver", lambda actor, role=role: self.driver(actor, role), weight=3.0)

    def _lose_store(self, snapshot: dict | None) -> None:
        self.store_lost = True
        self.restores.append(self.faults.calls)
        self.holder = None  # whoever held the newest epoch, the store no longer says so
        if snapshot is not None:
            self.raw_store.restore(snapshot)
            self.log("STORE rolled back to an earlier snapshot")
        else:
            self.raw_store.wipe()
            self.log("STORE wiped")

    def _pause_everything(self) -> None:
        self.downtime_taken = True
        self.clock.advance(TXN_TIMEOUT + 1)
        self.log(f"clock jumps {TXN_TIMEOUT + 1:.0f}s (everyone paused)")

    def run(self) -> Outcome:
        self.plan_events()
        self.main_role = {"zombie": False, "next": 0}
        role = self.main_role
        self.sched.spawn("driver", lambda actor, role=role: self.driver(actor, role), weight=3.0)
        try:
            self.sched.run()
            self._check_actor_errors()
            while self.stopped is not None:  # each stop is judged; one with a runbook remedy is remedied, and resumed
                if not self._check_stop() or self.remedies >= 3 or not self._remedy():
                    break
                self.stopped = None
                role = self.main_role = {"zombie": False, "next": 0}
                self.sched.spawn("driver", lambda actor, role=role: self.driver(actor, role), weight=3.0)
                self.sched.run()
                self._check_actor_errors()
            else:
                self._final_clean_run()
                self._check_stop()  # a stop of the final run
        except Exception as error:  # the harness itself failed: report, never pass silently
            self.sched.abandon()
            self.violation(f"harness: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        return Outcome(self.seed, self.config, self.violations, type(self.stopped).__name__ if self.stopped else None,
                       self.trace, self.sched.steps, self.faults.calls, sorted(self.proofs), self.remedies)

    def _check_actor_errors(self) -> None:
        actors, self.checked_actors = self.sched.actors[self.checked_actors:], len(self.sched.actors)
        for actor in actors:
            error = actor.error
            if error is None or isinstance(error, (SimulatedCrash, SimulatedTimeout, FencedError)):
                continue
            if actor.name.startswith("task") or (actor.name == "operator" and isinstance(error, _OPERATOR_ANSWERS)):
                self.log(f"{actor.name} ended with {type(error).__name__}: {error}")
                continue
            self.violation(f"actor {actor.name} raised {type(error).__name__}: {error}\n"
                           + "".join(traceback.format_exception(error)))

    def _final_clean_run(self) -> None:
        """Faults stop; Spark starts the next (empty) batch, which sweeps; then batch B-1 is re-run (I7)."""
        self.faults.enabled = False
        self.clean = True  # no more lost, speculative or failing tasks either
        self.sched.events.clear()  # what did not happen before the job finished does not happen now
        last = self.config.batches
        final: dict = {}

        def body(actor: Actor) -> None:
            self.new_process(actor, "driver", "final-driver")
            sink = self.make_sink()
            assert self.spark.plan(last, int(self.clock.now * 1000), last), "Spark cannot plan the final batch"
            sink.process(self._batch_frame(last), last, QUERY)
            self.spark.commit(last)
            begun, visible = len(self.server.history), {t: list(v) for t, v in self.server.visible.items()}
            sink.process(self._batch_frame(last - 1), last - 1, QUERY)
            final["action"] = sink.last_report.action
            if len(self.server.history) != begun or self.server.visible != visible:
                self.violation("I7: re-running a COMMITTED batch began or committed something")

        self.log("final clean run")
        actor = self.sched.spawn("final", body)
        self.sched.run()
        if isinstance(actor.error, LOUD):
            self.stopped = actor.error
            self.log(f"final run STOPPED LOUDLY {type(actor.error).__name__}: {actor.error}")
            return
        if actor.error is not None:
            self.violation(f"the job cannot finish once faults stop: {type(actor.error).__name__}: {actor.error}\n"
                           + "".join(traceback.format_exception(actor.error)))
            return
        self.source = self.spark.rows_through(last)  # Spark's ranges as they ended, re-plans included
        if self.config.reroute:  # a message's table may differ by run: each must be visible once, in some table
            sent = Counter(i for ids in self.source.values() for i in ids)
            seen = Counter(i for table in TABLES for i in self.server.visible_rows(table))
            if seen != sent:
                self.violation(f"messages not visible exactly once across the tables: missing {sorted(sent - seen)}, "
                               f"more than once {sorted(seen - sent)}")
            return
        for table in TABLES:
            visible = sorted(self.server.visible_rows(table))
            if visible != sorted(self.source.get(table, [])):
                sent = self.source.get(table, [])
                missing, extra = sorted(set(sent) - set(visible)), sorted(set(visible) - set(sent))
                self.violation(f"{table}: visible rows differ from the source: missing {missing}, extra {extra}, "
                               f"{len(visible)} visible vs {len(sent)} sent")
        if self.store_lost and not self.target.lists_leftovers:
            # a lost journal forgot intents, and this server cannot list its transactions (StarRocks, Doris):
            # nothing names them any more, so they end only at the server's own timeout (runbook section 'State store lost or rolled back')
            self.clock.advance(TXN_TIMEOUT + 1)
        for txn in self.server.open_txns():
            owner = txn.owner
            if not self._died(owner):
                self.violation(f"I3: {txn.label} is left {txn.state.value} by {owner}, which did not crash")
        for txn in self.server.history:
            # (a writer killed between its begin and its first load leaves an empty BEGUN transaction: that is
            # the I3 check's business, above; I6 is about prepared or committed transactions with nothing in them)
            if not txn.ids and txn.state in (TxnState.PREPARED, TxnState.VISIBLE):
                self.violation(f"I6: {txn.label} holds no rows")

    def _died(self, process_name: str) -> bool:
        process = self.all_processes.get(process_name)
        return process is not None and process.dead

    def _check_stop(self) -> bool:
        """A stop is correct only when it was necessary: the information to go on safely was really gone. Returns
        whether it was (a needless stop is a violation)."""
        error = self.stopped
        if error is None:
            return True
        if isinstance(error, ReplayAmbiguousError):
            why = self._needless_ambiguity(error)
        elif isinstance(error, SourceReplannedError):
            why = self._needless_replan()
        else:
            justified = {
                ReplayImpossibleError: self.downtime_taken or self.store_lost,
                StateStoreLostError: self.store_lost,
                # a store rolled back to an older version of a record no longer names a committed attempt
                CommittedNotChosenError: self.store_lost,
                # the frame routes a message elsewhere than when the batch was first recorded (N1)
                ReplayMismatchError: self.routes != self.first_routes.get(self.stop_batch, self.routes),
            }
            why = next(("no cause for it in this schedule" for kind, ok in justified.items()
                        if isinstance(error, kind) and not ok), None)
        if why:
            self.violation(f"stopped with {type(error).__name__}, which was not necessary ({why}): {error}")
        return not why

    def _needless_replan(self) -> str | None:
        """A re-planned batch must stop only when the journal holds it with other end offsets than Spark's now."""
        batch = self.stop_batch
        assert batch is not None
        record = self.stop_record
        if record is None or record.source is None:
            return f"the journal holds no range for batch {batch}"
        planned = self.spark.ends(batch)
        if planned is not None and self.spark.parse(record.source) == planned:
            return f"Spark planned batch {batch} with the range the journal holds"
        return None

    def _remedy(self) -> bool:
        """The runbook's answer to the stop, by an operator with the CLI; False when there is none to model."""
        if isinstance(self.stopped, ReplayMismatchError) and self.routes:
            self.remedies += 1  # the operator undoes the change until the batch is committed (runbook)
            self.routes = dict(self.first_routes.get(self.stop_batch, {}) if self.stop_batch is not None else {})
            self.log(f"operator: the frame routes as when batch {self.stop_batch} first ran: {self.routes}")
            return True
        if not isinstance(self.stopped, SourceReplannedError):
            return False
        self.remedies += 1
        done: dict[str, int] = {}

        def body(actor: Actor) -> None:
            for _ in range(5):  # the command may be killed or time out like anything else: the operator runs it again
                self.new_process(actor, "operator", "operator")
                args = _Args(command="restore-offsets", checkpoint=self.checkpoint)
                try:
                    done["code"] = cli.cmd_restore_offsets(args)
                    self.log(f"operator restore-offsets --apply: exit {done['code']}: {args.said[:200]}")
                    return
                except (SimulatedCrash, SimulatedTimeout) as error:
                    self.log(f"operator restore-offsets failed: {error}")

        self.sched.spawn("operator", body)
        self.sched.run()
        return done.get("code") == 0

    def _needless_ambiguity(self, error: ReplayAmbiguousError) -> str | None:
        """Why a ReplayAmbiguousError was needless, or None when one of its labels really is ambiguous.

        A label is ambiguous when the server forgot it and nothing the job learned proves its fate. A LOST answer
        to the process whose `sent` listed the label last, at that process's first commit of it, is such a proof
        (F4): no earlier commit was ever sent, and a commit of a label the server does not know commits nothing. The
        proof is gone only if that process died or was fenced before it wrote anything more; a process that went on
        writing, or ended on its own, could have kept it."""
        labels = sorted(set(re.findall(r"\bss_\w+", str(error))))
        if not labels:
            return "it names no label"
        reasons = []
        for label in labels:
            if label in self.server.txns:
                reasons.append(f"{label} is still known to the server")
                continue
            kept = [(name, at) for name, at in self.proofs.get(label, [])
                    if self._went_on(name, at) and not self._erased(name, at)]
            if kept:
                name, at = kept[0]
                reasons.append(f"{label} answered LOST at call {at} to {name}, the last to list it as sent, which went on")
                continue
            never_sent = self._never_sent_by(label)
            if never_sent is None:
                return None  # this one's fate is really unknown
            reasons.append(never_sent)
        return "; ".join(reasons)

    def _never_sent_by(self, label: str) -> str | None:
        """N8: the job could know the label never committed, so a stop on it was needless. No commit of it ever reached
        a server that knew it, and the process whose `sent` listed it last failed on an error it caught while it
        still held the epoch (a killed or fenced one cannot record anything), and the store kept what it wrote. None
        when it could not know: it was killed or fenced, a store loss came after, or it tried to record that after the
        fault that stopped its commit phase and the write failed (the record is best effort)."""
        name = self.sent_by.get(label)
        if label in self.commit_sent or name is None or not self.failed_unfenced.get(name):
            return None
        last_call = self.last_server_call.get(name, -1)
        if self._erased(name, last_call):
            return None
        stopped_at = min((at for at in self.faulted_at.get(name, []) if at >= last_call), default=last_call)
        tried = self.last_store_attempt.get(name, -1)
        if tried > stopped_at and self.last_write.get(name, -1) < tried:
            return None
        return (f"no commit of {label} was ever sent, and {name}, which listed it as sent, failed holding the epoch "
                "and could have recorded that")

    def _erased(self, name: str, at: int) -> bool:
        """Whether a store wipe or rollback after call `at` may have taken what `name` wrote since (it wrote nothing
        after the last one): a proof it kept is then gone, and a stop on it necessary."""
        return any(at < restored and self.last_write.get(name, -1) < restored for restored in self.restores)

    def _went_on(self, name: str, at: int) -> bool:
        """Whether a process wrote to the store after call `at`, or ended on its own (not killed, fenced or failed)."""
        if self.last_write.get(name, -1) > at:
            return True
        process = self.all_processes.get(name)
        failed = any(a.process is process and a.error is not None for a in self.sched.actors)
        return process is not None and not process.dead and not failed


@dataclass
class _Args:
    """What argparse gives the CLI's commands (the URLs are redirected to the simulated store and target)."""

    command: str
    apply: bool = True
    batch: int = 0
    query_id: str | None = None
    label: str = ""
    committed: bool = False
    accept_loss: bool = False
    force: bool = True  # the simulated operators race the driver on purpose: liveness refusals are tested apart
    job: str = JOB
    state: str = "file:///sim-state"
    target: str = "sim://db"
    database: str = "db"
    json: bool = True
    config: str | None = None
    debug: bool = False
    checkpoint: str | None = None
    said: str = ""  # what the command printed (the CLI's output is captured here, never on the real stdout)


# -- proxies --------------------------------------------------------------------------------------

#: Store calls that succeed only under the current epoch: each proves the caller was not fenced when it ran.
_EPOCH_CHECKED = frozenset({"take_epoch", "put_batch", "add_intent", "confirm_intent", "remove_intents", "mark_done",
                            "mark_done_many", "delete_batch"})

class _ServerProxy:
    """The target's view of the server: every RPC goes through `Simulation.call`."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._sim.server, name)

        def send(*args: Any) -> Any:
            if name != "commit":
                return self._sim.call("server", name, lambda: method(*args))
            # a commit counts as sent unless the server had forgotten the label and said so: that one did nothing, and
            # its sender heard it (one without an answer leaves the sender unable to know, as a real one would be)
            label, forgotten = args[0], []

            def commit() -> Any:
                forgotten.append(label not in self._sim.server.txns)
                return method(*args)

            try:
                answer = self._sim.call("server", name, commit)
            except BaseException:
                self._sim.commit_sent.add(label)
                raise
            if not forgotten[0]:
                self._sim.commit_sent.add(label)
            return answer

        return send


class _StoreProxy:
    """The state store as every process reaches it: yield points, faults, and what the checker needs."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.url = "memory://sim"

    def __getattr__(self, name: str) -> Callable[..., Any]:
        sim = self._sim
        method = getattr(sim.raw_store, name)

        def apply(issued: int, *args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            process = sim._process()
            actor = sim.sched.current
            assert actor is not None
            if name == "take_epoch":
                process.epoch = result
                sim.holder, sim.holder_acted = (result, process.name), False
            elif name == "put_batch":
                record = args[2]
                if record.state in (BatchState.PREPARED, BatchState.COMMITTED):
                    sim.ever_prepared.update(c.label for c in record.committables)
                not_sent = set(record.not_sent)
                for label in record.sent:
                    if label not in sim.sent_by or (label in sim.not_sent and label not in not_sent):
                        sim.sent_by[label] = process.name
                sim.not_sent = (sim.not_sent - {c.label for c in record.committables}) | not_sent
            elif name == "add_intent":
                ref = args[4]
                sim.label_epoch[ref.label] = attempt_epoch(ref.attempt) or 0
            if name in _EPOCH_CHECKED or (name == "current_epoch" and result == process.epoch):
                sim.vouched[(id(actor), process.name)] = None  # the process was not fenced at this instant
            if name in _EPOCH_CHECKED:
                sim.last_write[process.name] = issued
            return result

        def issue(*args: Any, **kwargs: Any) -> Any:
            issued = sim.faults.calls
            if name in _EPOCH_CHECKED:
                sim.last_store_attempt[sim._process().name] = issued
            return sim.call("store", name, lambda: apply(issued, *args, **kwargs))

        return issue


# -- the writers' runner --------------------------------------------------------------------------

class SimRunner:
    """Spark's part, in memory: one task per partition, retried on failure, with zombie and
    speculative attempts, tasks that fail after prepare, and stage retries, as the seed decides."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def writer_count(self, data: Any, target: Any) -> int:
        return len(data)

    def table_rows(self, data: Any, router: Any) -> dict[str, int]:
        return table_rows(data, router)

    def run(self, data: Any, target: Any, router: Any, context: WriteContext, store: Any) -> list[PartitionResult]:
        sim = self.sim
        actor = sim.sched.current
        assert actor is not None
        driver = actor.process
        try:
            # as the Spark runner does: a replay writes each partition under the prepared one with its content
            identity = _replay_identity(data, context, _digests)
            numbered = [(writer_partition(identity, p), batches) for p, batches in enumerate(data)]
            results = [self._task(actor, p, batches, target, router, context, store) for p, batches in numbered]
            if sim.config.zombie_tasks and not sim.clean and sim.rng.random() < 0.05:  # a stage retry: every partition again
                sim.log(f"stage retry of batch {context.batch_id}")
                results = [self._task(actor, p, b, target, router, context, store) for p, b in numbered]
            return results
        finally:
            actor.process = driver

    def _task(self, actor: Actor, partition: int, batches: list[pa.RecordBatch], target: Any, router: Any,
              context: WriteContext, store: Any) -> PartitionResult:
        sim = self.sim
        last: BaseException | None = None
        for attempt_number in range(4):  # spark.task.maxFailures
            sim.task_attempts += 1
            task_attempt = sim.task_attempts
            process = sim.new_process(actor, "task", f"task-b{context.batch_id}p{partition}a{task_attempt}", context.epoch)
            writer = PartitionWriter(context, target, router, store, partition, task_attempt)
            roll = sim.rng.random() if sim.config.zombie_tasks and not sim.clean else 1.0
            slow, twinned = sim.config.slow_tasks, sim.config.slow_tasks + sim.config.speculative_tasks
            try:
                if roll < slow:  # the task runs on an executor of its own pace; it may be declared lost
                    outcome = self._remote(writer, batches, process)
                    if outcome is not None:
                        return outcome
                    continue
                if roll < twinned:  # a speculative twin starts beside this attempt
                    sim.task_attempts += 1
                    twin_attempt = sim.task_attempts
                    twin = PartitionWriter(context, target, router, store, partition, twin_attempt)
                    name = f"task-b{context.batch_id}p{partition}a{twin_attempt}-spec"
                    self._zombie(twin, batches, sim.register(Process(name, "task", context.epoch)))
                    actor.process = process
                result = writer.add_all(batches)
                if roll < twinned + 0.06 and attempt_number < 3:  # prepared, then the task fails before reporting
                    sim.log(f"{process.name} failed after prepare; retried")
                    continue
                return result
            except SimulatedCrash as error:
                last = error
                sim.log(f"{process.name} lost ({error}); retried")
            except Exception as error:
                last = error
                sim.log(f"{process.name} failed: {type(error).__name__}: {error}")
        raise last if last is not None else RuntimeError("task kept failing after prepare")

    def _remote(self, writer: PartitionWriter, batches: list[pa.RecordBatch], process: Process) -> PartitionResult | None:
        """Run the attempt as its own actor; wait for it, or declare it lost after a while (it keeps going)."""
        sim = self.sim
        done: dict[str, PartitionResult] = {}

        def body(actor: Actor) -> None:
            actor.process = process
            done["result"] = writer.add_all(batches)

        task = sim.sched.spawn(process.name, body, weight=sim.rng.choice([0.05, 0.3, 1.0]))
        deadline = sim.sched.steps + sim.rng.randint(1, 60)
        sim.sched.wait_until(lambda: task.finished or sim.sched.steps >= deadline)
        if not task.finished:
            sim.log(f"{process.name} declared lost; it keeps running")
            return None
        if task.error is not None:
            sim.log(f"{process.name} failed: {type(task.error).__name__}: {task.error}")
            return None
        return done["result"]

    def _zombie(self, writer: PartitionWriter, rest: list[pa.RecordBatch], process: Process) -> None:
        """Another attempt of the partition, scheduled on its own from now on."""
        sim = self.sim

        def body(actor: Actor) -> None:
            actor.process = process
            try:
                for batch in rest:
                    writer.add(batch)
                writer.finish()
            except BaseException:
                if not process.dead:
                    writer.abort()
                raise

        sim.sched.spawn(process.name, body, weight=sim.rng.choice([0.05, 0.3, 1.0]))


def _rerouted(batch: pa.RecordBatch, routes: dict[int, str]) -> pa.RecordBatch:
    """The batch as a frame that routes the messages of `routes` (id -> table) there builds it."""
    tables = [routes.get(i, t) for i, t in zip(batch.column("id").to_pylist(), batch.column("__table").to_pylist())]
    return batch.set_column(batch.schema.get_field_index("__table"), "__table", pa.array(tables, pa.string()))


def _digests(data: list[list[pa.RecordBatch]]) -> dict[int, str]:
    """Each partition's content checksum, over the batches its writer sees (the Spark runner's `_task_digests`)."""
    found = {}
    for partition, batches in enumerate(data):
        checksum = ContentChecksum()
        for batch in batches:
            checksum.update(batch)
        found[partition] = checksum.hexdigest()
    return found


def run_schedule(seed: int, config: Config | None = None) -> Outcome:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the epoch marker fsyncs: keep it in memory
    with tempfile.TemporaryDirectory(prefix="sim-ckpt-", dir=shm) as checkpoint:
        sim = Simulation(seed, config or Config(), checkpoint)
        with _sim_on(sim):
            return sim.run()


class _sim_on:
    """While a schedule runs: the operator's CLI reaches the simulated store and target instead of opening URLs, and
    the sink's commit pool runs its threads as simulated actors (the real `_run_commits` drives them)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def __enter__(self) -> None:
        sim = self.sim
        self.saved = (cli._open_state, cli.target_from_url, cli._emit, cli._progress, Committer.__dict__["_commit_pool"],
                      committer_module.wait)
        # (never redirect_stdout: an operator yields inside its command, and the redirect is process-wide)
        cli._emit = lambda args, data, text: setattr(args, "said", text)
        cli._progress = lambda args: (lambda message: None)
        cli._open_state = lambda url: sim.store
        cli.target_from_url = lambda *args, **kwargs: sim.target
        Committer._commit_pool = lambda committer, workers: SimPool(sim, workers)  # type: ignore[method-assign]
        committer_module.wait = lambda fs, timeout=None, return_when=ALL_COMPLETED: _sim_wait(sim, fs, return_when)

    def __exit__(self, *exc: Any) -> None:
        (cli._open_state, cli.target_from_url, cli._emit, cli._progress, Committer._commit_pool,
         committer_module.wait) = self.saved


class SimPool:
    """The sink's commit threads as simulated actors of the process that submits: at most `workers` run at once, the
    others queue and can be cancelled before they start (so never send), and a kill of the driver kills them too."""

    def __init__(self, sim: Simulation, workers: int) -> None:
        self.sim, self.workers = sim, workers
        self.running = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        sim = self.sim
        future: Future = Future()
        process = sim._process()

        def body(actor: Actor) -> None:
            actor.process = process
            sim.sched.wait_until(lambda: self.running < self.workers or future.cancelled())
            if not future.set_running_or_notify_cancel():
                return
            self.running += 1
            try:
                future.set_result(fn(*args))
            except ScheduleAbandoned:
                raise
            except BaseException as error:  # as a pool's worker does: the caller reads it from the future
                future.set_exception(error)
            finally:
                self.running -= 1

        sim.sched.spawn(f"{process.name}-commit", body)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def _sim_wait(sim: Simulation, fs: Iterable[Future], return_when: str) -> Any:
    """`concurrent.futures.wait` for simulated threads: the waiting actor lets the others run until it may go on."""
    futures = list(fs)

    def settled() -> bool:
        done = [f for f in futures if f.done()]
        if return_when == FIRST_COMPLETED and done:
            return True
        if return_when == FIRST_EXCEPTION and any(not f.cancelled() and f.exception() is not None for f in done):
            return True
        return len(done) == len(futures)

    sim.sched.wait_until(settled)
    return futures_wait(futures, timeout=0, return_when=return_when)
