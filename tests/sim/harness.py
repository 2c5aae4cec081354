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

import contextlib
import io
import os
import random
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from streaming_sink.state import FencedError, StateStoreLostError
from streaming_sink.state.base import attempt_epoch
from streaming_sink.state.memory import MemoryStateStore
from streaming_sink import cli
from streaming_sink.committable import BatchState
from streaming_sink.recovery import (
    Recovery, ReplayAmbiguousError, ReplayImpossibleError, apply_recovery, plan_recovery,
)
from streaming_sink.sink import ExactlyOnceSink, ReplayMismatchError
from streaming_sink.targets.base import CommittedNotChosenError
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext

from .fake_target import OPEN, FakeOlapServer, FakeTarget, SimClock, SimulatedTimeout, Txn, TxnState

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
    """Planned faults by call number (of all calls into the server and the store)."""

    plan: dict[int, str] = field(default_factory=dict)
    enabled: bool = True
    calls: int = 0

    def next(self) -> str | None:
        self.calls += 1
        return self.plan.get(self.calls) if self.enabled else None


# -- the simulation -------------------------------------------------------------------------------

LOUD = (ReplayAmbiguousError, ReplayImpossibleError, ReplayMismatchError, StateStoreLostError, CommittedNotChosenError)


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
    operator: bool = True
    downtime: bool = True  # restarts after the prepared timeout or the label retention
    store_wipe: bool = True  # the state store loses everything (epoch counter included)
    # The state store goes back to an earlier snapshot (lagging replica, backup).
    store_rollback: bool = True


