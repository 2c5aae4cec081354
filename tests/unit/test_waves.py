"""Commit waves, piece by piece: the journal's record of a plan, a wave's writer, a wave's replay plan, the sink's
budget options and the servers' limits. The protocol end to end: tests/integration/test_commit_waves.py, tests/sim."""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.batch_log import BatchLog
from streaming_sink.batch_plan import BatchPlan
from streaming_sink.committable import BASE_FORMAT, JOURNAL_FORMAT, Committable, TxnRef
from streaming_sink.labels import WAVE_STRIDE, partition_wave, wave_partition
from streaming_sink.records import BatchRecord, BatchState
from streaming_sink.replay import ReplayPlan
from streaming_sink.routing import Router
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.status import job_status, render_status
from streaming_sink.targets.base import ConfigurationError
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.memory import MemoryTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from streaming_sink.writer import PartitionWriter, WriteContext

PLAN = BatchPlan({"a": 2, "b": 2, "c": 2}, (("a", "b"), ("c",)), budget=4)


def committable(table: str, partition: int, label: str, **fields: Any) -> Committable:
    return Committable("memory", "db", table, label, partition, "e1w0t1", rows=1, checksum="1:x", **fields)


# -- the journal --------------------------------------------------------------------------------------------------


def test_a_record_in_waves_is_written_in_the_new_format_and_one_in_one_round_as_before() -> None:
    """A release before waves would take wave 0 for the whole batch: it must refuse the record. A plan of one wave
    (spread only) changes nothing an older release reads, so the record keeps the old version."""
    waves = BatchRecord("q", 3, BatchState.PREPARED, 1, [committable("a", 0, "L0")], plan=PLAN)
    data = json.loads(waves.to_json())
    assert data["v"] == JOURNAL_FORMAT == 2 and data["waves_prepared"] == 1
    assert BatchRecord.from_json(waves.to_json()) == waves and waves.next_wave == 1
    one_round = BatchRecord("q", 3, BatchState.PREPARED, 1, [], plan=BatchPlan({"a": 1}, (("a",),), spread=True))
    assert json.loads(one_round.to_json())["v"] == BASE_FORMAT == 1 and one_round.next_wave is None
    unplanned = BatchRecord("q", 3, BatchState.PREPARED, 1, [])
    assert "plan" not in json.loads(unplanned.to_json()) and unplanned.next_wave is None


def test_a_wave_is_added_to_the_record_behind_its_own_gate() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch("job", "me")
    batch = BatchLog.prepare(store, "job", epoch, BatchRecord("q", 0, BatchState.PREPARED, epoch,
                                                              [committable("a", 0, "L0")], {0: "1:x"}, plan=PLAN))
    batch.open_wave("e1w1")
    assert store.get_batch("job", "q", 0).open_attempt == "e1w1"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="wave 2 recorded, but the next is 1"):
        batch.add_wave(2, [], {}, 0)
    batch.add_wave(1, [committable("c", WAVE_STRIDE, "L1")], {WAVE_STRIDE: "1:x"}, 1)
    stored = store.get_batch("job", "q", 0)
    assert stored is not None and stored.open_attempt is None and stored.next_wave is None
    assert [c.label for c in stored.committables] == ["L0", "L1"] and stored.checksums == {0: "1:x", WAVE_STRIDE: "1:x"}


# -- a wave's writer ------------------------------------------------------------------------------------------------


def write(wave: int, plan: BatchPlan | None, partition: int = 2) -> tuple[Any, MemoryTarget]:
    target = MemoryTarget(database="db")
    context = WriteContext("job", "q", 0, 1, wave, 1 << 20, plan=plan, wave=wave)
    store = MemoryStateStore()
    store.take_epoch("job", "me")
    writer = PartitionWriter(context, target, Router(None, None, "__table"), store, partition, 7)
    rows = pa.record_batch({"__table": ["a", "b", "c", "a", "dlq"], "id": [1, 2, 3, 4, 5]})
    return writer.add_all([rows]), target


def test_a_wave_writes_its_own_tables_under_its_own_partition_numbers_and_counts_their_rows_only() -> None:
    first, _ = write(0, PLAN)
    assert {c.table for c in first.committables} == {"a", "b"} and first.rows == 3 and first.partition == 2
    # the last wave also takes the tables the plan does not name (here a dead-letter table): no row is in no wave
    last, _ = write(1, PLAN)
    assert {c.table for c in last.committables} == {"c", "dlq"} and last.rows == 2
    assert last.partition == WAVE_STRIDE + 2 and {c.partition for c in last.committables} == {WAVE_STRIDE + 2}
    assert partition_wave(last.partition) == 1
    # one digest of the whole partition in every wave: a replay recognises the partition whatever its wave
    assert first.checksum == last.checksum == write(0, None)[0].checksum
    assert write(0, None)[0].rows == 5


