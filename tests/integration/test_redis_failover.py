"""A Sentinel failover under a running job: the journal writes wait for the replica, so the promoted one has every
step the driver acted on and the job ends exact; without the waits, the rolled-back journal is detected and the
job stops loudly, with nothing written twice. Real Kafka, the packaged job, ClickHouse on chdb, and a primary,
a replica and three Sentinels from Debian's redis-server (tests.support.services.redis.RedisSentinelGroup)."""
from __future__ import annotations

import random
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.crash import kill_seeds
from tests.support.pipeline import DB, TABLES, LocalPipeline
from tests.support.services.redis import RedisSentinelGroup

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[RedisSentinelGroup]:
    with RedisSentinelGroup(tmp_path / "sentinels") as group:
        yield group


def _fail_over(sentinels: RedisSentinelGroup) -> None:
    """Kill the master, wait for the Sentinels to promote the replica, start the old master again as its replica."""
    old = sentinels.kill_primary()
    sentinels.promoted(old)
    sentinels.rejoin(old)


@pytest.mark.extended  # heavy (Kafka, Spark, a failover): its sibling in CI is test_redis_ride_through.py
def test_the_driver_rides_a_failover_without_a_restart(sentinels, tmp_path, kafka_broker):
    """Issue 38 item 7, through the packaged job: the master is killed while the job runs; the same driver follows the
    Sentinels to the promoted replica, waits (its writes wait for a replica) until the old master is back as that
    one's replica, and finishes the topic with exit 0, exact. It used to stop with StateStoreUnreachableError."""
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"{sentinels.url}?failover_timeout=120", messages_per_partition=150,
                             max_offsets_per_trigger=50)  # 9 batches: the failover comes after the second
    pipeline.produce()
    driver = pipeline.start_driver(run=0)
    try:
        pipeline.wait_for_batches(driver, count=2)
        assert driver.poll() is None, f"the job ended before the failover; the test proved nothing:\n{pipeline.log_tail(0)}"
        _fail_over(sentinels)
        assert driver.wait(timeout=300) == 0, pipeline.log_tail(0, 200)
    finally:
        pipeline.kill(driver)
    assert "trying again for up to 120 s" in pipeline.log_tail(0, 5000), "the job never met the failover"
    pipeline.verify()


@pytest.mark.extended
@pytest.mark.parametrize("seed", kill_seeds())
def test_the_master_killed_at_random_instants_fails_over_and_the_job_ends_exact(sentinels, seed, tmp_path,
                                                                               kafka_broker):
    # many small batches: the job must still run when the kill instant comes (up to 4 s after a batch commits); with
    # six batches of 150 a faster job ended before it and the test proved nothing
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"{sentinels.url}?failover_timeout=120", messages_per_partition=150,
                             max_offsets_per_trigger=50)  # 9 batches: the failover comes after the second
    pipeline.produce()
    rng, failovers = random.Random(seed), 0
    for run in range(3):
        driver = pipeline.start_driver(run=run)
        pipeline.wait_for_batches(driver, count=run + 1)
        try:
            driver.wait(timeout=rng.uniform(0.0, 4.0))  # the kill instant, drawn from the seed
        except subprocess.TimeoutExpired:
            _fail_over(sentinels)
            failovers += 1
        if driver.wait(timeout=300) == 0:  # it rode through the failover, or stopped on it and runs again
            break
    assert failovers >= 1, "the random instants never hit a running job; the test proved nothing"
    pipeline.run_to_completion(first_run=10)
    pipeline.verify()


# Both run in the extended suite. CI proves waiting (`1`) in process, with the real sink on the same Sentinels
# (test_redis_ride_through.py: a PREPARED record only the dead master had), and the detection without waits (`0`) with
# the wiped-store tests (test_exactly_once_starrocks.py, test_checkpoint_findings_e2e.py).
@pytest.mark.extended
@pytest.mark.parametrize("waits", ["1", "0"])
def test_a_write_only_the_old_master_had(sentinels, waits, tmp_path, kafka_broker):
    """After batch 1 the replica is paused until the master drops it; the driver goes on into batch 2; the master
    dies; the replica resumes and is promoted. Waiting for the replica (`1`), the driver could not act on any write
    the replica lacked: its first one failed, and the job ends exact. Without waits (`0`), it committed part of
    batch 2 on a journal the failover then rolled back: the restarted job detects that and stops, with no row
    written twice."""
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"{sentinels.url}?wait_replicas={waits}&wait_timeout=2")
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-committed-record@1", run=0) < 0
    sentinels.wait_in_sync(sentinels.master())
    replica = sentinels.detach_replica()
    code = pipeline.run_driver(crash_at="after-first-commit@2", run=1)
    if waits == "1":
        assert code == 1 and "ReplicationError" in pipeline.log_tail(1, 200), pipeline.log_tail(1)
    else:
        assert code < 0, f"run 1 should have died in batch 2's commits:\n{pipeline.log_tail(1)}"
    old = sentinels.kill_primary()
    replica.resume()
    assert sentinels.promoted(old) is replica
    sentinels.rejoin(old)

    if waits == "1":
        pipeline.run_to_completion(first_run=2)
        pipeline.verify()
        return
    code = pipeline.run_driver(run=2)
    assert code != 0 and "StateStoreLostError" in pipeline.log_tail(2, 400), pipeline.log_tail(2)
    for table in TABLES:
        rows = pipeline.adapter.rows(DB, table)
        twice = [row for row, count in Counter(rows).items() if count > 1]
        assert not twice, f"{table}: rows written twice after the rollback: {twice[:3]}"
        assert set(rows) <= set(pipeline.source[table])
