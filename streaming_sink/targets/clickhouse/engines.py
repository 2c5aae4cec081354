"""Which ClickHouse table engines the sink can commit exactly once, decided from what system.tables says.

The ClickHouse target commits a (table, writer) through a staging table made `CREATE TABLE <staging> AS
<target>` (so it copies the target's engine clause, arguments included), either by moving its partitions
(`ALTER TABLE <staging> MOVE PARTITION ID … TO TABLE <target>`, commit_mode "move") or by
`INSERT INTO <target> SELECT … FROM <staging>` with a deduplication token (commit_mode "insert").
Both need a table that owns its data in partitions and keeps a log of inserted blocks: the MergeTree
family. Everything else is refused at start, naming the engine and what to load instead, because the
sink could only fail later or, worse, load rows that a crash would lose or a retry would duplicate.

Verdicts per engine (system.tables.engine), the same in both commit modes; reasons and sources are in
docs/clickhouse-clusters.md:

  engine                                    verdict   why
  ----------------------------------------  --------  ------------------------------------------------------------
  MergeTree, Replacing-, Summing-,          yes       a partition move is atomic per partition; a retried INSERT
  Aggregating-, Collapsing-, Versioned-                block is dropped by its token (windows: checked elsewhere)
  Collapsing-, Graphite-, CoalescingMergeTree
  Replicated* of those                      only with  `CREATE … AS` copies the Keeper path, which ClickHouse
                                            own path   refuses for the staging table (the Keeper-path rule below)
  Shared* (ClickHouse Cloud)                as above   a `{uuid}` path in a Replicated/Shared database is fine
  *MergeTree with zero-copy replication     no         experimental; MOVE/REPLACE PARTITION lost data with it
  Distributed                               no         no rows of its own; an INSERT fans out to the shards with no
                                                       atomic commit: load each shard's local table
  Buffer                                    no         rows wait in RAM until flushed, lost on a crash: load its
                                                       destination table
  Memory, Set, Join                         no         no partitions, no deduplication, RAM only
  Log, TinyLog, StripeLog                   no         no partitions, no deduplication, partial INSERTs possible
  Null                                      no         keeps nothing: load the tables its views write into
  MaterializedView, View, LiveView,         no         owns no rows: load the table underneath
  WindowView, Dictionary, Merge
  Kafka, RabbitMQ, NATS, S3Queue, …         no         an INSERT publishes elsewhere, with no commit to join
  anything else (MySQL, S3, File, URL,      no         not MergeTree: no partition move, no block deduplication
  EmbeddedRocksDB, KeeperMap, Iceberg, …)

The Keeper-path rule: a Replicated table's first engine argument is its Keeper path. The staging table
copies it, so ClickHouse either refuses it (the replica already exists under that path) or, for a
`{uuid}` path outside a Replicated database, refuses the macro. Only a `{uuid}` (or default) path in a
database of engine Replicated/Shared gives the copy a path of its own (its new UUID). A target that
creates replicated staging tables with an explicit path of their own passes `own_keeper_path=True`.
Behaviour on a real Keeper is not tested here (no ZooKeeper on these machines): see the doc.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MOVE, INSERT = "move", "insert"  # the target's commit modes (target.py, `commit_mode`)
COMMIT_MODES = (MOVE, INSERT)
#: engines whose replicas can lag (Replicated*, and Shared* on ClickHouse Cloud): reads that decide sync first
REPLICATED_PREFIXES = ("Replicated", "Shared")

# What the target asks ClickHouse for every table of a database ({db}), or for one ({db}, {t}): the facts a verdict reads,
# and the views an INSERT into the table fires (`dependencies_*`, read by catalog.py), so one read of system.tables
# decides a table's refusal.
DATABASE_FACTS_QUERY = (
    "SELECT t.name AS name, t.engine AS engine, t.engine_full AS engine_full, t.partition_key AS partition_key, "
    "t.storage_policy AS storage_policy, t.sorting_key AS sorting_key, t.comment AS comment, d.engine AS database_engine, "
    "t.dependencies_database AS dependencies_database, t.dependencies_table AS dependencies_table "
    "FROM system.tables AS t "
    "INNER JOIN system.databases AS d ON d.name = t.database WHERE t.database = {db:String}"
)
FACTS_QUERY = DATABASE_FACTS_QUERY + " AND t.name = {t:String}"

_MERGE_TREE_BASES = frozenset({
    "MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree", "CollapsingMergeTree",
    "VersionedCollapsingMergeTree", "GraphiteMergeTree", "CoalescingMergeTree",
})
_REPLICATED_DATABASES = frozenset({"Replicated", "Shared"})
_ZERO_COPY = re.compile(r"\ballow_remote_fs_zero_copy_replication\s*=\s*(1|true)\b", re.IGNORECASE)
_ARGS = re.compile(r"^\s*`?\w+`?\s*\((?P<args>[^)]*)\)")
_STREAMING = frozenset({"Kafka", "RabbitMQ", "NATS", "S3Queue", "AzureQueue", "FileLog"})
_NOT_A_TABLE = {
    "MaterializedView": (
        "a materialized view: load its source table with commit_mode \"insert\" (which fires it), or the table it writes into"
    ),
    "View": "a view stores nothing: load the table it reads",
    "LiveView": "a live view stores nothing: load the table it reads",
    "WindowView": "a window view: load its source table",
    "Dictionary": "a dictionary: load the table it is built from",
    "Merge": "a Merge table only reads other tables: load one of them",
}
_IN_MEMORY = {
    "Memory": "rows live in RAM only (lost on restart), it has no partitions to move and no deduplication of a retried INSERT",
    "Set": "an in-memory set, with no partitions to move and no deduplication of a retried INSERT",
    "Join": "an in-memory join table, with no partitions to move and no deduplication of a retried INSERT",
}
_LOG_FAMILY = frozenset({"Log", "TinyLog", "StripeLog"})


@dataclass(frozen=True)
class TableFacts:
    """One row of system.tables (plus the database's engine), as much as a verdict needs."""

    name: str
    engine: str
    engine_full: str = ""
    partition_key: str = ""
    storage_policy: str = ""
    database_engine: str = ""  # system.databases.engine: a Replicated database gives `{uuid}` copies paths of their own
    sorting_key: str = ""  # the ORDER BY expression list: a ReplacingMergeTree's key (change_tables.py)
    comment: str = ""  # the table's comment: marks a table the job created (change_tables.py)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TableFacts:
        """From a row of FACTS_QUERY (or of system.tables; missing keys read as empty)."""
        return cls(**{key: str(row.get(key) or "") for key in ("name", "engine", "engine_full", "partition_key",
                                                              "storage_policy", "database_engine",
                                                              "sorting_key", "comment")})


def is_merge_tree(engine: str) -> bool:
    """A MergeTree-family engine, plain, Replicated* or Shared* (its partitions can be moved, its blocks deduplicated)."""
    return _base(engine) in _MERGE_TREE_BASES or engine.endswith("MergeTree")


def is_replicated(engine: str) -> bool:
    return engine.startswith(REPLICATED_PREFIXES) and is_merge_tree(engine)


def engine_refusal(facts: TableFacts, commit_mode: str, *, own_keeper_path: bool = False) -> str | None:
    """Why the sink cannot commit this table exactly once in this commit mode (one line, naming the engine
    and what to use instead), or None when it can. Settings the table must also have (deduplication
    windows, views) are checked by the target; this decides the engine alone.

    `own_keeper_path`: the target gives a Replicated staging table a Keeper path of its own instead of
    copying the target's engine arguments (not built yet: staging.py makes staging `AS` the target).
    """
    if commit_mode not in (MOVE, INSERT):
        raise ValueError(f"commit_mode {commit_mode!r}: use {MOVE!r} or {INSERT!r}")
    engine = facts.engine
    if is_merge_tree(engine):
        return _merge_tree_refusal(facts, own_keeper_path)
    if engine == "Distributed":
        where = _distributed_local(facts.engine_full)
        return (
            f"Distributed: {facts.name} holds no rows of its own (it forwards them to {where}), so there is no partition "
            "to move, and an INSERT through it is split across shards with no atomic commit or deduplication across them. "
            "Load the local *MergeTree table on each shard instead (per-shard loading is designed, not built: "
            "docs/clickhouse-clusters.md)"
        )
    if engine == "Buffer":
        return (
            f"Buffer: {facts.name} keeps rows in memory until it flushes them to {_buffer_destination(facts.engine_full)}, "
            "so a server crash loses rows the sink counted as committed, and it has no partitions to move. "
            "Load the destination table directly"
        )
    if engine in _IN_MEMORY:
        return f"{engine}: {_IN_MEMORY[engine]}. Load a *MergeTree table instead"
    if engine in _LOG_FAMILY:
        return (
            f"{engine}: a Log-family table has no partitions to move and no deduplication of a retried INSERT, and an "
            "interrupted INSERT may leave part of its rows. Load a *MergeTree table instead"
        )
    if engine == "Null":
        return (
            "Null: the table keeps nothing, so nothing the sink loads would be visible; if it only feeds materialized "
            "views, load the tables they write into (or give it a *MergeTree engine and use commit_mode \"insert\")"
        )
    if engine in _NOT_A_TABLE:
        return f"{engine}: {_NOT_A_TABLE[engine]}"
    if engine in _STREAMING:
        return (
            f"{engine}: an INSERT publishes the rows to another system, with no commit the sink can take part in or "
            "repeat safely. Load a *MergeTree table instead"
        )
    return (
        f"{engine or 'unknown engine'}: not a MergeTree-family table, so the sink can neither move partitions into it "
        "nor have ClickHouse drop a retried INSERT. Load a *MergeTree table instead"
    )


def _merge_tree_refusal(facts: TableFacts, own_keeper_path: bool) -> str | None:
    engine = facts.engine
    if _ZERO_COPY.search(facts.engine_full):
        return (
            f"{engine} with allow_remote_fs_zero_copy_replication: zero-copy replication is experimental and has lost "
            "data on MOVE/REPLACE PARTITION (ClickHouse issues 40188, 54193); turn it off for this table"
        )
    if not is_replicated(engine) or own_keeper_path:
        return None
    path = _keeper_path(facts.engine_full)
    if facts.database_engine in _REPLICATED_DATABASES and (path is None or "{uuid}" in path):
        return None  # the staging table's new UUID gives it a Keeper path of its own
    shown = f"'{path}'" if path is not None else "(the default path)"
    return (
        f"{engine}: the staging table is created AS the target, so it would copy the target's Keeper path {shown}, "
        "which ClickHouse refuses (the replica already exists, or a {uuid} macro outside a Replicated database). "
        "Use a database of engine Replicated with a {uuid} Keeper path (ReplicatedMergeTree with no arguments), or "
        "wait for staging tables with Keeper paths of their own (docs/clickhouse-clusters.md)"
    )


def _base(engine: str) -> str:
    for prefix in ("Replicated", "Shared"):
        if engine.startswith(prefix) and engine[len(prefix):].endswith("MergeTree"):
            return engine[len(prefix):]
    return engine


def _args(engine_full: str) -> list[str]:
    """The engine's arguments, unquoted, as written in engine_full (no nested parentheses needed here)."""
    found = _ARGS.match(engine_full)
    if not found or not found.group("args").strip():
        return []
    return [a.strip().strip("'`\"") for a in found.group("args").split(",")]


def _keeper_path(engine_full: str) -> str | None:
    args = _args(engine_full)
    return args[0] if args and args[0].startswith("/") else None


def _distributed_local(engine_full: str) -> str:
    args = _args(engine_full)
    if len(args) >= 3:
        return f"{args[1]}.{args[2]} on the shards of cluster '{args[0]}'"
    return "the shards' local tables"


def _buffer_destination(engine_full: str) -> str:
    args = _args(engine_full)
    return f"{args[0]}.{args[1]}" if len(args) >= 2 and args[1] else "its destination table"
