"""Before a query starts, the job reaches Kafka with the client and settings Spark will read with: a
broker that refuses them, or a missing topic, stops it with one line and nothing read."""
from __future__ import annotations

import pytest

from streaming_sink.kafka_source import KafkaSource, KafkaUnreachableError, probe
from streaming_sink.spark_session import check_kafka_source, kafka_source_version


def test_the_loaded_kafka_source_version_is_read_from_spark(spark_session):
    assert kafka_source_version(spark_session) == spark_session.version
    check_kafka_source(spark_session)


def test_probe_finds_topics_by_list_assignment_and_pattern(spark_session, kafka_broker, new_topic):
    topic = new_topic(partitions=2, prefix="probe")
    assert probe(spark_session, KafkaSource(kafka_broker.bootstrap, [topic])).endswith("reachable, topics exist")
    assigned = KafkaSource(kafka_broker.bootstrap, None, options={"assign": f'{{"{topic}": [0, 1]}}'})
    assert probe(spark_session, assigned).endswith("reachable, topics exist")
    pattern = KafkaSource(kafka_broker.bootstrap, None, options={"subscribePattern": f"{topic[:-3]}.*"})
    assert f"pattern matches 1 topic(s) now ['{topic}']" in probe(spark_session, pattern)


def test_probe_names_missing_topics_and_unreachable_brokers(spark_session, kafka_broker):
    with pytest.raises(KafkaUnreachableError) as error:
        probe(spark_session, KafkaSource(kafka_broker.bootstrap, ["no-such-topic"]))
    assert str(error.value) == (f"Kafka at {kafka_broker.bootstrap} (PLAINTEXT), topics ['no-such-topic']: "
                                "topic(s) ['no-such-topic'] do not exist")
    closed = KafkaSource("127.0.0.1:1", ["t"], options={"kafka.request.timeout.ms": "2000",
                                                        "kafka.default.api.timeout.ms": "3000"})
    with pytest.raises(KafkaUnreachableError) as error:
        probe(spark_session, closed, timeout_s=5)
    assert str(error.value) == ("Kafka at 127.0.0.1:1 (PLAINTEXT), topics ['t']: "
                                "TimeoutException: Timed out waiting for a node assignment. Call: listTopics")
    with pytest.raises(KafkaUnreachableError) as error:  # the client would wait longer than the probe
        probe(spark_session, KafkaSource("127.0.0.1:1", ["t"]), timeout_s=1)
    assert str(error.value).startswith("Kafka at 127.0.0.1:1 (PLAINTEXT), topics ['t']: no answer in 1 s; check that")
