"""Both state stores keep the same promises: fencing (I5), sealing, atomic records, retention."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.records import BatchState
from streaming_sink.state import (
    BatchRecord,
    BatchSealedError,
    FencedError,
    FileStateStore,
    MemoryStateStore,
    RedisStateStore,
    StateStoreLostError,
    open_store,
)
from streaming_sink.state.redis import RedisKeys

JOB = "job-1"
Q = "query-a"


def ref(label: str, partition: int = 0, attempt: str = "e1w0t0") -> TxnRef:
    return TxnRef("clickhouse", "db", "t", label, partition, attempt)


def record(batch: int, state: BatchState = BatchState.PREPARED, epoch: int = 1, n: int = 2) -> BatchRecord:
    committables = [Committable("clickhouse", "db", "t", f"L{batch}-{i}", i, "e1w0t0", rows=i + 1, checksum="c") for i in range(n)]
    return BatchRecord(Q, batch, state, epoch, committables, checksums={i: f"{i}:x" for i in range(n)})


#: Redis topologies (tests/support/fixtures.py), each shared by this module's tests and emptied before each one:
#: a Sentinel-watched primary whose writes wait for its replica, a three-master Cluster, a TLS-only server.
_SHARED_REDIS = {"redis-sentinel": "redis_sentinels", "redis-cluster": "redis_cluster", "rediss": "redis_tls_server"}


@pytest.fixture(params=["file", "redis", "memory", *_SHARED_REDIS])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStateStore()
    elif request.param == "file":
        yield FileStateStore(tmp_path / "state")
    else:
        shared = request.param in _SHARED_REDIS
        server = request.getfixturevalue(_SHARED_REDIS[request.param] if shared else "redis_server")
        if shared:
            _flush(server)
        s = open_store(server.url)
        yield s
        s.close()


def _flush(topology) -> None:
    if hasattr(topology, "flush"):
        topology.flush()
        return
    server = topology.master() if hasattr(topology, "master") else topology
    with server.client() as client:
        client.flushall()


def test_open_store_urls(tmp_path):
    assert isinstance(open_store(f"file://{tmp_path}"), FileStateStore)
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisStateStore)
    for bad in ("file://relative/path", "s3://bucket/x", "redis"):
        with pytest.raises(ValueError, match="state store URL"):
            open_store(bad)


def test_record_roundtrip_and_progress(store):
    epoch = store.take_epoch(JOB, "test")
    assert store.get_batch(JOB, Q, 5) is None
    rec = record(5, epoch=epoch)
    store.put_batch(JOB, epoch, rec)
    got = store.get_batch(JOB, Q, 5)
    assert got.to_json() == rec.to_json()
    store.mark_done(JOB, epoch, Q, 5, "L5-0")
    store.mark_done(JOB, epoch, Q, 5, "L5-0")
    assert store.done_labels(JOB, Q, 5) == {"L5-0"}
    store.mark_done_many(JOB, epoch, Q, 5, ["L5-1", "L5-0", "L5-2"])  # a group of progress marks: one write
    store.mark_done_many(JOB, epoch, Q, 5, [])
    assert store.done_labels(JOB, Q, 5) == {"L5-0", "L5-1", "L5-2"}


def test_intents_and_sealing(store):
    epoch = store.take_epoch(JOB, "test")
    store.add_intent(JOB, epoch, Q, 3, ref("a"))
    store.add_intent(JOB, epoch, Q, 3, ref("b", 1))
    assert [r.label for r in store.intents(JOB, Q, 3)] == ["a", "b"]
    assert store.batch_keys(JOB) == [(Q, 3)]
    store.remove_intents(JOB, epoch, Q, 3, ["a"])
    assert [r.label for r in store.intents(JOB, Q, 3)] == ["b"]
    prepared = record(3, BatchState.PREPARED, epoch)
    store.put_batch(JOB, epoch, prepared)
    with pytest.raises(BatchSealedError):  # the PREPARED record closes the batch to every writer...
        store.add_intent(JOB, epoch, Q, 3, ref("late-twin", attempt="e1w0t7"))
    store.put_batch(JOB, epoch, replace(prepared, open_attempt="e1w1"))
    store.add_intent(JOB, epoch, Q, 3, ref("replay", attempt="e1w1t3"))  # ...but the replay pass it opens
    with pytest.raises(BatchSealedError):
        store.add_intent(JOB, epoch, Q, 3, ref("other-pass", attempt="e1w12t3"))
    store.put_batch(JOB, epoch, record(3, BatchState.COMMITTED, epoch))
    with pytest.raises(BatchSealedError):
        store.add_intent(JOB, epoch, Q, 3, ref("zombie", attempt="e1w1t3"))
    assert {r.label for r in store.intents(JOB, Q, 3)} == {"b", "replay"}


def test_a_writer_confirms_its_intent_after_begin(store):
    """R6: the re-check after begin fails once the driver aborted the intent or closed the batch."""
    epoch = store.take_epoch(JOB, "test")
    store.add_intent(JOB, epoch, Q, 4, ref("a"))
    store.confirm_intent(JOB, epoch, Q, 4, ref("a"))
    store.remove_intents(JOB, epoch, Q, 4, ["a"])  # the driver's abort came between add and begin
    with pytest.raises(BatchSealedError, match="aborted before it began"):
        store.confirm_intent(JOB, epoch, Q, 4, ref("a"))
    store.add_intent(JOB, epoch, Q, 4, ref("b"))
    store.put_batch(JOB, epoch, record(4, BatchState.PREPARED, epoch))  # the decision came before the begin
    with pytest.raises(BatchSealedError):
        store.confirm_intent(JOB, epoch, Q, 4, ref("b"))
    newer = store.take_epoch(JOB, "newer")
    with pytest.raises(FencedError, match=f"but epoch {newer}"):
        store.confirm_intent(JOB, epoch, Q, 4, ref("b"))


def test_epochs_never_go_back_below_the_floor(store):
    """R2: a wiped store restarts its counter; the checkpoint's high-water mark keeps epochs rising."""
    assert store.take_epoch(JOB, "a") == 1
    assert store.take_epoch(JOB, "b", at_least=7) == 7
    assert store.take_epoch(JOB, "c", at_least=3) == 8
    assert store.epoch_owner(JOB)["epoch"] == 8 and store.epoch_owner(JOB)["owner"] == "c"


