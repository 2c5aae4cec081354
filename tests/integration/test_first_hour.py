"""A new user's first hour (issue 25, review 2026-11-24 §1-§3), through the installed `streaming-sink` command:
doctor agrees with run on the embedded defaults, a misspelt Kafka consumer setting is refused before any data
moves, and every failure a user meets ends in one line and a documented exit code, never a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming_sink.errors import ExitCode
from streaming_sink.kafka_source import KafkaSource, probe
from streaming_sink.targets.base import ConfigurationError

CLI = Path(sys.executable).parent / "streaming-sink"


def embedded_config(tmp_path: Path, bootstrap: str, topic: str, extra: str = "") -> Path:
    """The README's first configuration: no [target], no [state], so the embedded defaults create the tables."""
    path = tmp_path / "job.toml"
    path.write_text(f"""
job_id = "first-hour"
[kafka]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
[routing]
field = "table"
[tables.orders]
schema = "id BIGINT NOT NULL, name STRING"
[tables.payments]
schema = "id BIGINT NOT NULL, amount DOUBLE"
[dead_letters]
table = "dead_letters"
[trigger]
interval = "available-now"
{extra}
""")
    return path


def streaming_sink(*argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STREAMING_SINK_")}
    return subprocess.run([str(CLI), *argv], cwd=cwd, env={**environment, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line(proc: subprocess.CompletedProcess[str], code: ExitCode, *words: str) -> str:
    """No traceback; the last line of stderr is the command's own, with what failed and what to check."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("streaming-sink"), proc.stderr[-3000:]
    for word in words:
        assert word in last, last
    return last


def test_doctor_reports_the_tables_run_will_create_and_creates_none(tmp_path, kafka_broker, new_topic):
    config = embedded_config(tmp_path, kafka_broker.bootstrap, new_topic())
    proc = streaming_sink("doctor", "--config", str(config), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["tables"]["verdict"] == "OK", checks["tables"]
    assert checks["tables"]["detail"] == ("table(s) ['dead_letters', 'orders', 'payments'] do not exist yet: `run` "
                                          "creates them from the job's schemas (target.create_tables)")
    from devstack.pipeline import open_target

    with open_target(tmp_path / "data" / "first-hour" / "clickhouse", "default") as target:  # doctor only reads
        tables = {name for (name,) in target.client().query("SHOW TABLES FROM default").result_rows}
        assert not tables & {"orders", "payments", "dead_letters"}, tables  # (the target's own ledger aside)


def test_a_misspelt_kafka_consumer_setting_is_refused_with_the_right_name(spark_session):
    """The names come from the consumer Spark runs (ConsumerConfig.configNames()), checked before the brokers are."""
    typo = KafkaSource("127.0.0.1:9", ["t"], options={"kafka.security.protocl": "SASL_SSL"})
    with pytest.raises(ConfigurationError) as error:
        probe(spark_session, typo, timeout_s=1)
    assert str(error.value) == ('kafka.options."kafka.security.protocl" is not a Kafka consumer setting '
                                '(did you mean "kafka.security.protocol"?); Kafka would ignore it')

