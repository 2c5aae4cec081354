"""The local real services work: Kafka (produce/consume/Spark read), Redis (AOF durability).

If these fail, every integration test built on them is meaningless, so they check the
services' results exactly (counts and content checksums), not just that they started.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.services import jars
from tests.support.services._proc import ServiceError
from tests.support.services.kafka import KafkaBroker
from tests.support.services.redis import RedisServer

N_MESSAGES = 1000
PARTITIONS = 3


def _checksum(values: list[bytes]) -> str:
    """Order-independent digest of a multiset of values (Kafka orders only per partition)."""
    digest = hashlib.sha256()
    for value in sorted(values):
        digest.update(len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


EXPECTED_VALUES = [f"message-{i:04d}-{'x' * (i % 17)}".encode() for i in range(N_MESSAGES)]


@pytest.fixture(scope="module")
def filled_topic(kafka_broker: KafkaBroker) -> str:
    """A 3-partition topic holding exactly ``N_MESSAGES`` known records."""
    topic = "devstack-roundtrip"
    kafka_broker.create_topic(topic, PARTITIONS)
    # Round-robin over explicit partitions so every partition surely has data.
    for p in range(PARTITIONS):
        kafka_broker.produce(topic, EXPECTED_VALUES[p::PARTITIONS], partition=p)
    return topic


def test_kafka_topic_has_three_partitions(kafka_broker: KafkaBroker, filled_topic: str) -> None:
    admin = kafka_broker.admin()
    try:
        (described,) = admin.describe_topics([filled_topic])
    finally:
        admin.close()
    assert len(described["partitions"]) == PARTITIONS
    assert sorted(kafka_broker.end_offsets(filled_topic)) == list(range(PARTITIONS))


def test_kafka_produce_consume_exact(kafka_broker: KafkaBroker, filled_topic: str) -> None:
    ends = kafka_broker.end_offsets(filled_topic)
    assert sum(ends.values()) == N_MESSAGES
    assert all(end > 0 for end in ends.values()), ends

    records = kafka_broker.consume_all(filled_topic)
    values = [value for _p, _o, _k, value in records]
    assert len(values) == N_MESSAGES
    assert _checksum(values) == _checksum(EXPECTED_VALUES)
    # Offsets are dense per partition: nothing skipped, nothing read twice.
    for p in range(PARTITIONS):
        offsets = sorted(o for part, o, _k, _v in records if part == p)
        assert offsets == list(range(ends[p]))


def test_kafka_keyed_produce_and_new_topic(kafka_broker: KafkaBroker, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    assert kafka_broker.produce(topic, ["a", "b", "c"], key="same-key") == 3
    records = kafka_broker.consume_all(topic)
    assert {part for part, *_ in records} == {records[0][0]}  # one key -> one partition, in order
    assert [(k, v) for _p, _o, k, v in records] == [(b"same-key", b"a"), (b"same-key", b"b"), (b"same-key", b"c")]


def test_spark_batch_read_from_kafka(spark_session, kafka_broker: KafkaBroker, filled_topic: str) -> None:
    df = (
        spark_session.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap)
        .option("subscribe", filled_topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    assert df.count() == N_MESSAGES
    rows = df.select("partition", "value").collect()
    assert {row["partition"] for row in rows} == set(range(PARTITIONS))
    assert _checksum([bytes(row["value"]) for row in rows]) == _checksum(EXPECTED_VALUES)


def test_spark_stream_read_from_kafka(
    spark_session, kafka_broker: KafkaBroker, filled_topic: str, tmp_path: Path
) -> None:
    """The product's path: readStream + foreachBatch over several micro-batches."""
    seen: dict[int, list[bytes]] = {}

    def collect(batch_df, batch_id: int) -> None:
        seen[batch_id] = [bytes(r["value"]) for r in batch_df.select("value").collect()]

    stream = (
        spark_session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap)
        .option("subscribe", filled_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 400)
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout=120), "streaming query did not finish"
    assert query.exception() is None
    assert sorted(seen) == list(range(len(seen))) and len(seen) >= 3, sorted(seen)
    values = [v for batch in seen.values() for v in batch]
    assert len(values) == N_MESSAGES
    assert _checksum(values) == _checksum(EXPECTED_VALUES)


def test_kafka_broker_restart_keeps_data_and_cleans_up(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka")
    with broker:
        broker.create_topic("durable", 1)
        broker.produce("durable", [b"one", b"two"])
        first_bootstrap = broker.bootstrap
        pid = broker._proc.pid if broker._proc else None
        broker.kill()  # crash, not a controlled shutdown
        assert pid is not None and not _alive(pid)
        broker.start()
        assert broker.bootstrap == first_bootstrap
        assert [v for *_rest, v in broker.consume_all("durable")] == [b"one", b"two"]
        pid = broker._proc.pid if broker._proc else None
    assert not broker.running
    assert pid is not None and not _alive(pid)


def test_redis_aof_survives_restart_and_kill(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis_server.client()
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.set("batch:1", "PREPARED")
    finally:
        client.close()

    redis_server.restart()
    client = redis_server.client()
    try:
        assert client.get("batch:1") == b"PREPARED"
        client.set("batch:2", "COMMITTED")
    finally:
        client.close()

    # SIGKILL: batch:2 must already be in the AOF when SET returned (appendfsync always also
    # covers a machine crash, which cannot be simulated here).
    redis_server.kill()
    redis_server.start()
    client = redis_server.client()
    try:
        assert client.mget("batch:1", "batch:2") == [b"PREPARED", b"COMMITTED"]
    finally:
        client.close()


def test_redis_start_failure_reports_log(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "bad", extra_args=["--no-such-directive", "1"])
    with pytest.raises(ServiceError, match="(?s)redis-server.*no-such-directive"):
        server.start()
    assert not server.running


def test_redis_retries_on_a_taken_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free-port race (port taken between choosing and binding) costs a retry, not a failure."""
    import socket

    import tests.support.services.redis as devstack_redis
    from tests.support.services.ports import free_port

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        offered = iter([taken])
        monkeypatch.setattr(devstack_redis, "free_port", lambda: next(offered, None) or free_port())
        with RedisServer(tmp_path / "r") as server:
            assert server.port != taken
            client = server.client()
            try:
                assert client.ping()
            finally:
                client.close()


def test_spark_jars_are_only_what_pyspark_lacks() -> None:
    names = [j.name for j in jars.spark_kafka_jars()]
    shipped = {p.name for p in jars.pyspark_jars_dir().glob("*.jar")}
    assert not set(names) & shipped
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)
    assert all(n.endswith(".jar") for n in names)
    assert jars.spark_kafka_jars_conf() == ",".join(str(j) for j in jars.spark_kafka_jars())


def test_partial_jar_cache_is_refetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy interrupted before its manifest was written is redone, not used."""
    monkeypatch.setenv("STREAMING_SINK_CACHE", str(tmp_path / "cache"))
    real = jars.spark_kafka_jars()
    dest = jars.cache_root() / real[0].relative_to(jars.cache_root()).parts[0]
    (dest / jars.MANIFEST).unlink()
    real[0].unlink()  # the interrupted copy also lost a jar
    again = jars.spark_kafka_jars()
    assert [p.name for p in again] == [p.name for p in real]
    assert all(p.is_file() for p in again)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes once reaped, which stop() does.
    return True