def test_an_epoch_the_store_no_longer_has_is_a_lost_store_not_a_newer_driver(store):
    epoch = store.take_epoch(JOB, "a")
    other = "job-never-seen"  # a wiped store, or a file store on another host: epoch 0
    with pytest.raises(StateStoreLostError, match="the state store's newest epoch is 0: the store has lost state"):
        store.put_batch(other, epoch, record(1, epoch=epoch))
    with pytest.raises(StateStoreLostError):
        store.add_intent(other, epoch, Q, 1, ref("x"))


def test_fencing_refuses_every_write_of_an_older_epoch(store):
    old = store.take_epoch(JOB, "driver-a")
    new = store.take_epoch(JOB, "driver-b")
    assert new > old and store.current_epoch(JOB) == new
    writes = [
        lambda: store.put_batch(JOB, old, record(1, epoch=old)),
        lambda: store.add_intent(JOB, old, Q, 1, ref("x")),
        lambda: store.remove_intents(JOB, old, Q, 1, ["x"]),
        lambda: store.mark_done(JOB, old, Q, 1, "x"),
        lambda: store.mark_done_many(JOB, old, Q, 1, ["x", "y"]),
        lambda: store.delete_batch(JOB, old, Q, 1),
    ]
    for write in writes:
        with pytest.raises(FencedError, match=f"holds fencing epoch {old}, but epoch {new}"):
            write()
    assert store.get_batch(JOB, Q, 1) is None and store.intents(JOB, Q, 1) == [] and store.done_labels(JOB, Q, 1) == set()
    store.put_batch(JOB, new, record(1, epoch=new))  # the new driver writes fine
    assert store.get_batch(JOB, Q, 1).epoch == new


def test_no_write_lands_after_a_newer_epoch_is_taken(store):
    """The epoch check and the write are one atomic step: a racing old driver cannot slip one in."""
    old = store.take_epoch(JOB, "driver-a")
    fenced = threading.Event()
    sequence = []

    def old_driver() -> None:
        n = 0
        while True:
            rec = replace(record(1, epoch=old), timings={"seq": float(n)})
            try:
                store.put_batch(JOB, old, rec)
            except FencedError:
                fenced.set()
                return
            sequence.append(n)
            n += 1

    thread = threading.Thread(target=old_driver)
    thread.start()
    deadline = time.monotonic() + 10
    while not sequence and time.monotonic() < deadline:
        time.sleep(0.001)
    store.take_epoch(JOB, "driver-b")
    seen_after_fence = store.get_batch(JOB, Q, 1).timings["seq"]
    thread.join(timeout=10)
    assert fenced.is_set()
    assert store.get_batch(JOB, Q, 1).timings["seq"] == seen_after_fence


