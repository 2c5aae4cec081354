"""The Redis store on the topologies production runs: replicas it waits for, a Sentinel failover it follows, and a
journal written under the key layout of earlier releases. Real `redis-server` processes (tests.support.services.redis)."""
from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.errors import StateStoreUnreachableError
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, FencedError, RedisStateStore, open_store
from streaming_sink.state.redis import _FENCED_SCRIPT, ReplicationError
from tests.support.services.redis import HOST, RedisSentinelGroup, RedisServer

JOB, Q = "orders", "query-a"


def record(batch: int, epoch: int, state: BatchState = BatchState.PREPARED) -> BatchRecord:
    committables = [Committable("clickhouse", "db", "t", f"L{batch}-{i}", i, "e1w0t0", rows=1) for i in range(2)]
    return BatchRecord(Q, batch, state, epoch, committables)


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer(tmp_path / "primary") as primary:
        replica = RedisServer(tmp_path / "replica", extra_args=["--replicaof", HOST, str(primary.port)])
        with replica:
            RedisSentinelGroup.wait_in_sync(primary)
            yield primary, replica
            replica.resume()


def test_a_journal_write_waits_for_the_replica_and_fails_without_it(primary_and_replica):
    """`auto` counts the replica connected at the first write; a write it does not acknowledge in time is a failed
    write, and the count travels to Spark tasks with the pickled store."""
    primary, replica = primary_and_replica
    store = open_store(primary.url + "?wait_timeout=0.5")
    epoch = store.take_epoch(JOB, "test")
    store.put_batch(JOB, epoch, record(0, epoch))
    with replica.client() as client:
        assert client.get(f"streaming-sink:{{{JOB}}}:batch:{Q}:0"), "the write returned before the replica had it"
    task_copy = pickle.loads(pickle.dumps(store))
    replica.pause()
    with pytest.raises(ReplicationError, match="reached 0 of the 1 replica"):
        store.mark_done(JOB, epoch, Q, 0, "L0-0")
    with pytest.raises(ReplicationError):
        task_copy.add_intent(JOB, epoch, Q, 1, TxnRef("clickhouse", "db", "t", "L1-0", 0, f"e{epoch}w0t0"))
    replica.resume()
    store.mark_done(JOB, epoch, Q, 0, "L0-1")
    assert store.done_labels(JOB, Q, 0) == {"L0-0", "L0-1"}


def test_auto_waits_for_a_replica_that_attached_after_the_first_write(tmp_path):
    """Review N3: `auto` was fixed at the store's first write, so a driver started while no replica was attached never
    waited after one attached (its writes returned with a paused replica), while `doctor` said "wait for 1". Now each
    journal write waits for every replica connected when it is made, and never for fewer than the store has seen."""
    with RedisServer(tmp_path / "primary") as primary:
        store = open_store(primary.url + "?wait_timeout=0.5")
        epoch = store.take_epoch(JOB, "test")  # no replica yet: nothing to wait for
        replica = RedisServer(tmp_path / "replica", extra_args=["--replicaof", HOST, str(primary.port)])
        with replica:
            RedisSentinelGroup.wait_in_sync(primary)
            task_copy = pickle.loads(pickle.dumps(store))
            assert "journal writes wait for 1" in open_store(primary.url).durability().found
            store.put_batch(JOB, epoch, record(0, epoch))
            with replica.client() as client:
                assert client.get(f"streaming-sink:{{{JOB}}}:batch:{Q}:0"), "the write returned before the replica had it"
            store.beat(JOB, epoch, time.time())  # the driver's heartbeat says what its writes wait for
            replica.pause()
            with pytest.raises(ReplicationError, match="reached 0 of the 1 replica"):
                store.mark_done(JOB, epoch, Q, 0, "L0-0")
            with pytest.raises(ReplicationError, match="reached 0 of the 1 replica"):
                task_copy.add_intent(JOB, epoch, Q, 1, TxnRef("clickhouse", "db", "t", "L1-0", 0, f"e{epoch}w0t0"))
            replica.resume()
        # the replica is gone: the store keeps waiting for it (a failover could promote a copy that lacks the write)
        with pytest.raises(ReplicationError, match="reached 0 of the 1 replica"):
            store.mark_done(JOB, epoch, Q, 0, "L0-1")
        # doctor reports what the running driver does, not what a store started now would do
        durability = open_store(primary.url).durability()
        assert "0 replica(s) connected" in durability.found and f"the driver of job '{JOB}' waits for 1" in durability.found
        assert "waits for more replicas than the 0 connected" in durability.warning


