"""Pytest fixtures for the real local services (imported by tests/conftest.py).

* ``kafka_broker`` (session): one KRaft broker for the whole run; tests isolate themselves by
  topic name (``new_topic``), never by restarting it.
* ``secured_kafka_broker`` (session): a second broker that also has a SASL_SSL listener
  (SCRAM-SHA-512, test CA), user ``SECURE_USER``/``SECURE_PASSWORD``; started only by tests
  that ask for it.
* ``redis_server`` (function): a fresh redis-server with AOF under the test's tmp_path.
* ``spark_session`` (session): local[2] Spark with the Kafka source jars.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from devstack.kafka import KafkaBroker, SaslSsl
from devstack.redis import RedisClusterGroup, RedisSentinelGroup, RedisServer

__all__ = ["kafka_broker", "new_topic", "redis_cluster", "redis_sentinels", "redis_server", "redis_tls_server",
           "secured_kafka_broker", "spark_session"]

#: The one user ``secured_kafka_broker`` knows.
SECURE_USER = "alice"
SECURE_PASSWORD = "alice-secret"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Kafka broker shared by the session; its log is in the fixture's tmp dir."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def secured_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker with a SASL_SSL listener besides PLAINTEXT, for the secured-source tests.

    Its own broker rather than the shared one, so tests that do not need TLS pay nothing
    for it. The PLAINTEXT helpers (``create_topic``, ``produce``...) work on it as well.
    """
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kafka-secured"),
        security=SaslSsl(users={SECURE_USER: SECURE_PASSWORD}, mechanism="SCRAM-SHA-512"),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def new_topic(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory: ``new_topic(partitions=1, prefix=None)`` creates a uniquely named topic."""

    def create(partitions: int = 1, prefix: str | None = None) -> str:
        base = prefix or re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60]
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        kafka_broker.create_topic(name, partitions)
        return name

    return create


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server (appendonly, appendfsync always) for one test, data in tmp_path/redis."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    """A primary, a replica and three Sentinels (devstack.redis.RedisSentinelGroup), shared by a module's tests."""
    with RedisSentinelGroup(tmp_path_factory.mktemp("sentinels")) as group:
        yield group


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterGroup]:
    """A three-master Redis Cluster, shared by a module's tests (`flush()` empties it)."""
    with RedisClusterGroup(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server that speaks only TLS and asks for a client certificate; its `url` presents one."""
    from tests.infra.tls import issue_certificates

    directory = tmp_path_factory.mktemp("redis-tls")
    with RedisServer(directory / "redis", tls=issue_certificates(directory)) as server:
        yield server


@pytest.fixture(scope="session")
def spark_session():  # -> pyspark.sql.SparkSession
    """A local[2] SparkSession that can read Kafka (``format("kafka")``)."""
    from devstack.spark import local_spark_session

    spark = local_spark_session("streaming-sink-tests")
    try:
        yield spark
    finally:
        spark.stop()
