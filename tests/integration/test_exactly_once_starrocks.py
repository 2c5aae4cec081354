"""Exactly-once from a real Kafka topic, through Spark tasks, into the StarRocks emulator: its own scenarios.

The kills at every protocol point and at random instants are the shared matrix's
(test_exactly_once_matrix.py, on `StarRocksAdapter`); these are the faults only StarRocks has.

Real Kafka (3 partitions) -> the packaged job in a child process (local Spark, 2 cores, retries
allowed: `local[2,3]`; the writers run in the tasks) -> the StarRocks emulator running in this
process, reached over loopback with a password -> the Redis state store.

Every test ends with `verify()`: both tables equal the source row by row (count and checksum), no
transaction is left PREPARE/PREPARED, no label was committed twice, no intent is left, every batch
record is COMMITTED. Faults are armed on the emulator's knobs and each test asserts its knobs
fired, so a knob that never triggers cannot pass silently.
"""
from __future__ import annotations

import re
import signal

import pytest

from streaming_sink.records import BatchState
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.pipeline import DB, TABLES
from tests.support.targets.base import label_parts
from tests.support.targets.starrocks import DIE_AFTER_PREPARE, PASSWORD, TWIN, StarRocksAdapter

pytestmark = pytest.mark.slow

CRASH_BATCH = 2


target = pytest.fixture(StarRocksAdapter.for_test)


@pytest.fixture
def emulator(target: StarRocksAdapter) -> StarRocksEmulator:
    return target.emulator


@pytest.mark.extended  # CI: the same faults on every request in test_fault_sweep.py, without Spark
def test_commit_faults_resolve_through_the_label_state(tmp_path, kafka_broker, redis_server, target, emulator):
    """publish timeout (FAILED, yet committed), write-lock timeout (stays PREPARED), an answer lost
    after the commit applied, a 5xx: each commit ends COMMITTED exactly once."""
    faults = emulator.faults
    faults.publish_timeout.arm(times=2, op="commit", role="fe")
    faults.write_lock_timeout.arm(times=3, op="commit", role="fe")
    faults.drop_connection_after_commit.arm(times=2, op="commit", role="fe")
    faults.http_5xx.arm(times=1, op="commit", role="fe", status=503)
    scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url)
    scenario.run_to_completion(first_run=0)
    scenario.verify()
    for knob in ("publish_timeout", "write_lock_timeout", "drop_connection_after_commit", "http_5xx"):
        assert getattr(faults, knob).fired >= 1, f"knob {knob} never fired"


@pytest.mark.extended  # CI: the same faults on every request in test_fault_sweep.py, without Spark
def test_data_phase_faults_are_retried_or_fail_the_task(tmp_path, kafka_broker, redis_server, target, emulator):
    """Busy labels, FE routing misses, connections cut before the server acts, 5xx, a slow prepare
    whose answer comes after the client gave up, a BE restart that loses every open transaction:
    retried where that is safe, otherwise the task fails, rolls back, and Spark retries it under a
    new label."""
    faults = emulator.faults
    faults.txn_in_processing.arm(times=2, op="load")
    faults.txn_in_processing.arm(times=2, op="prepare")
    faults.fe_cache_loss.arm(times=1, op="load")
    faults.fe_cache_loss.arm(times=1, op="prepare")
    faults.drop_connection_before.arm(times=1, op="begin", role="fe")
    faults.http_5xx.arm(times=1, op="begin", role="be", status=502)
    faults.http_5xx.arm(times=1, op="load", role="be", status=500)  # load outcome unknown: the task fails
    faults.slow_response.arm(times=1, op="prepare", role="be", seconds=30)  # longer than read_timeout
    faults.restart_be.arm(times=1, op="load", role="be")  # every open transaction loses its BE context
    scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url, options={"read_timeout": 2.0})
    try:
        scenario.run_to_completion(first_run=0)
    finally:
        faults.release()
    scenario.verify()
    for knob in ("txn_in_processing", "fe_cache_loss", "drop_connection_before", "http_5xx", "slow_response", "restart_be"):
        assert getattr(faults, knob).fired >= 1, f"knob {knob} never fired"
    assert "TargetError" in scenario.log_tail(0, lines=100_000), "the 5xx on a load should have failed a task"
    aborted = [t for t in emulator.transactions(DB) if t["state"] == "ABORTED"]
    assert aborted, "the transactions of the failed task attempts should have been rolled back"


def test_task_dying_after_prepare_and_a_speculative_twin_leave_no_duplicates(
    tmp_path, kafka_broker, redis_server, target, emulator
):
    scenario = target.pipeline(
        tmp_path, kafka_broker, redis_server.url,
        spark_conf={"spark.speculation": "true"},
        driver_env={DIE_AFTER_PREPARE: f"{CRASH_BATCH}:0", TWIN: "1:1"},
    )
    scenario.run_to_completion(first_run=0)
    scenario.verify()
    log = scenario.log_tail(0, lines=100_000)
    assert "test hook: Python worker dies after prepare" in log
    query_id = next(iter(scenario.query_ids()))
    store = scenario.store()
    died = store.get_batch(scenario.job_id, query_id, CRASH_BATCH)
    twin_batch = store.get_batch(scenario.job_id, query_id, 1)
    assert not any(c.label.endswith("_twin") for c in twin_batch.committables)
    states = {t["label"]: t["state"] for t in emulator.transactions(DB)}
    twins = [label for label in states if label.endswith("_twin")]
    assert twins and all(states[label] == "ABORTED" for label in twins), states
    # labels carry Spark's taskAttemptId, which grows: the dead first attempt has the smallest
    partition0 = [label for label in states if f"_{CRASH_BATCH}_" in label and "_p0_" in label and not label.endswith("_twin")]
    first = min(_task_attempt(label) for label in partition0)
    assert first not in {_task_attempt(c.label) for c in died.committables if c.partition == 0}, "the retry's transactions win"
    losers = [label for label in partition0 if _task_attempt(label) == first]
    assert losers and all(states[label] == "ABORTED" for label in losers), "the dead attempt's prepared txns are aborted"