def test_doctor_reports_the_replication_and_warns_when_writes_do_not_wait(primary_and_replica):
    primary, _ = primary_and_replica
    waiting = open_store(primary.url).durability()
    assert waiting.warning is None
    assert "1 replica(s) connected" in waiting.found and "journal writes wait for 1" in waiting.found
    not_waiting = open_store(primary.url + "?wait_replicas=0").durability()
    assert "1 replica(s) connected but journal writes wait for 0" in not_waiting.warning
    too_many = open_store(primary.url + "?wait_replicas=2").durability()
    assert "wait for 2 replica(s) but 1 are connected" in too_many.warning


@pytest.mark.extended  # CI has the same failover under a running job: test_redis_failover.py [1]
def test_the_store_follows_the_sentinels_master_across_a_failover(tmp_path):
    """What one master acknowledged (and its replica had, since the write waited) is on the promoted one. A write
    while the promoted master has no replica is tried until failover_timeout, then fails: nothing is acted on that one
    server alone holds (the job rides a failover whose replica comes back: test_redis_ride_through.py)."""
    with RedisSentinelGroup(tmp_path / "sentinels") as group:
        store = open_store(group.url + "?failover_timeout=1")
        epoch = store.take_epoch(JOB, "test")
        written = record(0, epoch)
        store.put_batch(JOB, epoch, written)
        old = group.kill_primary()
        group.promoted(old)
        assert store.get_batch(JOB, Q, 0).to_json() == written.to_json()
        with pytest.raises(ReplicationError):  # the new master has no replica yet: nothing is acted on unreplicated
            store.mark_done(JOB, epoch, Q, 0, "L0-0")
        group.rejoin(old)
        store.mark_done(JOB, epoch, Q, 0, "L0-1")
        assert store.done_labels(JOB, Q, 0) >= {"L0-1"}


def to_legacy_layout(client: redis.Redis, job: str) -> list[str]:
    """Rename a job's keys to the layout releases before the Cluster hash tag wrote (`streaming-sink:<job>:<name>`,
    same values): what an upgraded deployment finds in its Redis."""
    renamed = []
    for key in sorted(client.scan_iter(match=f"streaming-sink:{{{job}}}:*")):
        old = key.decode().replace(f"{{{job}}}", job, 1)
        client.rename(key, old)
        renamed.append(old)
    return renamed


def test_a_journal_in_the_old_layout_is_read_then_moved_and_its_old_driver_fenced(redis_server):
    store = RedisStateStore(redis_server.url)
    epoch = store.take_epoch(JOB, "release-before")
    store.put_batch(JOB, epoch, record(0, epoch, BatchState.COMMITTED))
    prepared = record(1, epoch)
    store.put_batch(JOB, epoch, prepared)
    store.mark_done(JOB, epoch, Q, 1, "L1-0")
    store.add_intent(JOB, epoch, Q, 2, TxnRef("clickhouse", "db", "t", "L2-0", 0, f"e{epoch}w0t0"))
    with redis_server.client() as client:
        legacy = to_legacy_layout(client, JOB)
    assert f"streaming-sink:{JOB}:epoch" in legacy and len(legacy) >= 8

    upgraded = RedisStateStore(redis_server.url)  # reads (status, dry runs) find the journal where it is
    assert upgraded.job_ids() == [JOB] and upgraded.current_epoch(JOB) == epoch
    assert upgraded.batch_keys(JOB) == [(Q, 0), (Q, 1), (Q, 2)]
    assert upgraded.get_batch(JOB, Q, 1).to_json() == prepared.to_json()
    assert upgraded.done_labels(JOB, Q, 1) == {"L1-0"} and [r.label for r in upgraded.intents(JOB, Q, 2)] == ["L2-0"]

    new_epoch = upgraded.take_epoch(JOB, "this-release")  # a driver's start moves it under the tag
    assert new_epoch > epoch
    with redis_server.client() as client:
        left = sorted(k.decode() for k in client.scan_iter(match=f"streaming-sink:{JOB}:*"))
        assert left == [f"streaming-sink:{JOB}:epoch"] and int(client.get(left[0])) == new_epoch
        # a driver of the earlier release, still running with its epoch, writes through the old keys: fenced
        with pytest.raises(redis.ResponseError, match=f"FENCED {new_epoch}"):
            client.eval(_FENCED_SCRIPT, 1, f"streaming-sink:{JOB}:epoch", str(epoch), "[]", "", "", "", "")
    fresh = RedisStateStore(redis_server.url)
    assert fresh.batch_keys(JOB) == [(Q, 0), (Q, 1), (Q, 2)] and fresh.job_ids() == [JOB]
    assert fresh.get_batch(JOB, Q, 0).state is BatchState.COMMITTED and fresh.done_labels(JOB, Q, 1) == {"L1-0"}
    with pytest.raises(FencedError):
        fresh.mark_done(JOB, epoch, Q, 1, "L1-1")
    fresh.mark_done(JOB, new_epoch, Q, 1, "L1-1")
    assert fresh.done_labels(JOB, Q, 1) == {"L1-0", "L1-1"}


