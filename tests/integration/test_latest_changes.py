"""One change per (table, key) per batch (`latest_changes.py`): the latest by version is the one the writers see,
rows that are not changes all pass, and the batch is the same rows in the same partitions in the same order however
its input was ordered: the writers' checksums and replay matching depend on it. Real local Spark.
"""
from __future__ import annotations

import random
from typing import Any

import pytest

from streaming_sink import ExactlyOnceSink
from streaming_sink.changes import DELETE, UPSERT
from streaming_sink.latest_changes import latest_changes
from streaming_sink.state import FileStateStore
from streaming_sink.targets.memory import MemoryTarget

pytestmark = pytest.mark.slow

SCHEMA = "id INT, name STRING, __op INT, __version BIGINT, __table STRING"
Row = tuple[int, str | None, int | None, int | None, str]


def workload(seed: int = 7) -> list[Row]:
    """Changes of 40 keys in two tables, several per key (updates, deletes, re-inserts), and append rows (no `__op`),
    some of them identical twins, which must all stay."""
    pick = random.Random(seed)
    rows: list[Row] = []
    version = 0
    for _ in range(300):
        version += pick.randint(1, 3)
        key, table = pick.randrange(40), pick.choice(["a", "b"])
        op = DELETE if pick.random() < 0.3 else UPSERT
        rows.append((key, None if op == DELETE else f"v{version}", op, version, table))
    rows += [(i % 5, "same", None, None, "log") for i in range(12)]  # append-only rows: twins included
    return rows


def expected(rows: list[Row]) -> list[Row]:
    """The model: for each (table, key) the change with the highest version; every append row."""
    latest: dict[tuple[str, int], Row] = {}
    for row in rows:
        if row[2] is None:
            continue
        seen = latest.get((row[4], row[0]))
        if seen is None or row[3] > seen[3]:
            latest[(row[4], row[0])] = row
    return sorted([*latest.values(), *[r for r in rows if r[2] is None]], key=repr)


def frame(spark: Any, rows: list[Row], partitions: int = 4) -> Any:
    return spark.createDataFrame(rows, SCHEMA).repartition(partitions)


def test_the_latest_change_of_each_key_and_every_append_row_pass(spark):
    rows = workload()
    result = latest_changes(frame(spark, rows), "__table", ["id"])
    assert sorted((tuple(r) for r in result.collect()), key=repr) == expected(rows)


def test_a_delete_then_a_reinsert_in_one_batch_leaves_the_row(spark):
    rows: list[Row] = [(1, "old", UPSERT, 10, "a"), (1, None, DELETE, 11, "a"), (1, "new", UPSERT, 12, "a"),
                       (2, "gone", UPSERT, 10, "a"), (2, None, DELETE, 13, "a")]
    result = latest_changes(frame(spark, rows), "__table", ["id"]).collect()
    assert sorted(tuple(r) for r in result) == [(1, "new", UPSERT, 12, "a"), (2, None, DELETE, 13, "a")]


def test_same_rows_same_partitions_same_order_however_the_input_was_ordered(spark):
    rows = workload()
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    first = latest_changes(frame(spark, rows), "__table", ["id"]).rdd.glom().collect()
    second = latest_changes(frame(spark, shuffled, 4), "__table", ["id"]).rdd.glom().collect()
    assert len(first) == 4  # the batch keeps its writer count
    assert [list(map(tuple, p)) for p in first] == [list(map(tuple, p)) for p in second]
    assert sum(1 for p in first if p) > 1  # spread over the writers, not piled into one


def test_the_sink_hands_its_writers_one_change_per_key(spark, tmp_path):
    rows = workload(11)
    target = MemoryTarget()
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="job",
                           table_column="__table", change_key=["id"])
    sink.process(frame(spark, rows), 0, "q")
    landed = sorted(((r["id"], r["name"], r["__op"], r["__version"], table)
                     for table in ("a", "b", "log") for r in target.rows(table)), key=repr)
    assert landed == expected(rows)


