"""The SASL_SSL listener of devstack's broker works the way a secured production Kafka does.

Login with the right password over TLS succeeds for kafka-python and for Spark's Kafka source
(through exactly the options ``spark_kafka_options`` gives a user); a wrong password and an
untrusted certificate are refused. Without these, a secured-source test could pass against a
listener that accepts anyone, or fail for reasons that have nothing to do with the product.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import certifi
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaConnectionError, SaslAuthenticationFailedError
from kafka.net import KafkaConnectionManager, NetworkSelector

from tests.support.fixtures import SECURE_PASSWORD, SECURE_USER
from tests.support.services._proc import log_since, wait_until
from tests.support.services.kafka import KafkaBroker, SaslSsl

N_RECORDS = 200
VALUES = [f"secured-{i:03d}".encode() for i in range(N_RECORDS)]


def _unique_topic(label: str) -> str:
    return f"secured-{label}-{uuid.uuid4().hex[:8]}"


def _login(settings: dict[str, Any]) -> tuple[int, ...]:
    """Open one kafka-python connection (TLS handshake, ApiVersions, SASL); its broker version.

    Raises the connection's own error. Why not a producer or admin client: they retry a
    refused login until their bootstrap timeout and then raise only
    ``KafkaTimeoutError('Unable to bootstrap ...')`` (kafka-python 3.0.12).
    """
    manager = KafkaConnectionManager(NetworkSelector(**settings), **settings)
    node_id = manager.cluster.bootstrap_brokers()[0].node_id

    async def connect() -> tuple[int, ...]:
        conn = await manager.get_connection(node_id)
        return conn.broker_version

    try:
        return manager.run(connect)
    finally:
        manager.close()


def _produce(settings: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings, acks="all", linger_ms=5, client_id="secured-test-producer")
    try:
        futures = [producer.send(topic, key=b"k%d" % (i % 7), value=v) for i, v in enumerate(values)]
        producer.flush(timeout=60)
        for fut in futures:
            fut.get(timeout=60)  # re-raises a failed send
    finally:
        producer.close(timeout=10)


def _read_all(settings: dict[str, Any], topic: str, timeout: float = 60.0) -> list[bytes]:
    """Every value in ``topic`` up to its end offsets now, read through ``settings``' listener."""
    consumer = KafkaConsumer(
        **settings, enable_auto_commit=False, auto_offset_reset="earliest", client_id="secured-test-reader"
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        assert partitions, f"topic {topic} not visible over {settings['bootstrap_servers']}"
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read {len(values)} records of {sum(ends.values())} in time"
            for tp, batch in consumer.poll(timeout_ms=500).items():
                values += [rec.value for rec in batch if rec.offset < ends[tp]]
        return values
    finally:
        consumer.close()


def test_kafka_python_round_trip_over_sasl_ssl(secured_kafka_broker: KafkaBroker) -> None:
    """Create, produce and read back, all over SASL_SSL with SCRAM-SHA-512 and a verified cert."""
    broker = secured_kafka_broker
    settings = broker.kafka_python_settings(SECURE_USER, SECURE_PASSWORD)
    assert settings["bootstrap_servers"] == broker.secure_bootstrap != broker.bootstrap
    topic = _unique_topic("roundtrip")

    admin = KafkaAdminClient(**settings, client_id="secured-test-admin")
    try:
        admin.create_topics(
            {topic: {"num_partitions": 2, "replication_factor": 1}}, timeout_ms=30000, wait_for_metadata=True
        )
        assert topic in admin.list_topics()
    finally:
        admin.close()

    _produce(settings, topic, VALUES)
    assert sorted(_read_all(settings, topic)) == sorted(VALUES)
    # The same records, seen through the PLAINTEXT listener: one broker, two doors.
    assert sum(broker.end_offsets(topic).values()) == N_RECORDS


def test_wrong_password_is_refused(secured_kafka_broker: KafkaBroker) -> None:
    """The broker rejects the login, and kafka-python reports it as a SASL authentication error.

    kafka-python 3.0.12 drops bytes that arrive in the same read as the connection's close,
    and the broker sends its SASL error response right before closing; so a refusal surfaces
    as either ``SaslAuthenticationFailedError`` or ``KafkaConnectionError('socket
    disconnected')`` (about half each on loopback). The loop tries again until kafka-python
    has reported the authentication error itself; the broker's log confirms every attempt
    was an authentication failure, so a disconnect for another reason cannot pass as one.
    """
    broker = secured_kafka_broker
    wrong = broker.kafka_python_settings(SECURE_USER, "not-" + SECURE_PASSWORD)
    log_offset = broker.log_path.stat().st_size
    refusals: list[Exception] = []
    deadline = time.monotonic() + 30
    while not any(isinstance(exc, SaslAuthenticationFailedError) for exc in refusals):
        assert time.monotonic() < deadline, f"no SaslAuthenticationFailedError among {refusals!r}"
        with pytest.raises((SaslAuthenticationFailedError, KafkaConnectionError)) as refused:
            _login(wrong)
        if isinstance(refused.value, KafkaConnectionError):
            assert "socket disconnected" in str(refused.value), refused.value  # not a TLS problem
        refusals.append(refused.value)

    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in str(refusals[-1])

    def failures_logged() -> int:
        lines = log_since(broker.log_path, log_offset).splitlines()
        return sum("Failed authentication with /127.0.0.1" in ln and "invalid credentials" in ln for ln in lines)

    wait_until(lambda: failures_logged() >= len(refusals), timeout=10, what="broker log of the refused logins")
    assert failures_logged() == len(refusals)
    # The same path with the right password connects: the password made the difference.
    assert _login(broker.kafka_python_settings(SECURE_USER, SECURE_PASSWORD))


@pytest.mark.parametrize(
    "cafile",
    [None, certifi.where()],
    ids=["system-trust-store", "public-ca-bundle"],
)
def test_client_not_trusting_the_test_ca_fails_the_tls_handshake(
    secured_kafka_broker: KafkaBroker, cafile: str | None
) -> None:
    """Without the test CA the certificate is rejected before any credentials are sent."""
    settings = secured_kafka_broker.kafka_python_settings(SECURE_USER, SECURE_PASSWORD)
    settings["ssl_cafile"] = cafile
    with pytest.raises(KafkaConnectionError, match="Handshake failed.*CERTIFICATE_VERIFY_FAILED"):
        _login(settings)


def test_spark_batch_read_over_sasl_ssl(spark_session, secured_kafka_broker: KafkaBroker) -> None:
    """Spark's Kafka source reads every record with only the options a user would write."""
    broker = secured_kafka_broker
    topic = _unique_topic("spark")
    broker.create_topic(topic, partitions=3)
    broker.produce(topic, VALUES)  # written through PLAINTEXT, read below through SASL_SSL

    options = broker.spark_kafka_options(SECURE_USER, SECURE_PASSWORD)
    assert options["kafka.bootstrap.servers"] == broker.secure_bootstrap
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert Path(options["kafka.ssl.truststore.location"]) == broker.ca_pem_path
    assert not any("endpoint.identification" in key for key in options)  # hostname check stays on

    reader = spark_session.read.format("kafka").options(**options)
    df = (
        reader.option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    values = [bytes(row["value"]) for row in df.select("value").collect()]
    assert sorted(values) == sorted(VALUES)


def test_spark_with_a_wrong_password_fails_with_the_sasl_error(
    spark_session, secured_kafka_broker: KafkaBroker
) -> None:
    """The Java client names the cause, so a misconfigured job fails legibly, not by timeout."""
    broker = secured_kafka_broker
    topic = _unique_topic("spark-denied")
    broker.create_topic(topic)
    options = broker.spark_kafka_options(SECURE_USER, "not-" + SECURE_PASSWORD)
    df = (
        spark_session.read.format("kafka")
        .options(**options)
        .option("subscribe", topic)
        .option("fetchOffset.numRetries", "1")  # the default 3 retries only repeat the same refusal
        .load()
    )
    with pytest.raises(Exception, match="invalid credentials with SASL mechanism SCRAM-SHA-512"):
        df.collect()


def test_plain_broker_restart_keeps_certificate_ports_and_data(tmp_path: Path) -> None:
    """SASL/PLAIN variant, restarted: same ports, same CA and keystore, same users and records."""
    broker = KafkaBroker(tmp_path / "kafka", security=SaslSsl(users={"bob": "bob-secret"}, mechanism="PLAIN"))
    with broker:
        settings = broker.kafka_python_settings("bob", "bob-secret")
        assert settings["sasl_mechanism"] == "PLAIN"
        ports = (broker.port, broker.controller_port, broker.secure_port)
        ca_pem = broker.ca_pem_path.read_bytes()
        keystore = broker.keystore_path.read_bytes()
        assert ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        topic = _unique_topic("restart")
        broker.create_topic(topic)
        _produce(settings, topic, VALUES[:10])

        broker.stop()
        assert not broker.running
        broker.start()

        assert (broker.port, broker.controller_port, broker.secure_port) == ports
        assert broker.ca_pem_path.read_bytes() == ca_pem
        assert broker.keystore_path.read_bytes() == keystore
        # Settings taken before the restart still work: same address, same trusted CA.
        assert broker.kafka_python_settings("bob", "bob-secret") == settings
        assert sorted(_read_all(settings, topic)) == sorted(VALUES[:10])
        # Refused (either way kafka-python reports it, see test_wrong_password_is_refused).
        with pytest.raises((SaslAuthenticationFailedError, KafkaConnectionError)):
            _login(broker.kafka_python_settings("bob", "not-bob-secret"))
    assert not broker.running
