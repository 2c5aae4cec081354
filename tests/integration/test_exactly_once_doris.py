"""Exactly-once from a real Kafka topic into the Doris emulator: its own scenarios (tests/support/targets/doris.py).

The packaged job runs in a child process with its writers in the Spark tasks; the emulator runs in
this process, so a test can move its clock while the driver is down, restart it, and arm faults
(aimed by label pattern: `Rule`). The kills at every protocol point and at random instants are the
shared matrix's (test_exactly_once_matrix.py, on `DorisAdapter`).

Every test ends with `verify`: both tables equal the source row by row (count, order-independent
checksum, sorted rows), no transaction is left PREPARE/PRECOMMITTED/COMMITTED, no label holds two
visible transactions, every visible transaction is a live committable of exactly one COMMITTED
batch record (and every live committable is visible), no intent is left.
"""
from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.support.pipeline import DB, TABLES
from tests.support.targets.base import COLUMNS, label_parts
from tests.support.targets.doris import PASSWORD, USER, DorisAdapter, DorisPipeline, Rule, ScriptedDoris, batch_txns

pytestmark = pytest.mark.slow

CRASH_BATCH = 2


class RowsDuplicated(AssertionError):
    """A table holds more rows than the source: a replay loaded committed rows again."""


target = pytest.fixture(DorisAdapter.for_test)


@pytest.fixture
def emulator(target: DorisAdapter) -> ScriptedDoris:
    return target.emulator


def make_pipeline(tmp_path, kafka_broker, state_url: str, target: DorisAdapter, options: dict[str, Any] | None = None,
                  spark_conf: dict[str, str] | None = None) -> DorisPipeline:
    pipeline = target.pipeline(tmp_path, kafka_broker, state_url, options, spark_conf)
    assert isinstance(pipeline, DorisPipeline)
    return pipeline


def redis_url(request) -> str:
    return request.getfixturevalue("redis_server").url


# -- precommit expiry and replays -----------------------------------------------------

@pytest.mark.extended  # CI: StarRocks' prepared expiry during an outage (test_exactly_once_starrocks.py), Doris' at target level
def test_precommit_expiry_during_a_long_outage_is_replayed_exactly(tmp_path, kafka_broker, target, emulator):
    """Driver dies after the commit point; Doris aborts the PRECOMMITTED txns an hour later and the cluster
    restarts; the restarted job finds them "already aborted", reloads them from the re-run batch under fresh
    labels, and ends exact."""
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", target)
    assert pipeline.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    target.assert_stopped_at(pipeline, "after-prepared-record", CRASH_BATCH)
    record, _, _ = pipeline.batch_state(CRASH_BATCH)
    assert len(record.committables) > 2 * len(TABLES)  # several transactions per (table, partition)
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
    from streaming_sink import sink as sink_module
    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.state import FileStateStore
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


def test_a_lost_table_transaction_of_a_partition_is_replayed_without_duplicating_the_others(
        tmp_path, kafka_broker, target, emulator):
    """The one transaction of (orders, partition 0), which holds all its flushes, expires on its way to commit while
    the batch's others commit (as after a crash between their commits and a long outage): the replay reloads that
    (table, partition) whole and loads no other rows a second time."""
    emulator.rules.append(Rule("expire", "commit", {"batch": str(CRASH_BATCH), "table": "orders", "partition": "0",
                                                    "write_pass": "0", "chunk": "0"}, times=1))
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", target)
    pipeline.run_to_completion(first_run=0)
    assert emulator.rules[0].fired == 1
    record, _, _ = pipeline.batch_state(CRASH_BATCH)
    assert len(record.lost) == 1
    visible = len(emulator.visible_rows(DB, "orders"))
    if visible > len(pipeline.source["orders"]):
        raise RowsDuplicated(f"orders: {visible} rows, source has {len(pipeline.source['orders'])}")
    pipeline.verify_all()


# -- fault knobs ----------------------------------------------------------------------------------------