def test_change_rows_without_change_key_are_refused_before_any_transaction_begins(spark, tmp_path):
    """Without `change_key` two changes of a key could sit in two writers' transactions, committed in an order nobody
    chose, or in one StarRocks load whose deletes apply after its upserts: the sink refuses the batch, naming the
    table's key where the target tells it, and begins nothing."""
    from streaming_sink.errors import ConfigurationError
    from streaming_sink.targets.starrocks import StarRocksTarget
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    with StarRocksEmulator(tmp_path / "sr", user="u", password="p") as server:
        server.create_table("db", "a", [("id", "INT NOT NULL"), ("name", "VARCHAR(20)")], keys_type="PRIMARY_KEYS",
                            key=("id",))
        target = StarRocksTarget(server.fe_url, "db", "u", "p")
        sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id="job", table="a",
                               heartbeat_seconds=None)
        rows = [(1, "old", UPSERT, 10, "a"), (1, None, DELETE, 11, "a")]
        with pytest.raises(ConfigurationError, match=r"change_key=\['id'\]"):
            sink.process(frame(spark, rows).drop("__table"), 0, "q")
        assert server.transactions() == []
        assert server.visible_rows("db", "a") == []


def test_a_topic_that_gains_partitions_or_starts_its_offsets_again_stops_a_job_whose_versions_are_offsets(
        spark, tmp_path):
    """Versions taken from Kafka offsets (Debezium without `source.lsn`) compare only within a partition of one topic:
    once a topic gains partitions, a key may move to one whose offsets are lower, and a re-created topic starts its
    offsets again; newer changes would lose to older ones. The sink compares Spark's plan of this batch with the
    journal's previous batch and stops before writing it; a job whose versions are not offsets (PostgreSQL's LSNs)
    goes on."""
    import json

    from streaming_sink.errors import KafkaOffsetsMovedError

    schema = "id INT, name STRING, __op INT, __version BIGINT, __position BIGINT"

    def run(name: str, lsn: int, plans: list[dict[str, int]]) -> tuple[MemoryTarget, list[Any]]:
        checkpoint = tmp_path / name / "checkpoint"
        (checkpoint / "offsets").mkdir(parents=True)
        target = MemoryTarget()
        sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / name / "state"), job_id="job", table="t",
                               change_key=["id"], checkpoint_location=str(checkpoint), heartbeat_seconds=None)
        outcomes: list[Any] = []
        for batch, ends in enumerate(plans):
            (checkpoint / "offsets" / str(batch)).write_text(
                f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{batch}}}\n{json.dumps({"orders": ends})}\n')
            offset = 10 * batch
            rows = [(1, f"b{batch}", UPSERT, lsn + offset if lsn else offset, offset)]
            try:
                outcomes.append(sink.process(spark.createDataFrame(rows, schema), batch, "q").action)
            except KafkaOffsetsMovedError as stop:
                outcomes.append(stop)
        return target, outcomes

    added = [{"0": 10, "1": 10}, {"0": 20, "1": 20}, {"0": 30, "1": 30, "2": 0}]
    target, outcomes = run("added", 0, added)
    assert outcomes[:2] == ["written", "written"] and isinstance(outcomes[2], KafkaOffsetsMovedError)
    assert "topic orders: 2 partitions, now 3 since batch 1" in str(outcomes[2])
    assert "'Kafka partitions or offsets changed under offset versions'" in str(outcomes[2])
    assert [r["name"] for r in target.rows("t")] == ["b0", "b1"]  # batch 2 was not written
    target, outcomes = run("recreated", 0, [{"0": 10, "1": 10}, {"0": 20, "1": 20}, {"0": 3, "1": 30}])
    assert isinstance(outcomes[2], KafkaOffsetsMovedError) and "partition 0: offset 20, now 3" in str(outcomes[2])
    target, outcomes = run("lsn", 10_000_000, added)
    assert outcomes == ["written", "written", "written"]
