"""A timestamp in a message loads as written, whatever the machine's time zone: the packaged job parses JSON
timestamps in UTC (Spark's session time zone), not in the JVM's default zone, which would shift every zone-less
value by the machine's offset as it is stored (the target's columns hold UTC instants)."""
from __future__ import annotations

import json

import pytest

from tests.support.jobs import DEAD_LETTERS, ConfigJob, job_toml, local_spark

pytestmark = pytest.mark.slow


def _without_a_session_zone() -> dict:
    """The tests' Spark conf names UTC as the session zone; a user's job.toml usually names none."""
    spark = local_spark()
    del spark["conf"]["spark.sql.session.timeZone"]
    return spark


def test_a_zone_less_timestamp_loads_as_written_on_a_machine_outside_utc(tmp_path, kafka_broker):
    topic = f"tz-{tmp_path.name[-10:]}"
    job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, topic, env={"TZ": "Asia/Tokyo"})
    job.config_path.write_text(job_toml(
        job_id="demo-ingest", data_dir="data", kafka={"bootstrap_servers": kafka_broker.bootstrap, "topics": [topic]},
        routing={"table": "events"}, tables={"events": {"schema": "id INT NOT NULL, at TIMESTAMP, day DATE"}},
        dead_letters={"table": DEAD_LETTERS}, sink={"metadata_columns": False}, spark=_without_a_session_zone()))
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [json.dumps({"id": 1, "at": "2026-01-02 03:04:05", "day": "2026-01-02"}),
                                 json.dumps({"id": 2, "at": "2026-01-02T03:04:05Z", "day": "2026-01-02"}),
                                 json.dumps({"id": 3, "at": "2026-01-02T12:04:05+09:00", "day": "2026-01-02"})],
                         partition=0)
    assert job.run(0) == 0, job.log_tail(0)
    assert sorted(job.read_embedded("events", "id, toString(at, 'UTC'), toString(day)")) == [
        (1, "2026-01-02 03:04:05.000000", "2026-01-02"), (2, "2026-01-02 03:04:05.000000", "2026-01-02"),
        (3, "2026-01-02 03:04:05.000000", "2026-01-02")]
    assert job.read_embedded(DEAD_LETTERS, "reason") == []
