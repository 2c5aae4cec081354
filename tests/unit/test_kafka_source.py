"""Kafka as users configure it: Spark's option names pass through, the sink's own and unsafe ones are
refused with the key to use, and the job's Spark finds a Kafka source that is not known to be broken."""
from __future__ import annotations

import pytest

from streaming_sink.config import resolve_config
from streaming_sink.kafka_source import check_starting_offsets
from streaming_sink.spark_session import KNOWN_BAD_KAFKA_SOURCE, check_kafka_source, session_conf, worker_python
from streaming_sink.targets.base import ConfigurationError
from tests.unit.test_config import with_change

SECURED = {
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.ssl.truststore.type": "PEM",
    "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
    "groupIdPrefix": "ingest",
    "minOffsetsPerTrigger": 1000,
    "maxTriggerDelay": "30s",
    "includeHeaders": True,
}


def test_spark_options_pass_through_by_their_spark_names(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_JAAS", 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";')
    options = {**SECURED, "kafka.sasl.jaas.config": {"env": "KAFKA_JAAS"}, "startingtimestamp": 1700000000000}
    spec = resolve_config(with_change("kafka.options", options), tmp_path)
    reader = spec.kafka_source().reader_options()
    assert reader["kafka.security.protocol"] == "SASL_SSL" and reader["minOffsetsPerTrigger"] == "1000"
    assert reader["includeHeaders"] == "true" and reader["startingTimestamp"] == "1700000000000"  # Spark's spelling
    assert reader["kafka.sasl.jaas.config"].endswith('password="p";')  # from the environment, not the file
    assert reader["subscribe"] == "events" and reader["failOnDataLoss"] == "true" and reader["maxOffsetsPerTrigger"] == "100"
    assert spec.kafka_source().client_properties()["sasl.mechanism"] == "SCRAM-SHA-512"
    assert "password" not in repr(spec) and "password" not in repr(spec.kafka_source())
    assert spec.kafka_source().describe() == "127.0.0.1:9092 (SASL_SSL), topics ['events']"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"subscribe": "x"}, "kafka.options.subscribe: set it with the key 'kafka.topics' instead"),
        ({"kafka.bootstrap.servers": "h:1"}, "set it with the key 'kafka.bootstrap_servers' instead"),
        ({"StartingOffsets": "latest"}, "kafka.options.StartingOffsets: set it with the key 'kafka.starting_offsets'"),
        ({"failOnDataLoss": False}, "kafka.options.failOnDataLoss is not allowed: the sink always fails on data loss"),
        ({"kafka.auto.offset.reset": "latest"}, 'kafka.options."kafka.auto.offset.reset" is not allowed'),
        ({"endingOffsets": "latest"}, "a streaming job has no end"),
        ({"subscribePatern": "e.*"}, "unknown Spark Kafka source option kafka.options.subscribePatern (did you mean 'subscribePattern'?)"),
        ({"security.protocol": "SSL"}, "consumer settings take the 'kafka.' prefix"),
        ({"kafka.sasl.jaas.config": {"env": "NOT_SET_ANYWHERE"}}, "environment variable 'NOT_SET_ANYWHERE' is not set"),
        ({"kafka.ssl.keystore.location": ["a"]}, "is not a string, number or boolean"),
        ({"assign": '{"events": [0, 1]}', "subscribePattern": "e.*"}, "give only one of subscribePattern or assign"),
        ({"assign": '{"events": 0}'}, "kafka.options.assign: '{\"events\": 0}' must map each topic to a list of partitions"),
    ],
)
def test_option_mistakes_name_the_key(tmp_path, options, message):
    with pytest.raises(ConfigurationError) as error:
        resolve_config(with_change("kafka.options", options), tmp_path)
    assert message in str(error.value)


def test_a_pattern_or_an_assignment_replaces_the_topic_list(tmp_path):
    pattern = with_change("kafka.topics", KeyError, with_change("kafka.options", {"subscribePattern": "events-.*"}))
    spec = resolve_config(pattern, tmp_path)
    assert spec.topics is None and "subscribe" not in spec.kafka_source().reader_options()
    assert spec.kafka_source().reader_options()["subscribePattern"] == "events-.*"
    with pytest.raises(ConfigurationError, match="kafka.topics and kafka.options.subscribePattern both choose topics"):
        resolve_config(with_change("kafka.options", {"subscribePattern": "e.*"}), tmp_path)
    with pytest.raises(ConfigurationError, match=r"missing key 'kafka.topics' \(a list of topics\), or instead 'kafka.topic_pattern'"):
        resolve_config(with_change("kafka.topics", KeyError), tmp_path)


@pytest.mark.parametrize("value", ["earliest", "latest", '{"events": {"0": 1234, "1": -2}}'])
def test_starting_offsets_accepted(value):
    assert check_starting_offsets(value) == value


