"""Exactly-once from a real Kafka topic into ClickHouse (chdb): what only ClickHouse has.

The kills at every protocol point (on the file and the Redis store, Redis restarted after the
commit point) and at random instants are the shared matrix's (test_exactly_once_matrix.py, on
`ClickHouseAdapter`). The test ends with `verify()`: both tables equal the source row by row
(count and order-independent checksum), no staging table and no intent is left, every batch is COMMITTED.
"""
from __future__ import annotations

import signal

import pytest

from tests.support.pipeline import DB, open_target
from tests.support.targets.clickhouse import ClickHouseAdapter

pytestmark = pytest.mark.slow

CRASH_BATCH = 2


@pytest.mark.extended  # CI: the same loss over HTTP, replayed by the tasks (test_exactly_once_clickhouse_http.py)
def test_lost_staging_is_replayed_from_the_rerun_batch(tmp_path, kafka_broker):
    """A prepared part that can no longer be committed is loaded again from the re-run batch, exactly."""
    scenario = ClickHouseAdapter().pipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}")
    assert scenario.run_driver(crash_at=f"after-prepared-record@{CRASH_BATCH}", run=0) == -signal.SIGKILL
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    victim = record.committables[0]
    with open_target(scenario.chdb_path, DB) as target:
        target.client().command(f"DROP TABLE {DB}.`{victim.label}`")  # the prepared part is gone
    scenario.run_to_completion()
    scenario.verify()
    record, _, _ = scenario.batch_state(CRASH_BATCH)
    assert record.lost == [victim.label]
    assert any("replayed 1 lost" in event for event in record.events)
