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
    from tests.support.pipeline import open_target

    with open_target(tmp_path / "data" / "first-hour" / "clickhouse", "default") as target:  # doctor only reads
        tables = {name for (name,) in target.client().query("SHOW TABLES FROM default").result_rows}
        assert not tables & {"orders", "payments", "dead_letters"}, tables  # (the target's own ledger aside)


def test_doctor_reports_the_database_run_will_create(tmp_path, kafka_broker, new_topic):
    """A database of its own that does not exist yet: `run` creates it with the tables, so doctor does not fail it."""
    target = f'[target]\nurl = "chdb://{tmp_path / "ch"}"\ndatabase = "analytics"\ncreate_tables = true'
    config = embedded_config(tmp_path, kafka_broker.bootstrap, new_topic(), target)
    proc = streaming_sink("doctor", "--config", str(config), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["target"]["verdict"] == "OK"
    assert checks["target"]["detail"].endswith("database 'analytics': reachable; the database does not exist yet: "
                                               "`run` creates it (target.create_tables)")
    assert checks["tables"]["detail"].startswith("table(s) ['dead_letters', 'orders', 'payments'] do not exist yet")

    without = config.read_text().replace("create_tables = true", "create_tables = false")
    config.write_text(without)
    proc = streaming_sink("doctor", "--config", str(config), "--json", cwd=tmp_path)
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert proc.returncode == 1 and checks["target"]["verdict"] == "FAIL"
    assert "UnknownDatabaseError: ClickHouse database 'analytics' does not exist" in checks["target"]["detail"]


def test_a_misspelt_kafka_consumer_setting_is_refused_with_the_right_name(spark_session):
    """The names come from the consumer Spark runs (ConsumerConfig.configNames()), checked before the brokers are."""
    typo = KafkaSource("127.0.0.1:9", ["t"], options={"kafka.security.protocl": "SASL_SSL"})
    with pytest.raises(ConfigurationError) as error:
        probe(spark_session, typo, timeout_s=1)
    assert str(error.value) == ('kafka.options."kafka.security.protocl" is not a Kafka consumer setting '
                                '(did you mean "kafka.security.protocol"?); Kafka would ignore it')


# -- item 1: one line, never a traceback ----------------------------------------------------------------------------


def test_run_with_clickhouse_unreachable_is_one_line(tmp_path, kafka_broker, new_topic):
    from tests.support.services.ports import free_port

    target = f'[target]\nurl = "clickhouse://127.0.0.1:{free_port()}"\ndatabase = "default"\noptions = {{ retries = 0 }}'
    config = embedded_config(tmp_path, kafka_broker.bootstrap, new_topic(), target)
    proc = streaming_sink("run", "--config", str(config), cwd=tmp_path, env={"STREAMING_SINK_TARGET_USER": "default"})
    assert_one_line(proc, ExitCode.SERVICE, "ClickHouse", "Connection refused", "check that")


def test_run_with_a_wrong_redis_password_is_one_line(tmp_path, kafka_broker, new_topic):
    from tests.support.services.redis import RedisServer

    config = embedded_config(tmp_path, kafka_broker.bootstrap, new_topic())
    with RedisServer(tmp_path / "redis", password="right-password") as server:
        wrong = server.url.replace("right-password", "wrong-password")
        proc = streaming_sink("run", "--config", str(config), cwd=tmp_path, env={"STREAMING_SINK_STATE_URL": wrong})
    last = assert_one_line(proc, ExitCode.USAGE, "state store refused the credentials", "STREAMING_SINK_STATE_URL")
    assert "wrong-password" not in proc.stderr and "wrong-password" not in last


def test_run_when_spark_cannot_fetch_the_kafka_source_is_one_line(tmp_path):
    """Ivy cannot resolve the artifact (here: an Ivy setting with no repository, as on a network without Maven
    Central): Spark's JVM exits before it starts, which PySpark reports as JAVA_GATEWAY_EXITED."""
    settings = tmp_path / "ivysettings.xml"
    settings.write_text('<ivysettings><settings defaultResolver="none"/><resolvers><filesystem name="none">'
                        f'<artifact pattern="{tmp_path}/none/[artifact]-[revision].[ext]"/></filesystem></resolvers>'
                        '</ivysettings>')
    spark = (f'[spark.conf]\n"spark.jars.ivySettings" = "{settings}"\n'
             '"spark.jars.packages" = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.99"')
    config = embedded_config(tmp_path, "127.0.0.1:9", "events", spark)
    proc = streaming_sink("run", "--config", str(config), cwd=tmp_path)
    assert_one_line(proc, ExitCode.SERVICE, "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.99", "spark.jars.repositories")


def test_status_into_a_reader_that_closes_early_is_no_traceback(tmp_path):
    """`status --json | head`: the reader goes before the output is written; the command keeps its own verdict."""
    from streaming_sink.state import FileStateStore

    FileStateStore(tmp_path / "state").take_epoch("first-hour", "vm:1")
    proc = subprocess.Popen([str(CLI), "status", "--job", "first-hour", "--state", f"file://{tmp_path / 'state'}", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` does once it has read its lines
    err = proc.stderr.read()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert code == ExitCode.OK, err
    assert err.strip().splitlines() == ["streaming-sink status: the reader closed the output early (broken pipe); "
                                        "the rest of it was dropped"]


@pytest.mark.slow
def test_ctrl_c_stops_run_with_one_line(tmp_path, kafka_broker, new_topic):
    import signal
    import time

    topic = new_topic()
    kafka_broker.produce(topic, [json.dumps({"table": "orders", "id": i, "name": "n"}) for i in range(10)])
    config = embedded_config(tmp_path, kafka_broker.bootstrap, topic)
    config.write_text(config.read_text().replace('interval = "available-now"', 'interval = "2 seconds"'))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STREAMING_SINK_")}
    proc = subprocess.Popen([str(CLI), "run", "--config", str(config)], cwd=tmp_path, env=environment,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 240
    for line in proc.stderr:  # until the first batch is committed
        lines.append(line)
        if "streaming_sink.batch" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    code = proc.wait(timeout=120)
    assert any("streaming_sink.batch" in line for line in lines), "".join(lines)[-3000:]
    assert "Traceback" not in rest, rest[-3000:]
    assert code == 130, rest[-3000:]
    assert rest.strip().splitlines()[-1] == "streaming-sink run: interrupted; nothing is lost: run the same command to resume"