def test_waves_never_reuse_a_label_of_another_wave() -> None:
    first, second = write(0, PLAN)[0], write(1, PLAN)[0]
    assert not {c.label for c in first.committables} & {c.label for c in second.committables}
    with pytest.raises(ValueError, match="fewer than"):
        wave_partition(1, WAVE_STRIDE)
    assert wave_partition(3, -4) == -4  # a replay's partition that matches no prepared one stays unmatched


# -- a wave's replay ---------------------------------------------------------------------------------------------


def test_a_replay_of_a_later_wave_matches_that_wave_s_partitions_numbered_as_its_runner_numbers_them() -> None:
    record = BatchRecord("q", 0, BatchState.PREPARED, 1, [
        committable("a", 0, "A0"), committable("a", 1, "A1"),
        committable("c", WAVE_STRIDE, "C0"), committable("c", WAVE_STRIDE + 1, "C1"),
    ], {0: "1:p0", 1: "1:p1", WAVE_STRIDE: "1:p0", WAVE_STRIDE + 1: "1:p1"}, plan=PLAN, waves_prepared=2)
    lost = [c for c in record.committables if c.label == "C1"]
    plan = ReplayPlan.of(record, lost, "job", wave=1)
    assert plan.wants("c", WAVE_STRIDE + 1) and not plan.wants("a", 1)
    assert plan.prepared_partitions == [0, 1]  # the runner numbers a wave's partitions as Spark does
    assert plan.identity({5: "1:p1", 6: "1:p0"}) == {5: 1, 6: 0}  # the writer adds the wave's offset back
    with pytest.raises(ValueError, match="given parts of another wave"):
        ReplayPlan.of(record, lost, "job", wave=0)


# -- the sink's options and the servers' limits --------------------------------------------------------------------