def test_batch_keys_ordered_and_delete(store):
    epoch = store.take_epoch(JOB, "t")
    for batch in (10, 2, 7):
        store.put_batch(JOB, epoch, record(batch, epoch=epoch))
    store.add_intent(JOB, epoch, "other-query", 1, ref("o"))
    assert store.batch_keys(JOB) == [("other-query", 1), (Q, 2), (Q, 7), (Q, 10)]
    store.delete_batch(JOB, epoch, Q, 7)
    assert store.get_batch(JOB, Q, 7) is None
    assert (Q, 7) not in store.batch_keys(JOB)


def test_redis_restart_keeps_state(redis_server):
    s = RedisStateStore(redis_server.url)
    epoch = s.take_epoch(JOB, "t")
    written = record(1, epoch=epoch)
    s.put_batch(JOB, epoch, written)
    s.add_intent(JOB, epoch, Q, 2, ref("i"))
    s.close()
    redis_server.restart()
    s = RedisStateStore(redis_server.url)
    assert s.get_batch(JOB, Q, 1).to_json() == written.to_json()
    assert [r.label for r in s.intents(JOB, Q, 2)] == ["i"]
    assert s.current_epoch(JOB) == epoch


_WRITER = r"""
import sys
from streaming_sink.state import FileStateStore, BatchRecord
from streaming_sink.committable import Committable
from streaming_sink.records import BatchState
store = FileStateStore(sys.argv[1])
epoch = store.take_epoch("job", "w")
n = 0
while True:
    cs = [Committable("clickhouse", "db", "t", f"label-{n}-{i}", i, "a", rows=n) for i in range(200)]
    store.put_batch("job", epoch, BatchRecord("q", 1, BatchState.PREPARED, epoch, cs, timings={"seq": float(n)}))
    if n == 0:
        print("ready", flush=True)
    n += 1
"""


def test_file_store_records_survive_kill_minus_9_mid_write(tmp_path):
    """Kill a writer at arbitrary instants: the record is always a complete, consistent version."""
    for attempt in range(5):
        root = tmp_path / f"s{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 * (attempt + 1))  # the kill instant, not a synchronisation
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        rec = FileStateStore(root).get_batch("job", "q", 1)
        seq = int(rec.timings["seq"])
        assert len(rec.committables) == 200
        assert all(c.rows == seq and c.label.startswith(f"label-{seq}-") for c in rec.committables)
        leftovers = [p for p in (root / "job" / "batches" / "q").iterdir() if p.name.startswith(".")]
        assert len(leftovers) <= 1  # at most the temp file of the write that was cut short


def test_doctor_warns_about_a_redis_without_append_only_file(redis_server) -> None:
    store = RedisStateStore(redis_server.url)
    durability = store.durability()  # the fixture's server: appendonly yes, appendfsync always, no replica
    assert durability.warning is None and "appendonly yes, appendfsync always, 0 replica(s)" in durability.found
    # (turned off last: turning it on at run time starts an AOF rewrite that holds up the server's shutdown)
    store._client.config_set("appendonly", "no")
    assert "appendonly is off" in store.durability().warning
    store.close()


def test_job_ids_name_every_job_with_an_epoch_or_a_batch(store):
    assert store.job_ids() == []
    store.take_epoch("job-b", "t")
    epoch = store.take_epoch(JOB, "t")
    store.put_batch(JOB, epoch, record(1, epoch=epoch))
    assert store.job_ids() == [JOB, "job-b"]


