"""A Sentinel failover is ridden through, not restarted through (issue 38, item 7).

The coordinator runs in this process (the real `ExactlyOnceSink`, `PartitionWriter`s over in-memory Arrow batches,
`MemoryTarget`) on a Redis state store located by three Sentinels (Debian's `redis-server`,
tests.support.services.redis.RedisSentinelGroup). At a protocol event the master is SIGKILLed; the Sentinels promote
the replica and the old master comes back as its replica, the way a supervised Redis restarts. The job must go on
without a restart and end with the target exact row by row. Before this, the first store call after the kill
stopped the job with StateStoreUnreachableError (connection refused by the dead master).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.errors import StateStoreUnreachableError
from streaming_sink.records import BatchRecord, BatchState
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import RedisStateStore, open_store
from streaming_sink.targets.memory import MemoryTarget
from tests.support.batches import InMemoryRunner
from tests.support.services._proc import wait_until
from tests.support.services.ports import free_port
from tests.support.services.redis import HOST, RedisSentinelGroup, RedisServer

pytestmark = pytest.mark.slow

TABLE, QUERY, PARTITIONS, ROWS = "t", "query-1", 3, 50
RIDE = "failover_timeout=120"  # a killed master's restart and rejoin can take Sentinel longer than its own bound


def source(batch_id: int) -> list[list[pa.RecordBatch]]:
    """What Spark hands the sink for a batch: the same on every run."""
    base = batch_id * 10_000
    return [[pa.record_batch({"id": [base + p * 1000 + i for i in range(ROWS)], "name": [f"n{i}" for i in range(ROWS)]})]
            for p in range(PARTITIONS)]


def source_ids(*batches: int) -> list[int]:
    return sorted(i for b in batches for part in source(b) for batch in part for i in batch.column("id").to_pylist())


class Failover:
    """SIGKILL the master now; in the background, the Sentinels promote the replica and the old master is started
    again and becomes its replica (until then, journal writes wait for it: the replica count `auto` has seen)."""

    def __init__(self, group: RedisSentinelGroup) -> None:
        self.group = group
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def kill_master(self, before: Callable[[], None] = lambda: None) -> RedisServer:
        old = self.group.kill_primary()
        self.in_background(lambda: (before(), self._finish(old)))
        return old

    def _finish(self, old: RedisServer) -> None:
        self.group.promoted(old)
        self.group.rejoin(old, timeout=120)

    def in_background(self, work: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                work()
            except BaseException as error:  # noqa: BLE001 - reported by join()
                self.error = error
            finally:
                self.done.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def blamed(self) -> Iterator[None]:
        """A failure of the job while the failover ran is reported as the failover's own failure when it had one (a
        failover that never ended is what the job's error then only reflects)."""
        try:
            yield
        except BaseException as job_error:
            if self._thread is not None:
                self._thread.join(timeout=180)
            if self.error is not None:
                raise self.error from job_error
            raise

    def join(self) -> None:
        assert self._thread is not None, "no failover happened: the event was never reached"
        self._thread.join(timeout=180)
        if self.error is not None:
            raise self.error
        assert self.done.is_set(), "the failover did not finish"


class FailingOverAt:
    """The store, with the master killed when the sink reaches a protocol event: right after the call `method` whose
    arguments `when` accepts returned (the next journal write or read meets a dead master)."""

    def __init__(self, store: RedisStateStore, method: str, when: Callable[..., bool], failover: Failover) -> None:
        self._store, self._method, self._when, self._failover = store, method, when, failover
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name != self._method:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if not self.fired and self._when(*args, **kwargs):
                self.fired = True
                self._failover.kill_master()
            return result

        return call


def _prepared(batch: int) -> Callable[..., bool]:
    return lambda job, epoch, record: record.batch_id == batch and record.state is BatchState.PREPARED and not record.sent


def _sent(batch: int) -> Callable[..., bool]:
    return lambda job, epoch, record: record.batch_id == batch and bool(record.sent)


def _committed(batch: int) -> Callable[..., bool]:
    return lambda job, epoch, record: record.batch_id == batch and record.state is BatchState.COMMITTED


def _of_batch(batch: int) -> Callable[..., bool]:
    return lambda job, epoch, query, batch_id, *rest: batch_id == batch


EVENTS = {
    "after-an-intent": ("add_intent", _of_batch(1)),  # writers at work, nothing prepared
    "after-prepared-record": ("put_batch", _prepared(1)),  # the commit point, no commit sent
    "after-sent": ("put_batch", _sent(1)),  # the commits are about to go out
    "between-commits": ("mark_done_many", _of_batch(1)),  # one commit recorded, others not
    "after-committed-record": ("put_batch", _committed(1)),  # the next batch meets the dead master
}


def _sink(target: MemoryTarget, store: Any, job: str) -> ExactlyOnceSink:
    return ExactlyOnceSink(target, store, job, table=TABLE, runner=InMemoryRunner(), heartbeat_seconds=None)


#: in CI: the commit point and the middle of the commits; the other events' rides run in the extended suite
CI_EVENTS = ("after-prepared-record", "between-commits")


@pytest.mark.parametrize("event", [event if event in CI_EVENTS else pytest.param(event, marks=pytest.mark.extended)
                                   for event in sorted(EVENTS)])