@dataclass
class Outcome:
    seed: int
    config: Config
    violations: list[str]
    stopped: str | None  # the documented loud error the job stopped with, if any
    trace: list[str]
    steps: int
    calls: int

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
        self.server = FakeOlapServer(TABLES, self.clock, TXN_TIMEOUT, LABEL_KEEP, keep_count)
        per_flush = rng.random() < 0.5 if config.per_flush is None else config.per_flush
        # drawn apart from the schedule's own stream, so a seed's schedule does not depend on it
        lists = random.Random(f"lists-{seed}").random() < 0.5 if config.lists_leftovers is None else config.lists_leftovers
        self.target = FakeTarget(_ServerProxy(self), per_flush, lists)
        self.raw_store = MemoryStateStore()
        self.store = _StoreProxy(self)
        self.checkpoint = checkpoint
        self.sched = Scheduler(rng, max_steps=20000)
        nfaults = rng.randint(0, 4) if config.faults is None else config.faults
        self.faults = Faults({rng.randint(1, 400): rng.choice(FAULT_KINDS) for _ in range(nfaults)})
        self.flush_bytes = rng.choice([1, 64, 1 << 20])  # 1: one flush per Arrow batch
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.ever_prepared: set[str] = set()  # labels in a PREPARED record that was durably written (I1)
        self.label_epoch: dict[str, int] = {}  # label -> epoch of the attempt that recorded its intent
        self.committed_batches = 0  # Spark's commit log: batches whose foreachBatch returned
        self.stopped: BaseException | None = None
        self.task_attempts = 0
        self.store_lost = False
        self.clean = False
        self.downtime_taken = False
        self.processes = 0
        self.all_processes: dict[str, Process] = {}
        self.source, self.data = self._make_source()
        self.server.who = self._who
        self.server.on_visible = self._on_visible
        self.server.on_abort_call = self._on_abort_call
        self.server.on_label_reuse = self._on_label_reuse

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

    def call(self, where: str, name: str, apply: Callable[[], Any]) -> Any:
        """Every call into the server or the store: a yield point and a place for a fault."""
        process = self._process()
        if process.dead:
            raise SimulatedCrash(f"{process.name} is dead")
        self.sched.pause()
        self.clock.advance(0.01)
        fault = self.faults.next()
        if fault:
            self.log(f"FAULT {fault} at {where}.{name} in {process.name}")
        if fault == "crash-before":
            process.dead = True
            raise SimulatedCrash(f"{process.name} killed before {where}.{name}")
        if fault == "timeout-before":
            raise SimulatedTimeout(f"{where}.{name}: no answer (not applied)")
        result = apply()
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
            runner=SimRunner(self), checkpoint_location=self.checkpoint,
        )

    def driver(self, actor: Actor, role: dict) -> None:
        """Spark's driver: run batch `committed` until foreachBatch returns, restart after any failure."""
        sink: ExactlyOnceSink | None = None
        restarts = 0
        while True:
            batch = role["next"] if role["zombie"] else self.committed_batches
            if batch >= self.config.batches or (role["zombie"] and sink is None):
                return
            if sink is None:
                self.new_process(actor, "driver", actor.name)
                sink = self.make_sink()
            try:
                sink.process(self.data[batch], batch, QUERY)
                self.log(f"{actor.process.name}: batch {batch} returned ({sink.last_report.action})")
                if role["zombie"]:
                    role["next"] = batch + 1
                else:
                    self.committed_batches = max(self.committed_batches, batch + 1)
                continue
            except SimulatedCrash as error:
                self.log(f"{actor.process.name}: crashed in batch {batch} ({error})")
            except LOUD as error:
                if role["zombie"]:
                    self.log(f"zombie {actor.process.name} stopped loudly: {type(error).__name__}")
                    return
                self.stopped = error
                self.log(f"{actor.process.name}: STOPPED LOUDLY {type(error).__name__}: {error}")
                return
            except Exception as error:
                self.log(f"{actor.process.name}: batch {batch} failed: {type(error).__name__}: {error}")
            actor.process.dead = True
            sink = None
            if role["zombie"]:
                return
            restarts += 1
            if restarts > MAX_RESTARTS:
                self.violation(f"no progress: {restarts} restarts at batch {batch}")
                return
            self._maybe_downtime()

    def _maybe_downtime(self) -> None:
        if not self.config.downtime or self.rng.random() > 0.15:
            return
        seconds = self.rng.choice([TXN_TIMEOUT + 1, LABEL_KEEP + 1])
        self.downtime_taken = True
        self.clock.advance(seconds)
        self.log(f"downtime {seconds:.0f}s before the restart")

    def operator(self, actor: Actor) -> None:
        self.new_process(actor, "operator", "operator")
        if self.rng.random() < 0.5:
            epoch = self.store.take_epoch(JOB, owner="operator recover")
            recovery = Recovery(self.target, self.store, JOB, epoch)
            done = apply_recovery(recovery, plan_recovery(self.store, JOB), lambda message: None)
            self.log(f"operator recover --apply: {[(a.batch_id, a.action) for a in done]}")
        else:
            batch = self.committed_batches
            args = _Args(job=JOB, state="sim", target="sim", database="db", batch=batch, query_id=None,
                         apply=True, json=True, command="abort")
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):  # only this actor runs meanwhile
                code = cli.cmd_abort(args)
            self.log(f"operator abort --batch {batch} --apply: exit {code}: {out.getvalue().strip()[:200]}")

    # -- the schedule ----------------------------------------------------------------------------

    def plan_events(self) -> None:
        rng, config = self.rng, self.config
        if config.zombie_driver and rng.random() < 0.3:
            self.sched.events.setdefault(rng.randint(5, 300), []).append(self._fork_zombie_driver)
        if config.operator and rng.random() < 0.2:
            self.sched.events.setdefault(rng.randint(5, 300), []).append(
                lambda: self.sched.spawn("operator", self.operator))
        if config.store_wipe and rng.random() < 0.05:
            self.sched.events.setdefault(rng.randint(5, 300), []).append(lambda: self._lose_store(None))
        if config.store_rollback and rng.random() < 0.05:
            snapshot_at, loss_at = sorted(rng.sample(range(5, 300), 2))
            snapshot: dict = {}
            self.sched.events.setdefault(snapshot_at, []).append(lambda: snapshot.update(self.raw_store.snapshot()))
            self.sched.events.setdefault(loss_at, []).append(lambda: self._lose_store(snapshot))
        if config.downtime and rng.random() < 0.1:  # a long pause of whoever runs (GC, VM freeze)
            self.sched.events.setdefault(rng.randint(5, 300), []).append(self._pause_everything)

    def _fork_zombie_driver(self) -> None:
        """The cluster manager thinks the driver died and starts another; the old one keeps going."""
        old = self.main_role
        if old["zombie"]:
            return
        old["zombie"], old["next"] = True, self.committed_batches
        self.log("the driver becomes a zombie; a new driver starts")
        self.main_role = {"zombie": False, "next": 0}
        role = self.main_role
        self.sched.spawn("driver", lambda actor: self.driver(actor, role), weight=3.0)

    def _lose_store(self, snapshot: dict | None) -> None:
        self.store_lost = True
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
        self.sched.spawn("driver", lambda actor: self.driver(actor, role), weight=3.0)
        try:
            self.sched.run()
            self._check_actor_errors()
            if self.stopped is None:
                self._final_clean_run()
        except Exception as error:  # the harness itself failed: report, never pass silently
            self.sched.abandon()
            self.violation(f"harness: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        self._check_stop()
        return Outcome(self.seed, self.config, self.violations, type(self.stopped).__name__ if self.stopped else None,
                       self.trace, self.sched.steps, self.faults.calls)

    def _check_actor_errors(self) -> None:
        for actor in self.sched.actors:
            error = actor.error
            if error is None or isinstance(error, (SimulatedCrash, SimulatedTimeout, FencedError)):
                continue
            if actor.name == "operator" or actor.name.startswith("task"):
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
        self.data.append([[]])
        final: dict = {}

        def body(actor: Actor) -> None:
            self.new_process(actor, "driver", "final-driver")
            sink = self.make_sink()
            sink.process(self.data[last], last, QUERY)
            begun, visible = len(self.server.history), {t: list(v) for t, v in self.server.visible.items()}
            sink.process(self.data[last - 1], last - 1, QUERY)
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
        for table in TABLES:
            visible = sorted(self.server.visible_rows(table))
            if visible != sorted(self.source[table]):
                missing = sorted(set(self.source[table]) - set(visible))
                extra = sorted(set(visible) - set(self.source[table]))
                self.violation(f"{table}: visible rows differ from the source: missing {missing}, extra {extra}, "
                               f"{len(visible)} visible vs {len(self.source[table])} sent")
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

    def _check_stop(self) -> None:
        error = self.stopped
        if error is None:
            return
        justified = {
            ReplayAmbiguousError: bool(self.server.forgotten),
            ReplayImpossibleError: self.downtime_taken or self.store_lost,
            StateStoreLostError: self.store_lost,
            # a store rolled back to an older version of a record no longer names a committed attempt
            CommittedNotChosenError: self.store_lost,
            ReplayMismatchError: False,
        }
        for kind, ok in justified.items():
            if isinstance(error, kind) and not ok:
                self.violation(f"stopped with {type(error).__name__} with no cause for it in this schedule: {error}")


@dataclass
class _Args:
    job: str
    state: str
    target: str
    database: str
    batch: int
    query_id: str | None
    apply: bool
    json: bool
    command: str


# -- proxies --------------------------------------------------------------------------------------

class _ServerProxy:
    """The target's view of the server: every RPC goes through `Simulation.call`."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._sim.server, name)
        return lambda *args: self._sim.call("server", name, lambda: method(*args))


class _StoreProxy:
    """The state store as every process reaches it: yield points, faults, and what the checker needs."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.url = "memory://sim"

    def __getattr__(self, name: str) -> Callable[..., Any]:
        sim = self._sim
        method = getattr(sim.raw_store, name)

        def apply(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            process = sim._process()
            if name == "take_epoch":
                process.epoch = result
            elif name == "put_batch":
                record = args[2]
                if record.state in (BatchState.PREPARED, BatchState.COMMITTED):
                    sim.ever_prepared.update(c.label for c in record.committables)
            elif name == "add_intent":
                ref = args[4]
                sim.label_epoch[ref.label] = attempt_epoch(ref.attempt) or 0
            return result

        return lambda *args, **kwargs: sim.call("store", name, lambda: apply(*args, **kwargs))


# -- the writers' runner --------------------------------------------------------------------------

class SimRunner:
    """Spark's part, in memory: one task per partition, retried on failure, with zombie and
    speculative attempts, tasks that fail after prepare, and stage retries, as the seed decides."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def run(self, data: Any, target: Any, router: Any, context: WriteContext, store: Any) -> list[PartitionResult]:
        sim = self.sim
        actor = sim.sched.current
        assert actor is not None
        driver = actor.process
        try:
            results = [self._task(actor, p, batches, target, router, context, store) for p, batches in enumerate(data)]
            if sim.config.zombie_tasks and not sim.clean and sim.rng.random() < 0.05:  # a stage retry: every partition again
                sim.log(f"stage retry of batch {context.batch_id}")
                results = [self._task(actor, p, b, target, router, context, store) for p, b in enumerate(data)]
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
            try:
                if roll < 0.08:  # the task runs on an executor of its own pace; it may be declared lost
                    outcome = self._remote(writer, batches, process)
                    if outcome is not None:
                        return outcome
                    continue
                if roll < 0.14:  # a speculative twin starts beside this attempt
                    sim.task_attempts += 1
                    twin_attempt = sim.task_attempts
                    twin = PartitionWriter(context, target, router, store, partition, twin_attempt)
                    name = f"task-b{context.batch_id}p{partition}a{twin_attempt}-spec"
                    self._zombie(twin, batches, sim.register(Process(name, "task", context.epoch)))
                    actor.process = process
                result = writer.add_all(batches)
                if roll < 0.2 and attempt_number < 3:  # prepared, then the task fails before reporting
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


def run_schedule(seed: int, config: Config | None = None) -> Outcome:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the epoch marker fsyncs: keep it in memory
    with tempfile.TemporaryDirectory(prefix="sim-ckpt-", dir=shm) as checkpoint:
        sim = Simulation(seed, config or Config(), checkpoint)
        with _cli_on(sim):
            return sim.run()


class _cli_on:
    """The operator's CLI reaches the simulated store and target instead of opening URLs."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def __enter__(self) -> None:
        self.saved = (cli.open_store, cli.target_from_url)
        cli.open_store = lambda url: self.sim.store
        cli.target_from_url = lambda url, database: self.sim.target

    def __exit__(self, *exc: Any) -> None:
        cli.open_store, cli.target_from_url = self.saved