def test_file_store_reads_create_nothing(tmp_path):
    """`status` and the dry runs read: a mistyped root or job id must stay unknown, not become an empty job."""
    root = tmp_path / "state"
    store = FileStateStore(root)
    assert store.epoch_owner("demo") is None and store.current_epoch("demo") == 0
    assert store.batch_keys("demo") == [] and store.get_batch("demo", Q, 1) is None
    assert store.intents("demo", Q, 1) == [] and store.done_labels("demo", Q, 1) == set()
    assert store.job_ids() == []
    assert not root.exists()
    epoch = store.take_epoch("demo", "t")  # writes still create what they need
    store.add_intent("demo", epoch, Q, 1, ref("a"))
    assert store.job_ids() == ["demo"]
    (root / "stray").mkdir()  # a folder left by an older `status`: not a job
    assert FileStateStore(root).job_ids() == ["demo"]
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    store.batch_keys("other"), store.epoch_owner("other"), store.intents("other", Q, 1)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_redis_url_is_redacted_but_still_connects(tmp_path):
    """S1: the password stays out of `url`, repr and errors; the raw URL still connects, in tasks too (pickled)."""
    import pickle

    from streaming_sink.state import StateStoreError
    from streaming_sink.state.redis import redact_url
    from tests.support.services.redis import RedisServer

    assert redact_url("rediss://user:pw@h:6380/2") == "rediss://***@h:6380/2"
    assert redact_url("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?password=***&db=1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    secret = "s3cr3t-pw-Zq9"
    with RedisServer(tmp_path / "redis", password=secret) as server:
        s = RedisStateStore(server.url)
        assert secret not in s.url and secret not in repr(s) and secret not in json.dumps({"u": s.url})
        assert s.url == f"redis://***@127.0.0.1:{server.port}/0"
        epoch = s.take_epoch(JOB, "t")
        again = pickle.loads(pickle.dumps(s))  # how a Spark task gets the store (execution.py)
        assert again.current_epoch(JOB) == epoch and again.url == s.url
        again.close()
        server.client(password=secret).set(RedisKeys("streaming-sink", JOB).intents(Q, 1), "not a hash")
        with pytest.raises(StateStoreError) as caught:
            s.add_intent(JOB, epoch, Q, 1, ref("a"))
        assert "WRONGTYPE" in str(caught.value) and "***@" in str(caught.value)
        assert secret not in str(caught.value) and secret not in repr(caught.value)
        s.close()


def _record_path(store: FileStateStore, batch: int) -> os.PathLike[str]:
    return store.layout.batch_file(JOB, Q, batch, "record")


def _raw_record(store, batch: int) -> str:
    """The batch record as the store holds it."""
    if isinstance(store, MemoryStateStore):
        return store._records[(JOB, Q, batch)]
    if isinstance(store, FileStateStore):
        return open(_record_path(store, batch)).read()
    return store._client.get(store._keys(JOB).batch(Q, batch))


def _put_raw_record(store, batch: int, text: str) -> None:
    """What a newer release would leave in the store."""
    if isinstance(store, MemoryStateStore):
        store._records[(JOB, Q, batch)] = text
    elif isinstance(store, FileStateStore):
        with open(_record_path(store, batch), "w") as handle:
            handle.write(text)
    else:
        store._client.set(store._keys(JOB).batch(Q, batch), text)


def test_records_carry_their_format_version_and_a_newer_one_is_refused(store):
    from streaming_sink.committable import JOURNAL_FORMAT, JournalFormatError

    epoch = store.take_epoch(JOB, "test")
    assert set(store.epoch_owner(JOB)) == {"epoch", "owner", "at", "seen"} and store.epoch_owner(JOB)["epoch"] == epoch
    store.put_batch(JOB, epoch, record(1, epoch=epoch))
    store.add_intent(JOB, epoch, Q, 2, ref("I"))
    stored = json.loads(_raw_record(store, 1))
    assert stored["v"] == 1 and all(c["v"] == 1 for c in stored["committables"])
    assert store.intents(JOB, Q, 2) == [ref("I")]
    newer = JOURNAL_FORMAT + 1
    _put_raw_record(store, 1, json.dumps({**stored, "v": newer}))
    with pytest.raises(JournalFormatError, match=f"batch record of format version {newer} was written by a newer streaming-sink"):
        store.get_batch(JOB, Q, 1)


def test_a_heartbeat_counts_for_the_epoch_that_wrote_it_and_a_fenced_one_is_refused(store):
    """What an operator command reads to tell a running driver from a dead one (liveness.py)."""
    epoch = store.take_epoch(JOB, "host:1")
    assert store.epoch_owner(JOB)["seen"] is None
    store.beat(JOB, epoch, 1000.5)
    assert store.epoch_owner(JOB)["seen"] == 1000.5 and store.epoch_owner(JOB)["owner"] == "host:1"
    newer = store.take_epoch(JOB, "host:2")
    assert store.epoch_owner(JOB)["seen"] is None  # the old holder's beat says nothing of the new one
    with pytest.raises(FencedError):
        store.beat(JOB, epoch, 1001.0)
    store.beat(JOB, newer, 1002.0)
    assert store.epoch_owner(JOB) == {"epoch": newer, "owner": "host:2", "at": store.epoch_owner(JOB)["at"], "seen": 1002.0}
