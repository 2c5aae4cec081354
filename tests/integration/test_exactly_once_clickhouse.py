"""Exactly-once from a real Kafka topic into ClickHouse (chdb), through kill -9 of the driver.

Every test ends with `Scenario.verify()`: both tables equal the source row by row (count and
order-independent checksum), no staging table and no intent is left, every batch is COMMITTED.
"""
from __future__ import annotations

import random
import signal

import pytest

from streaming_sink.committable import BatchState
from streaming_sink.crash import POINTS
from devstack.pipeline import LocalPipeline as Scenario
from tests.integration.exactly_once import assert_stopped_at, kill_seeds

pytestmark = pytest.mark.slow

CRASH_BATCH = 2


def _state_url(kind: str, request, tmp_path) -> str:
    if kind == "file":
        return f"file://{tmp_path / 'state'}"
    return request.getfixturevalue("redis_server").url


# Each protocol point once, the two stores taking turns: both keep one contract (tests/integration/test_state_store.py),
# and every point is also killed on Redis in the StarRocks and Doris matrices.
POINTS_AND_STORES = [(point, "file" if i % 2 == 0 else "redis") for i, point in enumerate(POINTS)]


def _scenario(tmp_path, kafka_broker, state_url) -> Scenario:
    scenario = Scenario(tmp_path, kafka_broker, state_url)
    scenario.produce()
    return scenario


@pytest.mark.parametrize("point, store", POINTS_AND_STORES)
def test_kill_at_each_protocol_point_then_restart_is_exact(point, store, tmp_path, kafka_broker, request):
    scenario = _scenario(tmp_path, kafka_broker, _state_url(store, request, tmp_path))
    code = scenario.run_driver(crash_at=f"{point}@{CRASH_BATCH}", run=0)
    assert code == -signal.SIGKILL, f"driver should have been killed at {point}, exited {code}:\n{scenario.log_tail(0)}"
    assert_stopped_at(scenario, point, CRASH_BATCH)
    scenario.run_to_completion()
    scenario.verify()


@pytest.mark.parametrize("seed", kill_seeds())
def test_kill_at_random_instants_is_exact(seed, tmp_path, kafka_broker, request):
    rng = random.Random(seed)
    scenario = _scenario(tmp_path, kafka_broker, _state_url("redis" if seed % 2 else "file", request, tmp_path))
    killed = scenario.kill_at_random_instants(rng, runs=3, max_wait_s=3.0)
    assert killed >= 1, "the random instants never hit a running driver; the test proved nothing"
    scenario.run_to_completion(first_run=10)
    scenario.verify()


def test_redis_restart_keeps_the_commit_point(tmp_path, kafka_broker, redis_server):
    scenario = _scenario(tmp_path, kafka_broker, redis_server.url)
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    redis_server.restart()  # AOF: the PREPARED record and intents must survive
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    assert record is not None and record.state is BatchState.PREPARED
    scenario.run_to_completion()
    scenario.verify()


def test_lost_staging_is_replayed_from_the_rerun_batch(tmp_path, kafka_broker):
    """A prepared part that can no longer be committed is loaded again from the re-run batch, exactly."""
    scenario = _scenario(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}")
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    victim = record.committables[0]
    from devstack.pipeline import open_target
    from devstack.pipeline import DB

    with open_target(scenario.chdb_path, DB) as target:
        target.client().command(f"DROP TABLE {DB}.`{victim.label}`")  # the prepared part is gone
    scenario.run_to_completion()
    scenario.verify()
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    assert record.lost == [victim.label]
    assert any("replayed 1 lost" in event for event in record.events)
