"""Every shared pytest fixture, in one module (tests/conftest.py imports it; tests/unit/conftest.py refuses
the ones that start something).

Real local services (tests/support/services):
* ``kafka_broker`` (session): one KRaft broker for the whole run; tests isolate themselves by
  topic name (``new_topic``), never by restarting it.
* ``secured_kafka_broker`` (session): a second broker that also has a SASL_SSL listener
  (SCRAM-SHA-512, test CA), user ``SECURE_USER``/``SECURE_PASSWORD``; started only by tests
  that ask for it.
* ``redis_server`` (function): a fresh redis-server with AOF under the test's tmp_path;
  ``redis_sentinels``, ``redis_cluster``, ``redis_tls_server`` (module).
* ``spark_session`` (session): local[2] Spark with the Kafka source jars; ``spark`` (function): the same
  session, with the Spark conf of the test's ``spark_conf`` marker set for the test and restored after.

The ClickHouse HTTP front (tests/support/doubles/clickhouse_front):
* ``clickhouse_front`` (function): a started ``ClickHouseFront`` over chdb at ``tmp_path/clickhouse-front``;
  its faults are reset and the engine closed at the end. chdb opens one data path per process, so a
  test using it must not hold another chdb path open in the same process (run a twin elsewhere).
* ``clickhouse_url`` (function, parametrized ``chdb`` / ``http``): the real engine at ``tmp_path/ch`` as a
  ``ClickHouseTarget`` (or a job's ``target_url``) reaches it: embedded, ``chdb://…`` (writers in the driver),
  or over HTTP through a front started on that path, ``http://127.0.0.1:<port>`` (writers in Spark tasks).
  A test that takes it runs once each way: the HTTP path must pass what the embedded one passes.
* ``clickhouse_target`` (function, through ``clickhouse_url``): a ``ClickHouseTarget`` there for the database
  ``analytics``, created empty; closed at the end.

The Stream Load emulators (tests/support/doubles/emulators):
* ``starrocks_emulator`` (function): factory ``starrocks_emulator(password="pw", columns=..., table="t")``, a
  started StarRocks emulator under tmp_path with database ``db`` and its table; stopped at the end.
* ``sr`` (function): ``starrocks_emulator()`` with those defaults, the emulator most target tests take.
  ``tests.support.targets.starrocks.starrocks_target(emulator, **options)`` is the target on it.

The change-data stack (tests/support/services: postgres.py, kafka_connect.py; tests/support/change_data.py):
* ``postgres`` (module): PostgreSQL from Debian's package with logical replication, the workload's tables created.
* ``kafka_connect`` (module): a standalone Kafka Connect worker on ``kafka_broker`` with Debezium's PostgreSQL
  connector as a plugin; each test adds its own connector (own slot and topics).

Other:
* ``quiet_logs`` (function): logging off for the test (``pytestmark = pytest.mark.usefixtures("quiet_logs")``).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.targets.clickhouse import ClickHouseTarget
from tests.support.doubles.clickhouse_front.server import ClickHouseFront
from tests.support.services.kafka import KafkaBroker, SaslSsl
from tests.support.services.redis import RedisClusterGroup, RedisSentinelGroup, RedisServer

__all__ = ["clickhouse_front", "clickhouse_target", "clickhouse_url", "kafka_broker", "kafka_connect", "new_topic",
           "postgres", "quiet_logs",
           "redis_cluster", "redis_sentinels", "redis_server", "redis_tls_server", "secured_kafka_broker", "spark",
           "spark_session", "sr", "starrocks_emulator"]

#: The one user ``secured_kafka_broker`` knows.
SECURE_USER = "alice"
SECURE_PASSWORD = "alice-secret"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Kafka broker shared by the session; its log is in the fixture's tmp dir."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def secured_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker with a SASL_SSL listener besides PLAINTEXT, for the secured-source tests.

    Its own broker rather than the shared one, so tests that do not need TLS pay nothing
    for it. The PLAINTEXT helpers (``create_topic``, ``produce``...) work on it as well.
    """
    security = SaslSsl(users={SECURE_USER: SECURE_PASSWORD}, mechanism="SCRAM-SHA-512")
    with KafkaBroker(tmp_path_factory.mktemp("kafka-secured"), security=security) as broker:
        yield broker


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
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="module")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    """A primary, a replica and three Sentinels (tests.support.services.redis.RedisSentinelGroup), shared by a module's tests."""
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
    from tests.support.tls import issue_certificates

    directory = tmp_path_factory.mktemp("redis-tls")
    with RedisServer(directory / "redis", tls=issue_certificates(directory)) as server:
        yield server


