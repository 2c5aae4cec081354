"""The journal's key layout and file paths, frozen: a layout change is a journal change (docs/design.md)."""
from __future__ import annotations

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, FileStateStore, open_store

JOB, QUERY = "orders.ingest-1", "q-1"

#: what one job leaves after: an epoch and a beat, batch 7 prepared with a done label, batch 8 holding an intent
REDIS_KEYS = {
    "streaming-sink:{orders.ingest-1}:epoch": "string",
    "streaming-sink:{orders.ingest-1}:owner": "string",
    "streaming-sink:{orders.ingest-1}:seen": "string",
    "streaming-sink:{orders.ingest-1}:index": "set",
    "streaming-sink:{orders.ingest-1}:batch:q-1:7": "string",
    "streaming-sink:{orders.ingest-1}:gate:q-1:7": "string",
    "streaming-sink:{orders.ingest-1}:done:q-1:7": "set",
    "streaming-sink:{orders.ingest-1}:intents:q-1:8": "hash",
}
REDIS_INDEX = {"q-1|7", "q-1|8"}
FILES = {
    "orders.ingest-1/.lock",
    "orders.ingest-1/epoch.json",
    "orders.ingest-1/batches/q-1/7.record.json",
    "orders.ingest-1/batches/q-1/7.done.json",
    "orders.ingest-1/batches/q-1/8.intents.json",
}


def _write_sample_job(store) -> None:
    epoch = store.take_epoch(JOB, "layout test")
    store.beat(JOB, epoch, 1.0)
    committable = Committable("clickhouse", "db", "t", "L7-0", 0, "e1w0t0", rows=1, checksum="c")
    store.put_batch(JOB, epoch, BatchRecord(QUERY, 7, BatchState.PREPARED, epoch, [committable], checksums={0: "0:x"}))
    store.mark_done(JOB, epoch, QUERY, 7, "L7-0")
    store.add_intent(JOB, epoch, QUERY, 8, TxnRef("clickhouse", "db", "t", "L8-0", 0, "e1w0t0"))
    assert store.batch_keys(JOB) == [(QUERY, 7), (QUERY, 8)] and store.job_ids() == [JOB]


def test_file_store_paths_are_frozen(tmp_path):
    store = FileStateStore(tmp_path)
    _write_sample_job(store)
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == FILES


def test_redis_store_keys_are_frozen(redis_server):
    store = open_store(redis_server.url)
    try:
        _write_sample_job(store)
        with redis_server.client() as client:
            found = {k.decode() if isinstance(k, bytes) else k: None for k in client.scan_iter("*")}
            kinds = {key: (t.decode() if isinstance(t, bytes) else t) for key in found if (t := client.type(key))}
            members = {m.decode() if isinstance(m, bytes) else m for m in client.smembers(f"streaming-sink:{{{JOB}}}:index")}
        assert kinds == REDIS_KEYS
        assert members == REDIS_INDEX
    finally:
        store.close()
