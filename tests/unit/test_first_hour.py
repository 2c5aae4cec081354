"""The small things a new user notices in the first hour (issue 25, item 6; review 2026-11-24 §2-§4)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from streaming_sink.cli import main
from streaming_sink.config import resolve_config
from streaming_sink.errors import ConfigurationError, ExitCode
from streaming_sink.job import job_spark_conf
from streaming_sink.kafka_source import KafkaSource, check_consumer_options
from streaming_sink.state import FileStateStore

CONFIG = {
    "job_id": "shop-ingest",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["shop.orders", "shop.payments"]},
    "routing": {"topics": {"shop.orders": "orders", "shop.payments": "payments"}},
    "tables": {"orders": {"schema": "order_id BIGINT NOT NULL"}, "payments": {"schema": "payment_id BIGINT NOT NULL"}},
}
#: a few of kafka-clients' ConsumerConfig.configNames() (the integration test asks the real consumer)
CONSUMER_NAMES = {"security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.truststore.location", "group.id",
                  "request.timeout.ms"}


@pytest.mark.parametrize("name, path", [("payments", "tables.payments.schema"),
                                        ("pay.ments", 'tables."pay.ments".schema')])
def test_a_missing_schema_names_its_table(tmp_path, name, path):
    data = copy.deepcopy(CONFIG)
    data["tables"][name] = data["tables"].pop("payments") if name == "payments" else {}
    data["tables"][name].pop("schema", None)
    data["routing"]["topics"]["shop.payments"] = name
    with pytest.raises(ConfigurationError) as error:
        resolve_config(data, tmp_path)
    assert str(error.value) == f"missing key {path!r}"


def test_a_misspelt_consumer_setting_gets_a_did_you_mean_and_a_plugins_own_passes_with_a_note():
    typo = KafkaSource("h:1", ["t"], options={"kafka.security.protocl": "SASL_SSL"})
    with pytest.raises(ConfigurationError, match=r'kafka.options."kafka.security.protocl" is not a Kafka consumer '
                                                 r'setting \(did you mean "kafka.security.protocol"\?\)'):
        check_consumer_options(typo, CONSUMER_NAMES)
    fine = KafkaSource("h:1", ["t"], options={"kafka.security.protocol": "SSL", "groupIdPrefix": "x",
                                              "kafka.awsDebugCreds": "true"})
    assert check_consumer_options(fine, CONSUMER_NAMES) == ['kafka.options."kafka.awsDebugCreds"']


def test_sparks_console_progress_is_off_unless_the_user_turns_it_on(tmp_path):
    spec = resolve_config(CONFIG, tmp_path)
    assert job_spark_conf(spec)["spark.ui.showConsoleProgress"] == "false"
    data = {**CONFIG, "spark": {"conf": {"spark.ui.showConsoleProgress": "true"}}}
    assert job_spark_conf(resolve_config(data, tmp_path))["spark.ui.showConsoleProgress"] == "true"


def test_the_operator_commands_take_the_state_url_from_the_environment(tmp_path, monkeypatch, capsys):
    """The help says a Redis password belongs in STREAMING_SINK_STATE_URL: without --config the commands read it."""
    store = FileStateStore(tmp_path / "state")
    store.take_epoch("shop-ingest", "vm:1")
    monkeypatch.setenv("STREAMING_SINK_STATE_URL", f"file://{Path(tmp_path) / 'state'}")
    code = main(["status", "--job", "shop-ingest"])
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    assert "shop-ingest" in out and "missing --state" not in err
    code = main(["status", "--job", "shop-ingest", "--state", "file:///nonexistent/elsewhere"])  # a flag still wins
    assert code != ExitCode.OK and "nonexistent" in capsys.readouterr().err


def test_a_spark_that_cannot_start_says_what_to_check(tmp_path):
    from streaming_sink.spark_session import start_failure

    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("")
    conf = {"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.1"}
    line = start_failure(conf, "4.2.1", {"JAVA_HOME": str(java_home)})
    assert line.startswith("it could not fetch org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.1 (Spark's lines above")
    assert '"spark.jars.repositories"' in line and "any spark-sql-kafka-0-10 4.2.x is accepted" in line
    assert "\n" not in line
    assert start_failure(conf, "4.2.1", {"JAVA_HOME": str(tmp_path / "none")}).startswith("no Java found")
