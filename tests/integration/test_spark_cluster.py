"""Writers in tasks on a real two-host Spark cluster: a real speculative copy, then a lost executor.

A standalone master with workers on 127.0.0.2 and 127.0.0.3 (one core each), the packaged job into
the StarRocks emulator with Redis. Once the executors are warm, the emulator holds back the answer
to one prepare, so Spark launches a speculative copy of that task on the other host; the copy wins,
and the slow original's prepared transaction must be aborted, never committed. Two batches later an
executor is SIGKILLed at an instant drawn from a seed. The target must equal the source row by row.

The same run into ClickHouse over HTTP (the test front over the real engine, tests/support/doubles/clickhouse_front): the
executors on both hosts write one staging table per (table, task attempt); the front holds back the
answer to one prepare (its row count), the copy wins, the original's staging table is dropped and never
committed, then an executor dies mid-batch.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from streaming_sink.targets.clickhouse import LEDGER_TABLE
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.pipeline import DB, REPO, LocalPipeline
from tests.support.services._proc import wait_until
from tests.support.services.spark_cluster import executor_pids, standalone_cluster
from tests.support.targets.base import label_parts
from tests.support.targets.clickhouse import ClickHouseHttpAdapter
from tests.support.targets.starrocks import StarRocksAdapter

pytestmark = pytest.mark.slow

HELD_BACK_S = 15.0  # far beyond 1.5x the median task time, and under the client read timeout (20 s): no retry


def _attempts(emulator: StarRocksEmulator) -> dict[tuple, dict[int, set[str]]]:
    """(batch, table, partition, epoch, write pass) -> task attempt id -> states of its transactions."""
    attempts: dict[tuple, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for txn in emulator.transactions(DB):
        part = label_parts(txn["label"])
        assert part is not None, txn["label"]
        key = (part["batch"], part["table"], part["partition"], part["epoch"], part["write_pass"])
        attempts[key][int(part["task"])].add(txn["state"])
    return attempts


def _raced(emulator: StarRocksEmulator) -> dict[tuple, dict[int, set[str]]]:
    return {key: tasks for key, tasks in _attempts(emulator).items() if len(tasks) > 1}


def _cluster_pipeline(tmp_path: Path, kafka_broker, redis_server, master: str, adapter) -> LocalPipeline:
    pipeline = LocalPipeline(
        tmp_path / "job", kafka_broker, redis_server.url, topic=f"events-{tmp_path.name}",
        messages_per_partition=100,
        max_offsets_per_trigger=45,  # 300 messages over 3 partitions: 7 batches of 3 tasks
        adapter=adapter,
        spark_conf={
            "spark.master": master,
            "spark.executor.cores": "1",
            "spark.executor.memory": "768m",
            "spark.executorEnv.PYTHONPATH": str(REPO),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.task.maxFailures": "8",
            "spark.speculation": "true",
            "spark.speculation.interval": "100ms",
            "spark.speculation.quantile": "0.5",  # one of three tasks finished is enough to judge the others
            "spark.speculation.efficiency.enabled": "false",  # judge by run time alone
            "spark.locality.wait": "0",  # a copy does not wait for the executor its original holds
        },
    )
    pipeline.produce()
    return pipeline


def _kill_an_executor_in_the_next_batch(proc: subprocess.Popen) -> bool:
    """SIGKILL an executor at an instant drawn from the seed (mid-write, mid-commit, anywhere in the next batch);
    False if the job finished first."""
    executors = executor_pids()
    assert executors, "no executor is running on the cluster"
    try:
        proc.wait(timeout=random.Random(7).uniform(0.0, 1.0))
    except subprocess.TimeoutExpired:
        os.kill(executors[0], signal.SIGKILL)
        return True
    return False


def test_a_speculative_copy_and_a_lost_executor_leave_the_target_exact(tmp_path: Path, kafka_broker, redis_server) -> None:
    with StarRocksEmulator(tmp_path / "starrocks", password="cluster") as emulator, \
            standalone_cluster(tmp_path / "cluster") as master:
        pipeline = _cluster_pipeline(tmp_path, kafka_broker, redis_server, master, StarRocksAdapter(emulator, {}))
        proc = pipeline.start_driver(run=0)
        try:
            pipeline.wait_for_batches(proc, count=1)  # executors and their Python workers are up
            emulator.faults.slow_response.arm(times=1, op="prepare", seconds=HELD_BACK_S)
            wait_until(lambda: _raced(emulator) or proc.poll() is not None, timeout=120,
                       what="a second attempt of the task whose prepare is held")
            speculated = _raced(emulator)  # before any failure: only a speculative copy makes a second attempt
            assert speculated, f"Spark launched no speculative copy of the held task:\n{pipeline.log_tail(0)}"
            pipeline.wait_for_batches(proc, count=int(max(key[0] for key in speculated)) + 2)
            killed = _kill_an_executor_in_the_next_batch(proc)
            code = proc.wait(timeout=300)
        finally:
            pipeline.kill(proc)
        assert code == 0, f"driver exited {code}:\n{pipeline.log_tail(0)}"
        assert killed, "the job finished before the executor kill; the test proved nothing about it"
        assert emulator.faults.slow_response.fired == 1
        pipeline.verify()
        for key, tasks in _raced(emulator).items():  # one attempt's transaction is visible, every other one aborted
            states = sorted(state for states in tasks.values() for state in states)
            assert states.count("VISIBLE") == 1 and set(states) <= {"VISIBLE", "ABORTED"}, (key, dict(tasks))


# -- ClickHouse over HTTP ------------------------------------------------------------------------------------

_CREATE_STAGING = re.compile(rf"^CREATE TABLE `{DB}`\.`(?P<label>ss_\w+)` AS ")
_COUNT_STAGING = re.compile(rf"^SELECT count\(\) FROM `{DB}`\.`(?P<label>ss_\w+)`")


def _staging_attempts(front: ClickHouseFront) -> dict[tuple, dict[int, set[str]]]:
    """(batch, table, partition, epoch, write pass) -> task attempt id -> labels of its staging tables (as created)."""
    attempts: dict[tuple, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for statement in list(front.statements):
        created = _CREATE_STAGING.match(statement)
        if created:
            part = label_parts(created["label"])
            assert part is not None, created["label"]
            attempts[(part["batch"], part["table"], part["partition"], part["epoch"], part["write_pass"])][int(part["task"])].add(
                created["label"])
    return attempts


def _staging_raced(front: ClickHouseFront) -> dict[tuple, dict[int, set[str]]]:
    return {key: tasks for key, tasks in _staging_attempts(front).items() if len(tasks) > 1}


# Extended: CI has the cluster proof on StarRocks (above) and ClickHouse-over-HTTP's task deaths and speculative twins
# in local mode (test_exactly_once_clickhouse_http.py); this is both together on the real cluster.
@pytest.mark.extended
def test_clickhouse_over_http_a_speculative_copy_and_a_lost_executor_leave_the_target_exact(
    tmp_path: Path, kafka_broker, redis_server
) -> None:
    with ClickHouseFront(tmp_path / "clickhouse") as front, standalone_cluster(tmp_path / "cluster") as master:
        # the client must not give up on the held answer: the copy, not a retry, makes the second attempt
        adapter = ClickHouseHttpAdapter(front, {"read_timeout_s": 2 * HELD_BACK_S})
        pipeline = _cluster_pipeline(tmp_path, kafka_broker, redis_server, master, adapter)
        ledger_rows = f"`{DB}`.`{LEDGER_TABLE}`"

        def a_prepare_count(statement: str) -> bool:
            """A writer's row count of its staging table (prepare), not the driver's count during a commit."""
            counted = _COUNT_STAGING.match(statement)
            return counted is not None and not any(
                ledger_rows in done and counted["label"] in done for done in list(front.statements))

        proc = pipeline.start_driver(run=0)
        try:
            pipeline.wait_for_batches(proc, count=1)  # executors and their Python workers are up
            front.faults.delay.arm(a_prepare_count, times=1, seconds=HELD_BACK_S)  # applied, the answer held
            wait_until(lambda: _staging_raced(front) or proc.poll() is not None, timeout=120,
                       what="a second attempt of the task whose prepare is held")
            speculated = _staging_raced(front)  # before any failure: only a speculative copy makes a second attempt
            assert speculated, f"Spark launched no speculative copy of the held task:\n{pipeline.log_tail(0)}"
            pipeline.wait_for_batches(proc, count=int(max(key[0] for key in speculated)) + 2)
            killed = _kill_an_executor_in_the_next_batch(proc)
            code = proc.wait(timeout=300)
        finally:
            front.faults.release()
            pipeline.kill(proc)
        assert code == 0, f"driver exited {code}:\n{pipeline.log_tail(0)}"
        assert killed, "the job finished before the executor kill; the test proved nothing about it"
        assert front.faults.delay.fired == 1
        pipeline.verify()  # exact, no staging table left, every commit the ledger began finished
        ledger = adapter.ledger(DB)
        for key, tasks in _staging_raced(front).items():  # exactly one attempt of each raced writer was committed
            committed = [task for task, labels in tasks.items() if any(label in ledger for label in labels)]
            assert len(committed) == 1, (key, dict(tasks), committed)
