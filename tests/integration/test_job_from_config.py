"""The packaged job from a TOML file, good and bad messages mixed, killed and restarted: exact."""
from __future__ import annotations

import signal

import pytest

from tests.support.jobs import DEAD_LETTERS, ConfigJob

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


def test_into_starrocks_with_redis_through_a_kill(tmp_path, kafka_broker, redis_server):
    from streaming_sink.targets import PASSWORD_ENV, USER_ENV
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    columns = {
        "orders": [("id", "BIGINT"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"), ("kafka_offset", "BIGINT")],
        "payments": [("id", "BIGINT"), ("method", "VARCHAR(64)"), ("amount", "DOUBLE"), ("kafka_partition", "INT"),
                     ("kafka_offset", "BIGINT")],
        DEAD_LETTERS: [("raw_value", "VARCHAR(1024)"), ("topic", "VARCHAR(256)"), ("partition", "INT"), ("offset", "BIGINT"),
                       ("kafka_timestamp", "DATETIME"), ("reason", "VARCHAR(256)")],
    }
    with StarRocksEmulator(tmp_path / "starrocks", password="s3cret") as emulator:
        emulator.create_database("analytics")
        for table, cols in columns.items():
            emulator.create_table("analytics", table, cols)
        target = {"url": f"starrocks://127.0.0.1:{emulator.fe_port}", "database": "analytics",
                  "options": {"tables": ["orders", "payments", DEAD_LETTERS], "backoff_s": 0.05}}
        job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, f"events-{tmp_path.name}", messages_per_partition=300,
                        max_offsets_per_trigger=300, target=target, state=redis_server.url,
                        env={USER_ENV: "root", PASSWORD_ENV: "s3cret"})
        job.produce(kafka_broker)
        assert job.run(0, crash_at="after-first-commit@1") == -signal.SIGKILL, job.log_tail(0)
        assert job.run(1) == 0, job.log_tail(1)

        def read(table: str, wanted: str) -> list[tuple]:
            names = [name for name, _ in columns[table]]
            picks = [names.index(name.strip()) for name in wanted.split(",")]
            return [tuple(row[i] for i in picks) for row in emulator.visible_rows("analytics", table)]

        job.verify(read)
        assert not [t for t in emulator.transactions("analytics") if t["state"] in ("PREPARE", "PREPARED")]