def _task_attempt(label: str) -> int:
    parts = label_parts(label)
    assert parts is not None, label
    return int(parts["task"])


def test_prepared_transactions_that_expire_while_the_driver_is_down_are_replayed(
    tmp_path, kafka_broker, redis_server, target, emulator
):
    scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url, options={"prepared_timeout": 300})
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    emulator.clock.advance(301)  # the driver stays down longer than prepared_timeout
    expired = {t["label"] for t in emulator.transactions(DB) if t["reason"] == "timeout by txn manager"}
    assert {c.label for c in record.committables} <= expired
    scenario.run_to_completion()
    scenario.verify()
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    assert sorted(record.lost) == sorted(c.label for c in record.committables if c.label in expired)
    assert any("replayed" in event for event in record.events), record.events


@pytest.mark.extended  # CI: the simulation's expired batches that cannot be replayed (ReplayImpossibleError judged)
def test_expired_batch_that_the_source_will_not_replay_fails_loudly(tmp_path, kafka_broker, redis_server, target, emulator):
    """A new checkpoint means Spark never re-runs the PREPARED batch, whose data expired: stop, name the runbook."""
    scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url, options={"prepared_timeout": 300})
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    (old_query,) = scenario.query_ids()
    emulator.clock.advance(301)
    visible_before = {t: emulator.visible_rows(DB, t) for t in TABLES}
    scenario.checkpoint_name = "checkpoint-new"  # the operator started over on a fresh checkpoint
    scenario.write_spec()
    code = scenario.run_driver(run=1)
    log = scenario.log_tail(1, lines=100_000)
    assert code not in (0, -signal.SIGKILL), f"the driver should fail loudly, exited {code}"
    assert "ReplayImpossibleError" in log, log[-3000:]
    assert re.search(r"docs/runbook\.md, section 'Prepared data lost outside its batch'", log), log[-3000:]
    record, _, _ = scenario.batch_state(CRASH_BATCH, query_id=old_query)
    assert record.state is BatchState.PREPARED, "the record of the lost batch must stay for the operator"
    for table in TABLES:  # nothing new was loaded, nothing duplicated: the failure came before any write
        assert emulator.visible_rows(DB, table) == visible_before[table]
        assert len(set(visible_before[table])) == len(visible_before[table])
    assert target.open_labels() == []


@pytest.mark.extended  # CI: wiped stores in test_checkpoint_findings_e2e.py and the simulation's store wipes
def test_a_state_store_wiped_mid_commit_stops_the_job_loudly_and_loads_nothing_twice(
    tmp_path, kafka_broker, redis_server, target
):
    """R2: batch 2 is PREPARED and one transaction committed when Redis loses everything (a restart
    without AOF). Spark re-runs batch 2; rewriting it would load the committed part twice."""
    scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url, options={"commit_parallelism": 1}, max_offsets_per_trigger=30)
    code = scenario.run_driver(crash_at="after-first-commit@2", run=0)
    assert code == -signal.SIGKILL, scenario.log_tail(0)
    visible = {table: scenario.adapter.rows(DB, table) for table in ("orders", "payments")}
    redis_server.client().flushall()  # the store restarted empty
    code = scenario.run_driver(run=1)
    assert code != 0, f"the driver should have refused to write on a wiped store:\n{scenario.log_tail(1)}"
    log = scenario.log_tail(1, lines=100_000)
    assert "StateStoreLostError" in log and "the checkpoint says batch 2" in log and "was PREPARED" in log, log[-3000:]
    for table, rows in visible.items():
        assert scenario.adapter.rows(DB, table) == rows, f"{table} changed after the store was wiped"


class _SmallLabelMemory(StarRocksAdapter):
    """label_keep_max_num 4 (running and finished counted, as StarRocks does): each batch (2 tables x 3 writers = 6
    transactions) is larger than the server's label memory, so it forgets its own first labels while it commits."""

    @classmethod
    def new_emulator(cls, root):
        return StarRocksEmulator(root / "starrocks", password=PASSWORD, label_keep_max_num=4)


@pytest.mark.extended  # CI: the simulation's schedules with a label memory smaller than a batch (tests/sim)
def test_a_kill_in_the_commit_phase_of_a_batch_larger_than_the_label_memory_ends_exact(tmp_path, kafka_broker, redis_server):
    """The driver dies after the first commit of batch 2 is recorded done; by the restart the server has forgotten
    that label (4 transactions kept, 6 in the batch). The restart commits the rest (still PREPARED, so remembered)
    and skips the one recorded done: exact, not a duplicate and not a stop."""
    with _SmallLabelMemory.started(tmp_path) as target:
        scenario = target.pipeline(tmp_path, kafka_broker, redis_server.url, options={"commit_parallelism": 1})
        assert scenario.run_driver(crash_at=f"after-first-commit@{CRASH_BATCH}", run=0) == -signal.SIGKILL
        record, _, _ = scenario.batch_state(CRASH_BATCH)
        forgotten = {t["label"] for t in target.emulator.transactions(DB) if t["evicted"]}
        assert forgotten & {c.label for c in record.committables}, "no label of the batch was forgotten: nothing proved"
        scenario.run_to_completion(first_run=1)
        scenario.verify()
