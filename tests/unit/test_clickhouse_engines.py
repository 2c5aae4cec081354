"""Which target engines the ClickHouse sink refuses at start (streaming_sink/targets/clickhouse/engines.py):
verdicts on system.tables rows as a server shows them (Replicated, Shared and Distributed tables cannot be made
without ZooKeeper or a cluster). The same verdicts on the real rows of the embedded engine (chdb), checked
against what it does when the sink's move commit is tried, are in tests/integration/test_clickhouse_engines_real.py.
"""
from __future__ import annotations

import pytest

from streaming_sink.targets.clickhouse.engines import INSERT, MOVE, TableFacts, engine_refusal, is_replicated

MODES = (MOVE, INSERT)


def facts(engine: str, engine_full: str = "", database_engine: str = "Atomic", name: str = "orders") -> TableFacts:
    return TableFacts(name=name, engine=engine, engine_full=engine_full, database_engine=database_engine)


# -- verdicts on rows as a server shows them ------------------------------------------------------

MERGE_TREES = [
    ("MergeTree", "MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id SETTINGS index_granularity = 8192"),
    ("ReplacingMergeTree", "ReplacingMergeTree(ver) ORDER BY id SETTINGS index_granularity = 8192"),
    ("SummingMergeTree", "SummingMergeTree ORDER BY id SETTINGS index_granularity = 8192"),
    ("AggregatingMergeTree", "AggregatingMergeTree ORDER BY id SETTINGS index_granularity = 8192"),
    ("CollapsingMergeTree", "CollapsingMergeTree(sign) ORDER BY id SETTINGS index_granularity = 8192"),
    ("VersionedCollapsingMergeTree", "VersionedCollapsingMergeTree(sign, v) ORDER BY id SETTINGS index_granularity = 8192"),
    ("GraphiteMergeTree", "GraphiteMergeTree('graphite_rollup') ORDER BY Path SETTINGS index_granularity = 8192"),
    ("CoalescingMergeTree", "CoalescingMergeTree ORDER BY id SETTINGS index_granularity = 8192"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("engine", "engine_full"), MERGE_TREES)
def test_plain_merge_trees_are_committed(engine: str, engine_full: str, mode: str) -> None:
    assert engine_refusal(facts(engine, engine_full), mode) is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("engine_full", [
    "ReplicatedMergeTree('/clickhouse/tables/{shard}/analytics/orders', '{replica}') ORDER BY id",
    "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', ver) ORDER BY id",
    "ReplicatedMergeTree ORDER BY id",
])
def test_replicated_outside_a_replicated_database_is_refused_naming_the_keeper_path(engine_full: str, mode: str) -> None:
    engine = engine_full.split("(")[0].split(" ")[0]
    why = engine_refusal(facts(engine, engine_full), mode)
    assert why is not None and why.startswith(f"{engine}:")
    assert "Keeper path" in why and "docs/clickhouse-clusters.md" in why
    if "/analytics/orders" in engine_full:
        assert "'/clickhouse/tables/{shard}/analytics/orders'" in why


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("engine", "engine_full", "database_engine"), [
    ("ReplicatedMergeTree", "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY id", "Replicated"),
    ("ReplicatedMergeTree", "ReplicatedMergeTree ORDER BY id", "Replicated"),
    ("SharedMergeTree", "SharedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY id", "Shared"),
    ("SharedReplacingMergeTree", "SharedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY id", "Replicated"),
])
def test_replicated_uuid_path_in_a_replicated_database_is_committed(
    engine: str, engine_full: str, database_engine: str, mode: str
) -> None:
    assert engine_refusal(facts(engine, engine_full, database_engine), mode) is None


def test_a_fixed_keeper_path_is_refused_even_in_a_replicated_database() -> None:
    row = facts("ReplicatedMergeTree", "ReplicatedMergeTree('/clickhouse/tables/01/orders', '{replica}') ORDER BY id", "Replicated")
    assert "'/clickhouse/tables/01/orders'" in (engine_refusal(row, MOVE) or "")


def test_a_target_with_staging_paths_of_its_own_may_load_replicated_tables() -> None:
    row = facts("ReplicatedMergeTree", "ReplicatedMergeTree('/clickhouse/tables/{shard}/orders', '{replica}') ORDER BY id")
    assert engine_refusal(row, MOVE, own_keeper_path=True) is None
    assert engine_refusal(row, INSERT, own_keeper_path=True) is None


@pytest.mark.parametrize("engine", ["MergeTree", "ReplicatedMergeTree"])
def test_zero_copy_replication_is_refused(engine: str) -> None:
    row = facts(engine, f"{engine} ORDER BY id SETTINGS storage_policy = 's3', allow_remote_fs_zero_copy_replication = 1",
                "Replicated")
    why = engine_refusal(row, MOVE, own_keeper_path=True)
    assert why is not None and why.startswith(f"{engine} with allow_remote_fs_zero_copy_replication")


@pytest.mark.parametrize("mode", MODES)
def test_distributed_is_refused_naming_the_local_tables_to_load(mode: str) -> None:
    row = facts("Distributed", "Distributed('events', 'analytics', 'orders_local', cityHash64(id))", name="orders")
    why = engine_refusal(row, mode)
    assert why is not None and why.startswith("Distributed: orders")
    assert "analytics.orders_local on the shards of cluster 'events'" in why
    assert "local *MergeTree table on each shard" in why


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("engine", "engine_full", "hint"), [
    ("Buffer", "Buffer('analytics', 'orders', 1, 10, 100, 10000, 1000000, 10000000, 100000000)", "analytics.orders"),
    ("Memory", "Memory", "RAM"),
    ("Set", "Set", "*MergeTree"),
    ("Join", "Join(ANY, LEFT, id)", "*MergeTree"),
    ("Log", "Log", "Log-family"),
    ("TinyLog", "TinyLog", "Log-family"),
    ("StripeLog", "StripeLog", "Log-family"),
    ("Null", "`Null`", "views"),
    ("MaterializedView", "", "source table"),
    ("View", "", "the table it reads"),
    ("Dictionary", "", "built from"),
    ("Merge", "Merge('analytics', '^orders')", "load one of them"),
    ("Kafka", "Kafka('k:9092', 'orders', 'g', 'JSONEachRow')", "another system"),
    ("S3Queue", "S3Queue('s3://b/*', 'CSV')", "another system"),
    ("MySQL", "MySQL('h:3306', 'db', 't', 'u', 'p')", "not a MergeTree-family table"),
    ("EmbeddedRocksDB", "EmbeddedRocksDB PRIMARY KEY id", "not a MergeTree-family table"),
    ("", "", "unknown engine"),
])
def test_engines_without_an_atomic_commit_are_refused_by_name(engine: str, engine_full: str, hint: str, mode: str) -> None:
    why = engine_refusal(facts(engine, engine_full), mode)
    assert why is not None
    assert why.startswith(f"{engine or 'unknown engine'}:"), why
    assert hint in why
    assert "\n" not in why


def test_an_unknown_commit_mode_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="commit_mode 'copy'"):
        engine_refusal(facts("MergeTree"), "copy")


def test_facts_from_a_row_with_gaps() -> None:
    row = TableFacts.from_row({"name": "t", "engine": "MergeTree", "engine_full": None, "uuid": "ignored"})
    assert row == TableFacts(name="t", engine="MergeTree")
    assert is_replicated("ReplicatedSummingMergeTree") and is_replicated("SharedMergeTree")
    assert not is_replicated("MergeTree") and not is_replicated("ReplicatedSomethingElse")