@pytest.mark.parametrize("options, said", [
    ({"transaction_share": 0.0}, "transaction_share must be above 0 and at most 1, got 0.0"),
    ({"transaction_share": 1.5}, "transaction_share must be above 0 and at most 1, got 1.5"),
    ({"spread": "sometimes"}, "spread 'sometimes': one of auto, always, never"),
    ({"spread_above": 0}, "spread_above must be at least 1, got 0"),
])
def test_a_wrong_budget_option_fails_before_anything_runs(options: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{said}$"):
        ExactlyOnceSink(MemoryTarget(database="db"), MemoryStateStore(), "job", table="t", **options)


def test_the_servers_limits_are_their_release_defaults_unless_the_options_give_the_server_s_own() -> None:
    """Before the FE's release is read (at start), the least default of any release; the release defaults themselves
    are read from the emulators in test_transaction_limits.py."""
    starrocks = StarRocksTarget().server_limits()
    assert (starrocks.running_transactions, starrocks.label_memory) == (100, 1000)
    assert "not read yet: the least release default" in starrocks.source
    doris = DorisTarget().server_limits()
    assert (doris.running_transactions, doris.label_memory) == (100, 2000) and "least release default" in doris.source
    tuned = StarRocksTarget(max_running_txn_num_per_db=4000, label_keep_max_num=5000).server_limits()
    assert (tuned.running_transactions, tuned.label_memory) == (4000, 5000) and "(configured)" in tuned.source
    assert DorisTarget(label_num_threshold=-1).server_limits().label_memory is None
    for wrong in ({"max_running_txn_num_per_db": 0}, {"max_running_txn_num_per_db": "many"}):
        with pytest.raises(ConfigurationError, match="max_running_txn_num_per_db must be a positive integer"):
            StarRocksTarget(**wrong)
    with pytest.raises(ConfigurationError, match="label_num_threshold must be positive or -1"):
        DorisTarget(label_num_threshold=0)
    with pytest.raises(ConfigurationError, match="label_keep_max_num must be a positive"):
        StarRocksTarget(label_keep_max_num=-1)


def test_an_intent_of_a_later_wave_names_its_wave() -> None:
    ref = TxnRef("memory", "db", "c", "L", wave_partition(4, 3), "e1w0t1")
    assert partition_wave(TxnRef.from_json(ref.to_json()).partition) == 4


def test_status_shows_how_many_waves_a_batch_has_recorded() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch("job", "me")
    store.put_batch("job", epoch, BatchRecord("q", 0, BatchState.PREPARED, epoch, [committable("a", 0, "L0")],
                                              plan=PLAN))
    store.put_batch("job", epoch, BatchRecord("q", 1, BatchState.PREPARED, epoch, [committable("a", 0, "L1")]))
    status = job_status(store, "job")
    assert [b["waves"] for b in status["batches"]] == [[1, 2], None]
    assert "          waves: 1 of 2 recorded" in render_status(status).splitlines()


def test_a_batch_of_tables_the_caller_expects_is_not_counted_when_they_cannot_pass_the_budget() -> None:
    """A target that cannot list its tables (StarRocks, Doris without `tables`) made every batch count its rows per
    table (one more Spark job) to learn it needed no plan; the packaged job knows its tables and says so."""
    from streaming_sink.batch_plan import ServerLimits
    from tests.support.batches import InMemoryRunner

    class Limited(MemoryTarget):
        def server_limits(self) -> ServerLimits:
            return ServerLimits(1000, 1000, "test")

    class Counting(InMemoryRunner):
        counted = 0

        def table_rows(self, data: Any, router: Router) -> dict[str, int]:
            self.counted += 1
            return super().table_rows(data, router)

    def batch() -> list[list[pa.RecordBatch]]:
        return [[pa.record_batch({"__table": ["a", "b"], "id": [p, p]})] for p in range(4)]

    for expected, counts in ((None, 1), ({"a", "b", "dead_letters"}, 0)):
        runner = Counting()
        sink = ExactlyOnceSink(Limited(), MemoryStateStore(), "job", table_column="__table", runner=runner,
                               heartbeat_seconds=None)
        sink.start()
        if expected is not None:
            sink.expect_tables(expected)
        assert sink.process(batch(), 0, "q").transactions == 8
        assert runner.counted == counts, expected


def test_a_sink_that_cannot_list_its_tables_counts_until_it_has_seen_them_and_again_when_a_new_one_comes() -> None:
    """Without `tables` or `expect_tables`, StarRocks and Doris cannot say how many tables a batch may hold, and every
    batch was counted (a Spark job). The tables of the batches already committed fit the budget: an uncounted pass
    may write those, and a batch with another table is counted and planned after all. Its uncounted pass never
    begins a transaction for the new tables, so it never holds more than the budget allowed the seen ones."""
    from streaming_sink.batch_plan import ServerLimits
    from tests.support.batches import InMemoryRunner

    class Limited(MemoryTarget):
        """Counts the transactions open at once (begun, not yet committed or aborted): the most in each batch."""

        open: set[str] = set()
        peak = 0

        def server_limits(self) -> ServerLimits:
            return ServerLimits(20, 1000, "test")  # a budget of 10 transactions a wave

        def _begin(self, label: str, table: str) -> Any:
            self.open.add(label)
            self.peak = max(self.peak, len(self.open))
            return super()._begin(label, table)

        def _commit(self, label: str) -> Any:
            self.open.discard(label)
            return super()._commit(label)

        def _abort(self, label: str) -> None:
            self.open.discard(label)
            super()._abort(label)

    class Counting(InMemoryRunner):
        counted = 0

        def table_rows(self, data: Any, router: Router) -> dict[str, int]:
            self.counted += 1
            return super().table_rows(data, router)

    def batch(tables: list[str], base: int) -> list[list[pa.RecordBatch]]:
        return [[pa.record_batch({"__table": tables, "id": [base + 10 * p + n for n in range(len(tables))]})]
                for p in range(4)]

    target, runner = Limited(), Counting()
    sink = ExactlyOnceSink(target, MemoryStateStore(), "job", table_column="__table", runner=runner,
                           heartbeat_seconds=None, spread="never")
    sink.start()
    two, five = ["a", "b"], ["a", "b", "c", "d", "e"]
    counts, waves, peaks = [], [], []
    for batch_id, tables in enumerate([two, two, five, five]):
        target.peak = 0
        report = sink.process(batch(tables, 1000 * batch_id), batch_id, "q")
        counts.append(runner.counted)
        waves.append(report.waves)
        peaks.append(target.peak)
    # batch 0: nothing seen, counted; 1: its two tables were seen (2 x 4 writers, within 10); 2: three new tables,
    # counted after an uncounted pass that began none of them (5 x 4 transactions: 3 waves); 3: seen, but 5 x 4
    # passes the budget, so counted again
    assert counts == [1, 1, 2, 3]
    assert waves == [1, 1, 3, 3]  # 2 tables x 4 writers a wave
    assert peaks == [8, 8, 8, 8]  # never past the budget of 10, the uncounted pass of batch 2 included
    for table in five:
        expected = sorted(1000 * b + 10 * p + tables.index(table) for b, tables in enumerate([two, two, five, five])
                          if table in tables for p in range(4))
        assert sorted(row["id"] for row in target.rows(table)) == expected, table


@pytest.mark.parametrize("spread", ["auto", "always"])
def test_a_batch_without_partitions_is_empty_not_a_plan_for_no_writers(spread: str) -> None:
    """Kafka gives a batch whose offset ranges are all empty no Spark partition at all. A sink that cannot list its
    tables (or spreads always) planned it and stopped the job: "writers must be at least 1, got 0" (seen in CI after a
    driver kill, the first batch of the restarted driver)."""
    from streaming_sink.batch_plan import ServerLimits
    from tests.support.batches import InMemoryRunner

    class Limited(MemoryTarget):
        def server_limits(self) -> ServerLimits:
            return ServerLimits(20, 1000, "test")

    target = Limited()
    sink = ExactlyOnceSink(target, MemoryStateStore(), "job", table_column="__table", runner=InMemoryRunner(),
                           heartbeat_seconds=None, spread=spread)
    sink.start()
    assert sink.process([], 0, "q").action == "empty"
    report = sink.process([[pa.record_batch({"__table": ["a"], "id": [1]})]], 1, "q")
    assert report.action == "written" and [row["id"] for row in target.rows("a")] == [1]
