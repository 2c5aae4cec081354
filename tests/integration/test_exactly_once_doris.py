"""Exactly-once from a real Kafka topic into the Doris emulator, through kill -9, faults and replays.

The packaged job runs in a child process (`devstack.pipeline.LocalPipeline`) with its writers in
the Spark tasks; the Doris emulator (tests/emulators/doris.py) runs in this process, so the test
can move its clock while the driver is down, restart it, and arm faults. Every flush is its own
Doris transaction here (flush_bytes=1, small Arrow batches), so each (table, partition) of a
batch spans several PRECOMMITTED transactions, as a large partition would in production.

Every test ends with `verify`: both tables equal the source row by row (count, order-independent
checksum, sorted rows), no transaction is left PREPARE/PRECOMMITTED/COMMITTED, no label holds two
visible transactions, every visible transaction is a live committable of exactly one COMMITTED
batch record (and every live committable is visible), no intent is left.
"""
from __future__ import annotations

import json
import random
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from devstack.pipeline import DB, TABLES, LocalPipeline
from streaming_sink.committable import BatchState
from streaming_sink.crash import POINTS
from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from tests.emulators.doris import DorisEmulator
from tests.emulators.faults import Call
from tests.emulators.http_server import Response

pytestmark = pytest.mark.slow

CRASH_BATCH = 2
USER, PASSWORD = "loader", "s3cret"  # not the default: proves credentials survive the FE -> BE 307
COLUMNS = [("id", "BIGINT"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"),
           ("kafka_offset", "BIGINT")]
# The readable part of a label (streaming_sink.committable.make_label) of the pipeline's job:
# query id prefix, batch, table, partition, attempt (epoch, write pass, task attempt), chunk.
LABEL = re.compile(
    r"^ss_orders_ingest_(?P<query>[0-9a-f]{8})_(?P<batch>\d+)_(?P<table>" + "|".join(TABLES) + r")_p(?P<partition>\d+)"
    r"_e(?P<epoch>\d+)w(?P<write_pass>\d+)t(?P<task>\d+)_c(?P<chunk>\d+)_[0-9a-f]{12}$"
)


class RowsDuplicated(AssertionError):
    """A table holds more rows than the source: a replay loaded committed rows again."""


# -- the emulator, with faults aimed by label pattern ------------------------------------------------


@dataclass
class Rule:
    """Fail (HTTP 503) or expire requests whose op and label parts match; at most `times` of them."""

    action: str  # "fail" | "expire"
    op: str
    parts: dict[str, str]
    times: int = 1_000_000
    fired: int = 0

    def matches(self, call: Call) -> bool:
        if self.fired >= self.times or call.op != self.op or call.label is None:
            return False
        found = LABEL.search(call.label)
        return found is not None and all(found.group(k) == v for k, v in self.parts.items())


class ScriptedDoris(DorisEmulator):
    """The Doris emulator plus faults aimed at a label pattern (the generic knobs need exact labels,
    which embed the query id and the driver's fencing epoch, unknown before the job starts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rules: list[Rule] = []

    def route(self, role: str, req: Any, call: Call) -> Response:
        for rule in self.rules:
            if role == "fe" and rule.matches(call):
                rule.fired += 1
                if rule.action == "fail":
                    return Response.text("emulated HTTP 503 (scripted)", status=503)
                with self.lock:
                    self._expire_label(call.db, call.label)
        return super().route(role, req, call)


# -- the pipeline around it --------------------------------------------------------------------------


@dataclass
class DorisAdapter:
    """How devstack.pipeline reaches the in-process Doris emulator (its TargetAdapter protocol)."""

    emu: ScriptedDoris
    options: dict[str, Any] = field(default_factory=dict)

    def target_url(self) -> str:
        return f"doris://127.0.0.1:{self.emu.fe_port}"

    def target_options(self) -> dict[str, Any]:
        return {"tables": TABLES, "backoff_s": 0.05, **self.options}

    def env(self) -> dict[str, str]:
        return {USER_ENV: USER, PASSWORD_ENV: PASSWORD}

    def create_tables(self, database: str, tables: list[str]) -> None:
        for table in tables:
            self.emu.create_table(database, table, COLUMNS)

    def rows(self, database: str, table: str) -> list[tuple]:
        return sorted(tuple(row) for row in self.emu.visible_rows(database, table))

    def problems(self, database: str) -> list[str]:
        txns = self.emu.transactions(database)
        problems = [f"txn {t['txn_id']} ({t['label']}) left {t['state']}" for t in txns if t["state"] not in ("VISIBLE", "ABORTED")]
        visible = Counter(t["label"] for t in txns if t["state"] == "VISIBLE")
        problems += [f"label {label} committed {n} times" for label, n in visible.items() if n > 1]
        return problems


@dataclass
class DorisPipeline(LocalPipeline):
    """LocalPipeline with a flush per Arrow batch: every (table, partition) spans several Doris transactions."""

    flush_bytes: int = 1

    def write_spec(self) -> None:
        super().write_spec()
        spec = json.loads(self.spec_path.read_text())
        spec["flush_bytes"] = self.flush_bytes
        self.spec_path.write_text(json.dumps(spec))

    @property
    def emu(self) -> ScriptedDoris:
        assert isinstance(self.adapter, DorisAdapter)
        return self.adapter.emu

    def records(self) -> dict[int, Any]:
        store = self.store()
        return {key[1]: store.get_batch(self.job_id, *key) for key in store.batch_keys(self.job_id)}

    def verify_all(self) -> None:
        """`LocalPipeline.verify`, then the emulator's transactions against the state store's records."""
        self.verify()
        live = Counter(c.label for r in self.records().values() for c in r.live_committables())
        assert all(n == 1 for n in live.values()), f"a label is live in two batch records: {live.most_common(3)}"
        visible = {t["label"]: t for t in self.emu.transactions(DB) if t["state"] == "VISIBLE"}
        assert set(visible) == set(live), (
            f"visible but in no record: {sorted(set(visible) - set(live))[:5]}; "
            f"recorded but not visible: {sorted(set(live) - set(visible))[:5]}"
        )
        assert sum(t["rows"] for t in visible.values()) == sum(len(v) for v in self.source.values())


@pytest.fixture
def emulator(tmp_path) -> Iterator[ScriptedDoris]:
    with ScriptedDoris(tmp_path / "doris", user=USER, password=PASSWORD) as emu:
        yield emu


def make_pipeline(tmp_path, kafka_broker, state_url: str, emu: ScriptedDoris, options: dict[str, Any] | None = None,
                  spark_conf: dict[str, str] | None = None, topic: str = "") -> DorisPipeline:
    pipeline = DorisPipeline(
        tmp_path, kafka_broker, state_url, topic=topic,
        messages_per_partition=160, max_offsets_per_trigger=120,  # 4 batches of 40 messages per partition
        adapter=DorisAdapter(emu, options or {}),
        spark_conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "20", **(spark_conf or {})},
    )
    pipeline.produce()
    return pipeline


def state_url_for(kind: str, tmp_path, request) -> str:
    return f"file://{tmp_path / 'state'}" if kind == "file" else request.getfixturevalue("redis_server").url


def batch_txns(emu: DorisEmulator, batch: int) -> list[dict[str, Any]]:
    return [t for t in emu.transactions(DB) if (m := LABEL.search(t["label"])) and int(m.group("batch")) == batch]


# -- crash points, precommit expiry, random kills -----------------------------------------------------

# One job life, killed once at each protocol point (one per batch) and restarted each time. Not
# after-committed-record in the last batch: its re-run only finds the batch COMMITTED, and the
# batch's intents wait for a later batch's sweep (noted for the coordinator in the issue-4 report).
CHAIN = [("after-writers-prepared", 0), ("after-committed-record", 1), ("after-prepared-record", 2),
         ("after-first-commit", 3)]
assert sorted(point for point, _ in CHAIN) == sorted(POINTS)


def assert_stopped_at(pipeline: "DorisPipeline", point: str, batch: int) -> None:
    """The kill happened where it was asked to: the journal and the emulator show that exact step."""
    record, intents, done = pipeline.batch_state(batch)
    states = Counter(t["state"] for t in batch_txns(pipeline.emu, batch))
    if point == "after-writers-prepared":
        assert record is None and intents and states == {"PRECOMMITTED": len(intents)}, states
    elif point == "after-prepared-record":
        assert record.state is BatchState.PREPARED and not done
        assert states == {"PRECOMMITTED": len(record.committables)}, states
        assert len(record.committables) > 2 * len(TABLES)  # several transactions per (table, partition)
    elif point == "after-first-commit":
        # Commits run in parallel: others may have finished before the kill landed, never all of them.
        assert record.state is BatchState.PREPARED and 1 <= len(done) < len(record.committables)
        assert states["VISIBLE"] >= len(done) and states["VISIBLE"] + states["PRECOMMITTED"] == len(record.committables)
    elif point == "after-committed-record":
        assert record.state is BatchState.COMMITTED and set(states) == {"VISIBLE"}, states
    else:
        raise AssertionError(point)


def test_kill_at_every_protocol_point_then_restart_is_exact(tmp_path, kafka_broker, emulator, request):
    pipeline = make_pipeline(tmp_path, kafka_broker, state_url_for("redis", tmp_path, request), emulator,
                             topic=f"events-chain-{tmp_path.name}")
    for run, (point, batch) in enumerate(CHAIN):
        code = pipeline.run_driver(crash_at=f"{point}@{batch}", run=run)
        assert code == -signal.SIGKILL, f"run {run} should have died at {point}@{batch}, exited {code}:\n{pipeline.log_tail(run)}"
        assert_stopped_at(pipeline, point, batch)
    pipeline.run_to_completion(first_run=len(CHAIN))
    pipeline.verify_all()


def test_precommit_expiry_during_a_long_outage_is_replayed_exactly(tmp_path, kafka_broker, emulator):
    """Driver dies after the commit point; Doris aborts the PRECOMMITTED txns an hour later and the cluster
    restarts; the restarted job finds them "already aborted", reloads them from the re-run batch under fresh
    labels, and ends exact."""
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", emulator)
    assert pipeline.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    assert_stopped_at(pipeline, "after-prepared-record", CRASH_BATCH)
    record, _, _ = pipeline.batch_state(CRASH_BATCH)
    emulator.clock.advance(3601)  # stream_load_default_precommit_timeout_second = 3600
    emulator.restart()  # data and label history persist
    expired = {t["label"]: t["reason"] for t in batch_txns(emulator, CRASH_BATCH)}
    assert expired == {c.label: "timeout by txn manager" for c in record.committables}
    pipeline.run_to_completion()
    pipeline.verify_all()
    record, _, _ = pipeline.batch_state(CRASH_BATCH)
    assert sorted(record.lost) == sorted(expired), "every expired transaction should have been replayed"
    assert any(f"replayed {len(expired)} lost" in event for event in record.events), record.events


class _Stop(Exception):
    """Raised at a crash point instead of SIGKILL, for the in-process driver below."""


def test_replay_finds_renumbered_partitions(tmp_path, emulator, spark_session, monkeypatch):
    """Deterministic form of what the Kafka source does after a restart: the batch is prepared from
    partitions [A, B, C], its precommitted txns expire while the driver is down, and the re-run delivers
    [C, B, A]. The coordinator must find each lost part by content, not by Spark's partition number."""
    from streaming_sink.state import FileStateStore
    from streaming_sink import sink as sink_module
    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.targets.doris import DorisTarget

    schema = "id BIGINT, name STRING, amount DOUBLE, kafka_partition INT, kafka_offset BIGINT, __table STRING"
    parts = [[(p * 1000 + i, f"n{p}-{i}", i / 4, p, i, TABLES[(i // 2 + p) % 2]) for i in range(30)] for p in range(3)]

    def frame(order: list[int]):
        rdd = spark_session.sparkContext.parallelize([row for p in order for row in parts[p]], len(order))
        return spark_session.createDataFrame(rdd, schema)

    for table in TABLES:
        emulator.create_table(DB, table, COLUMNS)
    store = FileStateStore(tmp_path / "state")

    def sink() -> ExactlyOnceSink:
        target = DorisTarget(emulator.fe_url, DB, USER, PASSWORD, tables=TABLES, backoff_s=0.05)
        return ExactlyOnceSink(target, store, "renumbered", table_column="__table", flush_bytes=1)

    def stop_at_commit_point(name: str, batch_id: int) -> None:
        if name == "after-prepared-record":
            raise _Stop(name)

    monkeypatch.setattr(sink_module, "crash_point", stop_at_commit_point)
    with pytest.raises(_Stop):
        sink().process(frame([0, 1, 2]), 0, "query-renumbered")
    monkeypatch.undo()
    emulator.clock.advance(3601)  # every precommitted txn of the batch expires while "the driver is down"
    report = sink().process(frame([2, 1, 0]), 0, "query-renumbered")
    assert report.action == "recovered-prepared" and report.replayed > 0
    for table in TABLES:
        expected = sorted(r[:5] for p in parts for r in p if r[5] == table)
        assert sorted(emulator.visible_rows(DB, table)) == expected
    assert not [t for t in emulator.transactions(DB) if t["state"] not in ("VISIBLE", "ABORTED")]


def test_kill_at_random_instants_is_exact(tmp_path, kafka_broker, emulator):
    rng = random.Random(29)
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", emulator)
    killed = pipeline.kill_at_random_instants(rng, runs=2, max_wait_s=2.5)
    assert killed >= 1, "the random instants never hit a running driver; the test proved nothing"
    pipeline.run_to_completion(first_run=10)
    pipeline.verify_all()


def test_some_chunks_of_a_partition_lost_are_replayed_without_duplicating_the_others(tmp_path, kafka_broker, emulator):
    """One chunk of (orders, partition 0) expires on its way to commit while its sibling chunk commits
    (as after a crash between their commits and a long outage): the replay must not load the sibling's
    rows a second time."""
    emulator.rules.append(Rule("expire", "commit", {"batch": str(CRASH_BATCH), "table": "orders", "partition": "0",
                                                    "write_pass": "0", "chunk": "1"}, times=1))
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", emulator)
    pipeline.run_to_completion(first_run=0)
    assert emulator.rules[0].fired == 1
    record, _, _ = pipeline.batch_state(CRASH_BATCH)
    assert len(record.lost) == 1
    visible = len(emulator.visible_rows(DB, "orders"))
    if visible > len(pipeline.source["orders"]):
        raise RowsDuplicated(f"orders: {visible} rows, source has {len(pipeline.source['orders'])}")
    pipeline.verify_all()


# -- fault knobs ----------------------------------------------------------------------------------------


def test_load_side_faults_and_a_be_restart_are_survived_exactly(tmp_path, kafka_broker, emulator, request):
    faults = emulator.faults
    faults.http_5xx.arm(times=3, op="stream_load", role="be")
    faults.drop_connection_before.arm(times=2, op="stream_load", role="fe")
    faults.slow_response.arm(times=1, op="stream_load", role="be", seconds=3)  # applied; answer after the timeout
    faults.http_5xx.arm(times=1, op="get_load_state")  # the start-up check
    pipeline = make_pipeline(tmp_path, kafka_broker, state_url_for("redis", tmp_path, request), emulator,
                             options={"request_timeout_s": 1.0})
    proc = pipeline.start_driver(run=0)
    try:
        pipeline.wait_for_batches(proc, count=1)
        emulator.restart_be()  # in-flight loads die with it; their txns are aborted
        assert proc.wait(timeout=300) == 0, pipeline.log_tail(0)
    finally:
        pipeline.kill(proc)
    assert faults.http_5xx.fired == 4 and faults.drop_connection_before.fired == 2 and faults.slow_response.fired == 1
    relabelled = [label for label, n in Counter(t["label"] for t in emulator.transactions(DB)).items() if n > 1]
    assert relabelled, "the slow answer should have made a retried load find its label PRECOMMITTED"
    pipeline.verify_all()


def test_commit_side_faults_and_an_emulator_restart_are_survived_exactly(tmp_path, kafka_broker, emulator):
    faults = emulator.faults
    faults.write_lock_timeout.arm(times=3)
    faults.drop_connection_after_commit.arm(times=2)
    faults.http_5xx.arm(times=2, op="commit")
    faults.drop_connection_before.arm(times=1, op="commit", role="be")
    faults.publish_timeout.arm(times=2, op="commit", visible_after=0)
    faults.http_5xx.arm(times=1, op="abort")
    faults.expire_prepared.arm(times=1, op="abort")  # harmless: aborting what is aborted anyway
    # Every chunk of (payments, partition 1) of batch 3 expires just before its commit: lost, replayed.
    emulator.rules.append(Rule("expire", "commit", {"batch": "3", "table": "payments", "partition": "1", "write_pass": "0"}))
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", emulator)
    assert pipeline.run_driver(crash_at=f"after-writers-prepared@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    emulator.restart()
    pipeline.run_to_completion()
    fired = {name: getattr(faults, name).fired for name in faults.names()}
    assert fired["write_lock_timeout"] == 3 and fired["drop_connection_after_commit"] == 2, fired
    assert fired["publish_timeout"] == 2 and fired["drop_connection_before"] == 1, fired
    assert fired["http_5xx"] == 3 and fired["expire_prepared"] == 1, fired
    record, _, _ = pipeline.batch_state(3)
    group = [c.label for c in record.committables if (c.table, c.partition) == ("payments", 1)
             and LABEL.search(c.label).group("write_pass") == "0"]
    assert len(group) >= 1 and sorted(record.lost) == sorted(group), (record.lost, group)  # the whole group, replayed
    pipeline.verify_all()


# -- retried and speculative tasks ------------------------------------------------------------------------


def test_a_task_that_fails_after_precommitting_is_retried_exactly(tmp_path, kafka_broker, emulator):
    """Attempt 0 of partition 0 pre-commits its first chunk, then its second load fails for good, and its own
    abort fails too: Spark retries the task (local[2,3]); the driver commits attempt 1 and aborts attempt 0's txn.
    Speculation is on as well (Spark never launches copies on a single host; see the unit tests for duplicates)."""
    # Labels carry Spark's taskAttemptId, unknown beforehand: the first task of partition 0 to load is attempt 0.
    target = {"batch": str(CRASH_BATCH), "partition": "0", "write_pass": "0"}
    emulator.rules.append(Rule("fail", "stream_load", {**target, "chunk": "1"}, times=2))
    emulator.rules.append(Rule("fail", "abort", {**target, "chunk": "0"}, times=2))  # the task's own cleanup
    pipeline = make_pipeline(
        tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", emulator, options={"retries": 1},
        spark_conf={"spark.master": "local[2,3]", "spark.speculation": "true", "spark.speculation.interval": "100ms",
                    "spark.speculation.multiplier": "1.1", "spark.speculation.quantile": "0.25"},
    )
    pipeline.run_to_completion(first_run=0)
    assert [r.fired for r in emulator.rules] == [2, 2]  # the load and its one retry; the abort and its retry
    attempts = {int(m.group("task")): t["state"] for t in batch_txns(emulator, CRASH_BATCH)
                if (m := LABEL.search(t["label"])) and m.group("chunk") == "0" and m.group("table") == "orders"
                and m.group("partition") == "0"}
    first, retry = sorted(attempts)  # task attempt ids grow: the retry's is the larger
    assert attempts[first] == "ABORTED" and attempts[retry] == "VISIBLE", attempts
    pipeline.verify_all()