@pytest.mark.parametrize(
    "value, message",
    [
        ("earlist", "'earlist' is not valid JSON"),
        ('{"events": [0, 1]}', "is not a starting position"),
        ('{"events": {"zero": 5}}', "is not a starting position"),
        ('{"events": {"0": -3}}', "is not a starting position"),
        (5, "= 5: expected str, got int"),
    ],
)
def test_starting_offsets_checked_at_load(tmp_path, value, message):
    with pytest.raises(ConfigurationError) as error:
        resolve_config(with_change("kafka.starting_offsets", value), tmp_path)
    assert str(error.value).startswith("kafka.starting_offsets") and message in str(error.value)


def test_bootstrap_servers_as_a_list(tmp_path):
    spec = resolve_config(with_change("kafka.bootstrap_servers", ["b1:9092", "b2:9092"]), tmp_path)
    assert spec.kafka_source().reader_options()["kafka.bootstrap.servers"] == "b1:9092,b2:9092"
    with pytest.raises(ConfigurationError, match="kafka.bootstrap_servers: give"):
        resolve_config(with_change("kafka.bootstrap_servers", []), tmp_path)


@pytest.mark.parametrize(
    "value, columns",
    [
        (True, ["kafka_partition", "kafka_offset"]),
        (False, []),
        (["key", "topic", "timestamp"], ["kafka_topic", "kafka_timestamp", "kafka_key"]),
        (["topic", "partition", "offset", "timestamp", "key"],
         ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key"]),
    ],
)
def test_metadata_columns_a_user_chooses(tmp_path, value, columns):
    spec = resolve_config(with_change("sink.metadata_columns", value), tmp_path)
    assert [name for _, name, _ in spec.metadata()] == columns


@pytest.mark.parametrize("value, message", [
    (["headers"], "sink.metadata_columns[0] = 'headers': not one of topic, partition, offset, timestamp, key"),
    ("topic", "sink.metadata_columns = 'topic': expected bool | array, got str"),
    (["topic", "topic"], "sink.metadata_columns = ['topic', 'topic']: a field is listed twice")])
def test_metadata_column_mistakes(tmp_path, value, message):
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve_config(with_change("sink.metadata_columns", value), tmp_path)


def test_the_kafka_source_and_a_utc_session_are_added_unless_the_user_names_them():
    package = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    utc = {"spark.sql.session.timeZone": "UTC"}

    def added(conf: dict) -> dict:
        return {k: v for k, v in session_conf(conf, "4.2.0", "2.13").items() if k not in conf or conf[k] != v}

    assert session_conf({}, "4.2.0", "2.13") == {**utc, "spark.jars.packages": package}
    assert added({"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0"}) == {
        **utc, "spark.jars.packages": f"io.delta:delta-spark_2.13:4.0.0,{package}"}
    mine = {"spark.jars": "/opt/jars/spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark.sql.session.timeZone": "Asia/Tokyo"}
    assert session_conf(mine, "4.2.0", "2.13") == mine
    assert added({"spark.jars.packages": package.replace("4.2.0", "4.1.3")}) == utc


def test_local_workers_run_this_python_unless_told_otherwise():
    import sys

    assert worker_python({}, {}) == sys.executable
    assert worker_python({"spark.master": "local[2]"}, {}) == sys.executable
    assert worker_python({"spark.master": "spark://m:7077"}, {}) is None
    assert worker_python({}, {"PYSPARK_PYTHON": "/opt/py/bin/python"}) is None
    assert worker_python({"spark.pyspark.python": "./env/bin/python"}, {}) == "./env/bin/python"


class _Spark:
    version = "4.1.1"


@pytest.mark.parametrize(
    "loaded, message",
    [
        (None, "Spark has no Kafka source (format \"kafka\"): add it with spark-submit --packages "
               "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"),
        ("4.1.1", "the Kafka source spark-sql-kafka-0-10 4.1.1 is known to be broken: restarted queries fail with a "
                  "NullPointerException in KafkaMicroBatchStream.metrics"),
    ],
)
def test_a_missing_or_known_bad_kafka_source_is_refused(monkeypatch, loaded, message):
    monkeypatch.setattr("streaming_sink.spark_session.kafka_source_version", lambda spark: loaded)
    with pytest.raises(ConfigurationError) as error:
        check_kafka_source(_Spark())
    assert message in str(error.value)
    assert set(KNOWN_BAD_KAFKA_SOURCE) == {"4.1.0", "4.1.1", "4.1.2"}


def test_a_kafka_source_built_for_another_spark_is_refused(monkeypatch):
    monkeypatch.setattr("streaming_sink.spark_session.kafka_source_version", lambda spark: "4.0.0")
    spark = _Spark()
    spark.version = "4.2.0"
    with pytest.raises(ConfigurationError, match="4.0.0 was built for another Spark than the running 4.2.0"):
        check_kafka_source(spark)



def test_a_sasl_login_without_its_jaas_entry_names_the_job_s_key() -> None:
    """Review mistake 20: Kafka's words name a JVM system property; the line names the key that fixes it."""
    from streaming_sink.kafka_source import _what_to_set

    said = ("IllegalArgumentException: Could not find a 'KafkaClient' entry in the JAAS configuration. System property "
            "'java.security.auth.login.config' is not set")
    assert _what_to_set(said) == '; give the login in kafka.options."kafka.sasl.jaas.config"'
    assert _what_to_set("TimeoutException: Timed out waiting for a node assignment") == ""
