"""The ClickHouse commit ledger stays bounded over many batches (issue 26 item 4), and keeps every row recovery can
still ask for: the real coordinator and writers without Spark, the real engine embedded and over HTTP, the horizon
shrunk so that many horizons pass in one test. And the warning a writer gives when its batch makes so many parts that
ClickHouse could come to refuse inserts (docs/protocol.md, "ClickHouse: one batch, per table")."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import TxnRef
from streaming_sink.labels import label_prefix, make_label
from streaming_sink.records import BatchState
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseTarget
from streaming_sink.targets.clickhouse import ledger as ledger_module
from streaming_sink.targets.clickhouse.staging import MANY_INSERTS
from tests.support.batches import InMemoryRunner

DB, TABLE, JOB, QUERY = "analytics", "orders", "ledger-job", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
PARTITIONS, ROWS = 2, 5
HORIZON, EVERY, RETAIN, BATCHES = 6, 2, 3, 40


class Crash(BaseException):
    """kill -9 of the driver, as seen by the code that was running."""


def source(batch_id: int) -> list[list[pa.RecordBatch]]:
    return [[pa.record_batch({"id": pa.array([batch_id * 100 + p * 10 + i for i in range(ROWS)], pa.int64()),
                              "name": [f"n{i}" for i in range(ROWS)]})] for p in range(PARTITIONS)]


def ledger_rows(target: ClickHouseTarget) -> list[tuple[str, int]]:
    """(label, its batch) of every ledger row: the batch read from the label, as the job's labels all begin alike."""
    prefix = label_prefix(JOB, QUERY)
    labels = [str(r[0]) for r in target.client().query(f"SELECT label FROM {DB}.{LEDGER_TABLE}").result_rows]
    assert all(label.startswith(prefix) for label in labels)
    return [(label, int(label[len(prefix):].split("_")[0])) for label in labels]


@pytest.fixture
def target(clickhouse_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(ledger_module, "HORIZON_BATCHES", HORIZON, raising=False)
    monkeypatch.setattr(ledger_module, "FORGET_EVERY", EVERY, raising=False)
    target = ClickHouseTarget(clickhouse_url, database=DB)
    target.client().command(f"CREATE DATABASE {DB}")
    target.client().command(f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree ORDER BY id")
    yield target
    target.close()


@pytest.mark.slow
def test_the_ledger_stays_bounded_and_answers_for_every_batch_the_journal_keeps(target):
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table=TABLE, runner=InMemoryRunner(), retain_batches=RETAIN, heartbeat_seconds=None)
    for batch_id in range(BATCHES):
        sink.process(source(batch_id), batch_id, QUERY)
        rows = ledger_rows(target)
        # two rows per transaction; a batch's rows go once it is HORIZON behind, at the next deletion (every EVERY)
        assert len({batch for _, batch in rows}) <= HORIZON + EVERY, f"batch {batch_id}: {sorted({b for _, b in rows})}"
        assert len(rows) <= (HORIZON + EVERY) * PARTITIONS * 2
    assert min(batch for _, batch in ledger_rows(target)) >= BATCHES - 1 - HORIZON - EVERY

    # the journal kept its newest batches; the ledger still answers for every label they name, with no staging table
    kept = [store.get_batch(JOB, query, batch) for query, batch in store.batch_keys(JOB)]
    assert [r.batch_id for r in kept if r] == list(range(BATCHES - RETAIN - 1, BATCHES))
    for record in kept:
        assert record is not None and record.state is BatchState.COMMITTED
        for committable in record.committables:
            assert target.commit(committable) is CommitOutcome.COMMITTED, committable.label
    ids = sorted(r[0] for r in target.client().query(f"SELECT id FROM {DB}.{TABLE}").result_rows)
    assert ids == sorted(int(i) for b in range(BATCHES) for part in source(b) for i in part[0].column("id").to_pylist())


@pytest.mark.slow
def test_a_batch_prepared_after_many_horizons_is_recovered_exactly(target, monkeypatch):
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table=TABLE, runner=InMemoryRunner(), retain_batches=RETAIN, heartbeat_seconds=None)
    for batch_id in range(BATCHES - 1):
        sink.process(source(batch_id), batch_id, QUERY)
    commit = ClickHouseTarget.commit
    calls = iter(range(10**6))

    def dies_after_the_first_commit(self: ClickHouseTarget, committable: Any) -> CommitOutcome:
        if next(calls) == 1:
            raise Crash()
        return commit(self, committable)

    monkeypatch.setattr(ClickHouseTarget, "commit", dies_after_the_first_commit)
    with pytest.raises(Crash):
        sink.process(source(BATCHES - 1), BATCHES - 1, QUERY)
    monkeypatch.setattr(ClickHouseTarget, "commit", commit)
    assert store.get_batch(JOB, QUERY, BATCHES - 1).state is BatchState.PREPARED

    again = ClickHouseTarget(target.url, database=DB)  # a new driver: its process has forgotten nothing yet
    restarted = ExactlyOnceSink(again, store, JOB, table=TABLE, runner=InMemoryRunner(), retain_batches=RETAIN, heartbeat_seconds=None)
    restarted.process(source(BATCHES - 1), BATCHES - 1, QUERY)
    ids = sorted(r[0] for r in again.client().query(f"SELECT id FROM {DB}.{TABLE}").result_rows)
    assert ids == sorted(int(i) for b in range(BATCHES) for part in source(b) for i in part[0].column("id").to_pylist())
    assert len({batch for _, batch in ledger_rows(again)}) <= HORIZON + EVERY and again.staging_tables() == []


@pytest.mark.parametrize("inserts", [MANY_INSERTS - 1, MANY_INSERTS])
def test_a_writer_that_inserts_often_enough_to_near_the_parts_limit_is_named_in_a_warning(target, caplog, inserts):
    ref = TxnRef("clickhouse", DB, TABLE, make_label(JOB, QUERY, 1, TABLE, 0, "e1w0t0"), 0, "e1w0t0")
    transaction = target.begin(TABLE, lambda chunk: ref, lambda recorded: None)
    for i in range(inserts):
        transaction.write(pa.table({"id": pa.array([i], pa.int64()), "name": ["n"]}))
    [part] = transaction.prepare()
    assert part.rows == inserts
    warned = [r.getMessage() for r in caplog.records if "parts_to_throw_insert" in r.getMessage()]
    assert warned == ([] if inserts < MANY_INSERTS else [
        f"ClickHouse staging table {ref.label} took {inserts} inserts in this batch: its commit moves at least {inserts} "
        f"parts into each partition of `{DB}`.`{TABLE}` it holds, and inserts into a partition slow down past "
        "parts_to_delay_insert (1000 by default) and fail past parts_to_throw_insert (3000) active parts; raise "
        "sink.flush_bytes or give the table fewer writers"])
    transaction.abort()
