"""Each recovery decision against the real ClickHouse engine (chdb): committed, prepared, intents only, lost."""
from __future__ import annotations

import pyarrow as pa
import pytest

from state import BatchRecord, FileStateStore
from streaming_sink.committable import BatchState
from streaming_sink.recovery import Recovery, ReplayImpossibleError
from streaming_sink.routing import Router
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.writer import ContentChecksum, PartitionWriter, WriteContext
from devstack.pipeline import create_tables, open_target, table_rows

JOB, Q, DB = "job", "query-1", "analytics"


def rows(partition: int, start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" for i in ids],
            "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
            "__table": ["orders" if i % 3 else "payments" for i in ids],
            "kafka_partition": pa.array([partition] * n, pa.int32()),
            "kafka_offset": pa.array(ids, pa.int64()),
        }
    )


@pytest.fixture
def env(tmp_path):
    create_tables(tmp_path / "ch", DB, ["orders", "payments"])
    with open_target(tmp_path / "ch", DB) as target:
        store = FileStateStore(tmp_path / "state")
        epoch = store.take_epoch(JOB, "test")
        router = Router(frozenset(target.routable_tables()), table_column="__table")
        yield target, store, epoch, router


def write_batch(target, store, epoch, router, batch_id, flush_bytes=1 << 20):
    context = WriteContext(JOB, Q, batch_id, epoch, 0, flush_bytes)
    results = []
    for partition in range(2):
        writer = PartitionWriter(context, target, router, store, partition)
        results.append(writer.add_all([rows(partition, partition * 1000 + k * 50, 50) for k in range(3)]))
    committables = [c for r in results for c in r.committables]
    return BatchRecord(Q, batch_id, BatchState.PREPARED, epoch, committables, {r.partition: r.checksum for r in results})


def expected(table):
    out = []
    for partition in range(2):
        for k in range(3):
            b = rows(partition, partition * 1000 + k * 50, 50).to_pylist()
            out += [(r["id"], r["name"], r["amount"], r["kafka_partition"], r["kafka_offset"]) for r in b if r["__table"] == table]
    return sorted(out)


def test_intents_only_are_aborted(env):
    target, store, epoch, router = env
    write_batch(target, store, epoch, router, 1)
    assert len(store.intents(JOB, Q, 1)) == 4  # 2 partitions x 2 tables
    assert len(target.staging_tables()) == 4
    Recovery(target, store, JOB, epoch).abort_intents(Q, 1)
    assert target.staging_tables() == [] and store.intents(JOB, Q, 1) == []
    assert table_rows(target, "orders") == [] and table_rows(target, "payments") == []


def test_prepared_is_committed_exactly_once_even_when_repeated(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, record)
    recovery = Recovery(target, store, JOB, epoch)
    assert recovery.commit_pending(record) == []
    assert store.done_labels(JOB, Q, 1) == {c.label for c in record.committables}
    for committable in record.committables:  # a driver that crashed before recording progress repeats them
        assert target.commit(committable) is CommitOutcome.COMMITTED
    recovery.finish_prepared(record)
    assert store.get_batch(JOB, Q, 1).state is BatchState.COMMITTED
    assert table_rows(target, "orders") == expected("orders")
    assert table_rows(target, "payments") == expected("payments")
    assert target.staging_tables() == [] and store.intents(JOB, Q, 1) == []


def test_commit_interrupted_between_move_and_drop_resumes(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    first = record.committables[0]
    client = target.client()
    for partition_id in target._partitions(first.label)[:1]:  # move one partition only, as a crash would leave it
        client.command(f"ALTER TABLE {DB}.`{first.label}` MOVE PARTITION ID '{partition_id}' TO TABLE {DB}.{first.table}")
    assert target.commit(first) is CommitOutcome.COMMITTED
    assert len(table_rows(target, first.table)) == first.rows


def test_staging_gone_without_ledger_is_aborted_and_fails_loudly_outside_replay(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, record)
    victim = record.committables[1]
    target.client().command(f"DROP TABLE {DB}.`{victim.label}`")  # what an operator or a wipe would do
    assert target.commit(victim) is CommitOutcome.ABORTED  # no commit ever began: never visible
    with pytest.raises(ReplayImpossibleError, match="runbook"):
        Recovery(target, store, JOB, epoch).finish_prepared(record)
    assert store.get_batch(JOB, Q, 1).state is BatchState.PREPARED  # never rolled back, never marked done


def test_sweep_finishes_old_prepared_aborts_old_intents_and_applies_retention(env):
    target, store, epoch, router = env
    prepared = write_batch(target, store, epoch, router, 1)
    store.put_batch(JOB, epoch, prepared)
    write_batch(target, store, epoch, router, 2)  # intents only: a crashed, unprepared batch
    recovery = Recovery(target, store, JOB, epoch)
    recovery.sweep(skip=None, retain_batches=2)
    assert store.get_batch(JOB, Q, 1).state is BatchState.COMMITTED
    assert store.intents(JOB, Q, 2) == [] and target.staging_tables() == []
    assert table_rows(target, "orders") == expected("orders")
    recovery.sweep(skip=None, retain_batches=0)
    assert store.batch_keys(JOB) == []


def test_flush_bound_splits_into_chunks_of_one_transaction(env):
    target, store, epoch, router = env
    record = write_batch(target, store, epoch, router, 1, flush_bytes=1)  # every batch flushes
    assert len(record.committables) == 4  # still one transaction per (table, partition)
    Recovery(target, store, JOB, epoch).finish_prepared(record)
    assert table_rows(target, "orders") == expected("orders")


def test_checksum_is_the_same_after_an_ipc_round_trip():
    batch = rows(0, 0, 100)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    with pa.ipc.open_stream(sink.getvalue()) as reader:
        back = reader.read_next_batch()
    a, b = ContentChecksum(), ContentChecksum()
    a.update(batch)
    b.update(back)
    assert a.hexdigest() == b.hexdigest()
    c = ContentChecksum()
    c.update(rows(0, 1, 100))
    assert c.hexdigest() != a.hexdigest()


def test_writer_memory_is_bounded_by_the_flush_size_not_the_batch(env):
    target, store, epoch, router = env
    flush = 64 * 1024
    context = WriteContext(JOB, Q, 1, epoch, 0, flush)
    writer = PartitionWriter(context, target, router, store, 0)
    batches = [rows(0, k * 500, 500) for k in range(40)]
    biggest = max(b.nbytes for b in batches)
    result = writer.add_all(batches)
    assert sum(b.nbytes for b in batches) > 10 * flush  # the partition is far larger than the bound
    assert writer.peak_buffered_bytes <= 2 * (flush + biggest)  # per table: at most one flush plus one batch
    assert result.rows == 40 * 500 == sum(c.rows for c in result.committables)
