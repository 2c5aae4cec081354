"""The packaged job from a TOML file, good and bad messages mixed, killed and restarted: exact."""
from __future__ import annotations

import signal

import pytest

from devstack.config_job import DEAD_LETTERS, ConfigJob

pytestmark = pytest.mark.slow


def test_embedded_defaults_with_dead_letters_through_a_kill(tmp_path, kafka_broker):
    job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, f"events-{tmp_path.name}", messages_per_partition=400,
                    max_offsets_per_trigger=300)
    job.produce(kafka_broker)
    assert job.run(0, crash_at="after-prepared-record@2") == -signal.SIGKILL, job.log_tail(0)
    record, done = job.batch(2)
    assert record.state.value == "PREPARED" and not done
    assert job.run(1) == 0, job.log_tail(1)
    report = job.verify()
    assert report[DEAD_LETTERS][0] == len(job.expected[DEAD_LETTERS]) > 0
    assert sum(rows for rows, _ in report.values()) == 3 * 400