def test_a_jobs_keys_share_one_cluster_slot(redis_cluster):
    redis_cluster.flush()
    store = open_store(redis_cluster.url)
    epoch = store.take_epoch(JOB, "test")
    store.put_batch(JOB, epoch, record(0, epoch))
    store.add_intent(JOB, epoch, Q, 1, TxnRef("clickhouse", "db", "t", "L1-0", 0, f"e{epoch}w0t0"))
    with redis_cluster.servers[0].client() as client:
        keys = [k.decode() for server in redis_cluster.servers for k in server.client().keys(f"*{JOB}*")]
        slots = {client.cluster("keyslot", key) for key in keys}
    assert len(keys) >= 6 and len(slots) == 1


def test_tls_needs_the_client_certificate(redis_tls_server):
    url = redis_tls_server.url
    without_certificate = url.split("&ssl_certfile=")[0]
    with pytest.raises(StateStoreUnreachableError):  # redis-py's ConnectionError, translated by the store
        open_store(without_certificate).current_epoch(JOB)
    assert open_store(url).current_epoch(JOB) >= 0


@pytest.mark.slow
@pytest.mark.extended  # CI: the old layout read, moved and its old driver fenced (above)
def test_a_job_upgraded_over_a_prepared_batch_in_the_old_layout_is_not_taken_for_a_lost_store(redis_server, tmp_path,
                                                                                           kafka_broker):
    """The driver dies with batch 1 PREPARED, its journal is laid out as the earlier release wrote it, and the job
    of this release recovers the batch from it and ends exact."""
    from tests.support.pipeline import LocalPipeline

    pipeline = LocalPipeline(tmp_path, kafka_broker, redis_server.url)
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-prepared-record@1", run=0) < 0
    with redis_server.client() as client:
        assert f"streaming-sink:{pipeline.job_id}:batch:{next(iter(pipeline.query_ids()))}:1" in to_legacy_layout(
            client, pipeline.job_id)
    pipeline.run_to_completion(first_run=1)
    pipeline.verify()
    assert "found PREPARED" in pipeline.log_tail(1, 400)


@pytest.mark.parametrize("topology", ["redis_sentinels", "redis_cluster"])
def test_operator_commands_take_sentinel_and_cluster_urls(topology, request, capsys):
    import json

    from streaming_sink.cli import main

    where = request.getfixturevalue(topology)
    if topology == "redis_cluster":
        where.flush()
    store = open_store(where.url)
    epoch = store.take_epoch(JOB, "test")
    store.put_batch(JOB, epoch, record(0, epoch, BatchState.COMMITTED))
    assert main(["status", "--state", where.url, "--job", JOB, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["job_id"] == JOB and shown["epoch"]["epoch"] == epoch
    assert [batch["batch_id"] for batch in shown["batches"]] == [0]