@pytest.fixture(scope="session")
def spark_session():  # -> pyspark.sql.SparkSession
    """A local[2] SparkSession that can read Kafka (``format("kafka")``)."""
    from tests.support.services.spark import local_spark_session

    spark = local_spark_session("streaming-sink-tests")
    try:
        yield spark
    finally:
        spark.stop()


@pytest.fixture
def spark(spark_session: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session, with `@pytest.mark.spark_conf({...})` (on the test or its module) set for the test, then restored."""
    marker = request.node.get_closest_marker("spark_conf")
    wanted: dict[str, str] = marker.args[0] if marker else {}
    previous = {key: spark_session.conf.get(key, None) for key in wanted}
    for key, value in wanted.items():
        spark_session.conf.set(key, value)
    try:
        yield spark_session
    finally:
        for key, value in previous.items():
            if value is None:
                spark_session.conf.unset(key)
            else:
                spark_session.conf.set(key, value)


# -- the ClickHouse HTTP front ----------------------------------------------------------------------------------------


@pytest.fixture
def clickhouse_front(tmp_path: Path) -> Iterator[ClickHouseFront]:
    """A ClickHouse HTTP server on 127.0.0.1 (free port) executing in chdb; `.url`, `.target_url`, `.faults`."""
    with ClickHouseFront(tmp_path / "clickhouse-front") as front:
        yield front


@pytest.fixture(params=["chdb", "http"])
def clickhouse_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """`chdb://<tmp_path>/ch`, or `http://…` of a front on that path (stopped after the test's own teardown)."""
    if request.param == "chdb":
        yield f"chdb://{tmp_path / 'ch'}"
        return
    with ClickHouseFront(tmp_path / "ch") as front:
        yield front.url


@pytest.fixture
def clickhouse_target(clickhouse_url: str) -> Iterator[ClickHouseTarget]:
    """The target of `clickhouse_url` for database `analytics` (created here, empty)."""
    target = ClickHouseTarget(clickhouse_url, database="analytics")
    try:
        target.client().command("CREATE DATABASE analytics")
        yield target
    finally:
        target.close()


# -- the Stream Load emulators ----------------------------------------------------------------------------------------

#: the columns of the emulators' default table `db.t`
EMULATOR_COLUMNS = [("id", "INT"), ("name", "VARCHAR(32)")]


@pytest.fixture
def starrocks_emulator(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: `starrocks_emulator(password="pw", columns=EMULATOR_COLUMNS, table="t", database="db")`, a started
    StarRocks emulator at tmp_path/sr holding that table (`columns=None`: only the database); stopped at the end."""
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    started: list[StarRocksEmulator] = []

    def start(password: str = "pw", columns: list[tuple[str, str]] | None = EMULATOR_COLUMNS, table: str = "t",
              database: str = "db") -> StarRocksEmulator:
        emulator = StarRocksEmulator(tmp_path / "sr", password=password).start()
        started.append(emulator)
        emulator.create_database(database)
        if columns is not None:
            emulator.create_table(database, table, columns)
        return emulator

    try:
        yield start
    finally:
        for emulator in started:
            emulator.close()


@pytest.fixture
def sr(starrocks_emulator: Callable[..., Any]) -> Any:
    """A started StarRocks emulator with table `db.t` (id INT, name VARCHAR(32)), user root, password `pw`."""
    return starrocks_emulator()


# -- other ------------------------------------------------------------------------------------------------------------


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """Logging off for the test: the protocol logs every recovery at WARNING, thousands of schedules would drown the report."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # -> PostgresServer
    from tests.support.change_data import create_tables
    from tests.support.services.postgres import PostgresServer

    with PostgresServer(tmp_path_factory.mktemp("postgres")) as server:
        with server.connect() as conn:
            create_tables(conn)
        yield server


@pytest.fixture(scope="module")
def kafka_connect(tmp_path_factory: pytest.TempPathFactory, kafka_broker: KafkaBroker) -> Iterator[Any]:  # -> KafkaConnect
    from tests.support.services.kafka_connect import KafkaConnect

    with KafkaConnect(tmp_path_factory.mktemp("connect"), kafka_broker.bootstrap) as worker:
        yield worker