def test_the_job_rides_a_failover_at_each_protocol_event(redis_sentinels, event):
    job = f"ride-{event}"
    store = open_store(f"{redis_sentinels.url}?{RIDE}")
    assert isinstance(store, RedisStateStore)
    failover = Failover(redis_sentinels)
    method, when = EVENTS[event]
    target = MemoryTarget()
    sink = _sink(target, FailingOverAt(store, method, when, failover), job)
    first_master = redis_sentinels.master_port()
    with failover.blamed():
        for batch_id in range(3):
            sink.process(source(batch_id), batch_id, QUERY)  # no restart: the same sink, batch after batch
    failover.join()
    assert redis_sentinels.master_port() != first_master, "the master never changed: the test proved nothing"
    assert sorted(row["id"] for row in target.rows(TABLE)) == source_ids(0, 1, 2)
    assert all(store.get_batch(job, QUERY, b).state is BatchState.COMMITTED for b in range(3))  # type: ignore[union-attr]


def test_a_prepared_record_only_the_dead_master_had_is_written_again_before_anything_acts_on_it(redis_sentinels):
    """The write nobody was answered for: the PREPARED record reaches the master, whose replica was cut off, and the
    master dies while the write waits for the replica. The promoted replica never had the record. Nothing acted on it
    (the write had not returned: WAIT), so the store writes it again on the new master, waits for its replica, and
    only then does the sink commit; the batch lands once."""
    job = "ride-lost-write"
    store = open_store(f"{redis_sentinels.url}?{RIDE}")
    failover = Failover(redis_sentinels)
    key = f"streaming-sink:{{{job}}}:batch:{QUERY}:1"
    lacked: list[bool] = []

    class CutOffBeforeThePreparedRecord:
        def __getattr__(self, name: str) -> Any:
            attribute = getattr(store, name)
            if name != "put_batch":
                return attribute

            def call(job_id: str, epoch: int, record: BatchRecord) -> None:
                if _prepared(1)(job_id, epoch, record) and not failover.done.is_set() and not lacked:
                    _kill_once_the_master_alone_has(key, redis_sentinels, failover, lacked)
                attribute(job_id, epoch, record)

            return call

    target = MemoryTarget()
    sink = _sink(target, CutOffBeforeThePreparedRecord(), job)
    with failover.blamed():
        for batch_id in range(3):
            sink.process(source(batch_id), batch_id, QUERY)
    failover.join()
    assert lacked == [True], "the promoted replica had the record: the write was not lost, the test proved nothing"
    assert sorted(row["id"] for row in target.rows(TABLE)) == source_ids(0, 1, 2)
    assert all(store.get_batch(job, QUERY, b).state is BatchState.COMMITTED for b in range(3))  # type: ignore[union-attr]


def _kill_once_the_master_alone_has(key: str, group: RedisSentinelGroup, failover: Failover, lacked: list[bool]) -> None:
    """Cut the replica off (paused until the master drops it), then, in the background: once the master holds `key`
    (the write is waiting for the replica), kill the master, let the replica run again and note whether it had `key`
    while it was still a replica (no client can write to a replica), and let the failover finish."""
    master = group.master()
    replica = group.detach_replica()

    def on_the_master_only() -> bool:
        with master.client() as client:
            return bool(client.exists(key))

    def kill() -> None:
        wait_until(on_the_master_only, timeout=30, what="the record on the master")
        master.kill()
        replica.resume()
        with replica.client() as client, client.pipeline(transaction=True) as pipe:
            pipe.info("replication").exists(key)
            info, exists = pipe.execute()
        assert info["role"] == "slave", "the replica was promoted before it could be read"
        lacked.append(not exists)
        assert group.promoted(master) is replica
        group.rejoin(master, timeout=120)

    failover.in_background(kill)


def test_a_failover_without_an_end_fails_at_the_bound(tmp_path):
    """No master comes back: the call is tried for `failover_timeout`, then fails as before."""
    with RedisSentinelGroup(tmp_path / "sentinels") as group:
        store = open_store(f"{group.url}?failover_timeout=2")
        epoch = store.take_epoch("gone", "test")
        for server in group.servers:
            server.kill()
        started = time.monotonic()
        with pytest.raises(StateStoreUnreachableError):
            store.beat("gone", epoch, time.time())
        assert 2 <= time.monotonic() - started < 30


def test_a_store_never_reached_fails_at_once():
    """A wrong URL or a Redis that is not there is not a failover: the first call fails as before, without waiting."""
    store = open_store(f"redis+sentinel://{HOST}:{free_port()}/journal?failover_timeout=60")
    started = time.monotonic()
    with pytest.raises(StateStoreUnreachableError):
        store.current_epoch("job")
    assert time.monotonic() - started < 10


def test_the_bound_is_the_sentinels_own_failover_time_and_doctor_says_it(redis_sentinels):
    """Without `failover_timeout` the store asks the Sentinels: down-after-milliseconds plus twice the failover-timeout
    of the master (1 s + 2 × 3 s in RedisSentinelGroup): a failover whose first attempt failed, or one that follows
    another, starts only twice the failover-timeout after the last one started."""
    found = open_store(redis_sentinels.url).durability().found
    assert "rides a failover for up to 7 s" in found, found
    assert "rides a failover for up to 120 s" in open_store(f"{redis_sentinels.url}?{RIDE}").durability().found


@pytest.fixture(autouse=True)
def _group_whole_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests share the module's group: leave it with a master and its replica for the next one, whatever a failed
    test left (a paused replica, a killed master)."""
    yield
    if "redis_sentinels" in request.fixturenames:
        group: RedisSentinelGroup = request.getfixturevalue("redis_sentinels")
        for server in group.servers:
            if server.running:
                server.resume()
            else:
                group.rejoin(server, timeout=120)
