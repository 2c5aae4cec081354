"""`streaming-sink doctor` gives a verdict per check, and fails the ones that are wrong."""
from __future__ import annotations

import json
import subprocess
import sys

from devstack.pipeline import open_target

DB = "analytics"


def write_config(tmp_path, bootstrap: str, topic: str, extra: str = "") -> str:
    path = tmp_path / "job.toml"
    path.write_text(f"""
job_id = "doc"
[kafka]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
[routing]
table = "orders"
[tables.orders]
schema = "id BIGINT NOT NULL, name STRING"
[target]
url = "chdb://{tmp_path / 'ch'}"
database = "{DB}"
[state]
url = "file://{tmp_path / 'state'}"
{extra}
""")
    return str(path)


def doctor(config: str, tolerance: str) -> tuple[int, dict[str, dict]]:
    proc = subprocess.run([sys.executable, "-m", "streaming_sink.cli", "doctor", "--config", config,
                           "--outage-tolerance", tolerance, "--json"], capture_output=True, text=True, timeout=180)
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)}


def test_doctor_verdicts(tmp_path, kafka_broker, new_topic):
    topic = new_topic(partitions=1)
    with open_target(tmp_path / "ch", DB) as target:
        client = target.client()
        client.command(f"CREATE DATABASE {DB}")
        client.command(f"CREATE TABLE {DB}.orders (id Int64, name Nullable(String), kafka_partition Int32, "
                       "kafka_offset Int64) ENGINE = MergeTree ORDER BY id")
    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, topic), "6 hours")
    assert code == 0, checks
    assert {name: c["verdict"] for name, c in checks.items()} == {
        "kafka": "OK", "state store": "OK", "target": "OK", "tables": "OK",
        "timeout commit ledger": "OK", "timeout prepared staging tables": "OK",
    }

    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, "no-such-topic"), "60 days")
    assert code == 1
    assert checks["kafka"]["verdict"] == "FAIL" and "['no-such-topic'] do not exist" in checks["kafka"]["detail"]
    assert checks["timeout commit ledger"]["verdict"] == "FAIL" and "shorter than the planned outage" in checks["timeout commit ledger"]["detail"]

    with open_target(tmp_path / "ch", DB) as target:
        target.client().command(f"ALTER TABLE {DB}.orders DROP COLUMN name")
    code, checks = doctor(write_config(tmp_path, kafka_broker.bootstrap, topic), "1 hour")
    assert code == 1 and checks["tables"]["verdict"] == "FAIL"
    assert "table 'orders' has no column(s) ['name']" in checks["tables"]["detail"]