@pytest.mark.extended  # CI: every Doris request under every fault (test_fault_sweep.py) and the commit side below
def test_load_side_faults_and_a_be_restart_are_survived_exactly(tmp_path, kafka_broker, target, emulator, request):
    faults = emulator.faults
    faults.http_5xx.arm(times=3, op="stream_load", role="be")
    faults.drop_connection_before.arm(times=2, op="stream_load", role="fe")
    faults.slow_response.arm(times=1, op="stream_load", role="be", seconds=3)  # applied; answer after the timeout
    faults.http_5xx.arm(times=1, op="get_load_state")  # the start-up check
    # A load whose body was sent and whose answer was lost, or that dies with its BE, cannot be sent again (its body
    # streamed and is not kept): the task fails and Spark runs it again under new labels.
    pipeline = make_pipeline(tmp_path, kafka_broker, redis_url(request), target,
                             options={"request_timeout_s": 1.0}, spark_conf={"spark.master": "local[2,4]"})
    proc = pipeline.start_driver(run=0)
    try:
        pipeline.wait_for_batches(proc, count=1)
        emulator.restart_be()  # in-flight loads die with it; their txns are aborted
        assert proc.wait(timeout=300) == 0, pipeline.log_tail(0)
    finally:
        pipeline.kill(proc)
    assert faults.http_5xx.fired == 4 and faults.drop_connection_before.fired == 2 and faults.slow_response.fired == 1
    assert any(t["state"] == "ABORTED" for t in emulator.transactions(DB)), \
        "the slow answer should have failed its task, whose label was aborted and its rows written again"
    pipeline.verify_all()


@pytest.mark.extended  # CI: the same faults on every request in test_fault_sweep.py, without Spark
def test_commit_side_faults_and_an_emulator_restart_are_survived_exactly(tmp_path, kafka_broker, target, emulator):
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
    pipeline = make_pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", target)
    assert pipeline.run_driver(crash_at=f"after-writers-prepared@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    emulator.restart()
    pipeline.run_to_completion()
    fired = {name: getattr(faults, name).fired for name in faults.names()}
    assert fired["write_lock_timeout"] == 3 and fired["drop_connection_after_commit"] == 2, fired
    assert fired["publish_timeout"] == 2 and fired["drop_connection_before"] == 1, fired
    assert fired["http_5xx"] == 3 and fired["expire_prepared"] == 1, fired
    record, _, _ = pipeline.batch_state(3)
    group = [c.label for c in record.committables if (c.table, c.partition) == ("payments", 1)
             and label_parts(c.label)["write_pass"] == "0"]
    assert len(group) >= 1 and sorted(record.lost) == sorted(group), (record.lost, group)  # the whole group, replayed
    pipeline.verify_all()


# -- retried and speculative tasks ------------------------------------------------------------------------


def test_a_task_that_fails_after_precommitting_is_retried_exactly(tmp_path, kafka_broker, target, emulator):
    """Attempt 0 of partition 0 pre-commits its orders transaction, then its payments load fails at its end (its body
    cannot be sent again), and its own abort of orders fails too: Spark retries the task (local[2,3]); the driver
    commits attempt 1 and aborts attempt 0's txn. Speculation is on as well (Spark never launches copies on a single
    host; see the unit tests for duplicates)."""
    # Labels carry Spark's taskAttemptId, unknown beforehand: the first task of partition 0 to load is attempt 0.
    aimed = {"batch": str(CRASH_BATCH), "partition": "0", "write_pass": "0", "chunk": "0"}
    emulator.rules.append(Rule("fail_at_end", "stream_load", {**aimed, "table": "payments"}, times=1))
    emulator.rules.append(Rule("fail", "abort", {**aimed, "table": "orders"}, times=2))  # the task's own cleanup
    pipeline = make_pipeline(
        tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", target, options={"retries": 1},
        spark_conf={"spark.master": "local[2,3]", "spark.speculation": "true", "spark.speculation.interval": "100ms",
                    "spark.speculation.multiplier": "1.1", "spark.speculation.quantile": "0.25"},
    )
    pipeline.run_to_completion(first_run=0)
    assert [r.fired for r in emulator.rules] == [1, 2]  # the load (never sent again); the abort and its retry
    attempts = {int(m["task"]): t["state"] for t in batch_txns(emulator, CRASH_BATCH)
                if (m := label_parts(t["label"])) and m["chunk"] == "0" and m["table"] == "orders"
                and m["partition"] == "0"}
    first, retry = sorted(attempts)  # task attempt ids grow: the retry's is the larger
    assert attempts[first] == "ABORTED" and attempts[retry] == "VISIBLE", attempts
    pipeline.verify_all()
