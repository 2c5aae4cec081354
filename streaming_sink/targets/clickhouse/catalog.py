"""What the target database's tables and views are, and which of them a commit mode can load exactly once:
engines (engines.py), the materialized views an INSERT fires, and the deduplication windows a repeated
INSERT relies on (docs/clickhouse-views.md)."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base import ConfigurationError, ExpiryKind, ExpiryLimit
from .change_tables import ReplacingColumns, replacing_columns
from .column_types import DEFAULTED
from .connection import Connection, quote
from .engines import FACTS_QUERY, MOVE, REPLICATED_PREFIXES, TableFacts, engine_refusal

_MOVABLE_ENGINE_SUFFIX = "MergeTree"
_CANNOT_ORDER_BY = 44  # ILLEGAL_COLUMN: a column type ORDER BY cannot compare (AggregateFunction, ...)
SUGGESTED_WINDOW = 10000  # what refusals propose: far above a batch's blocks (a much larger window slows INSERTs)


@dataclass(frozen=True)
class Entry:
    """A table or view of system.tables, with what an INSERT into it fires."""

    database: str
    name: str
    engine: str
    engine_full: str
    feeds: tuple[tuple[str, str], ...]  # (database, view) of each view an INSERT into it fires
    writes_to: tuple[str, str] | None  # a materialized view's destination table

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.name}"


class Catalog:
    """The tables of one target database as the commit mode sees them; remembers each table's engine (it
    travels to Spark tasks with the target)."""

    def __init__(self, connection: Connection, commit_mode: str, commit_parallelism: int) -> None:
        self._connection = connection
        self.commit_mode, self.commit_parallelism = commit_mode, commit_parallelism
        self.engines: dict[str, str] = {}  # table -> engine, as found
        self.facts: dict[str, TableFacts] = {}  # table -> its row of system.tables, as found

    def engine_of(self, table: str) -> str:
        """The table's engine (as found at start, or asked now)."""
        if table not in self.engines:
            self._connection.repeating(f"engine check of {table}", lambda: self.refusal(table))
        return self.engines.get(table, "")

    def facts_of(self, table: str, fresh: bool = False) -> TableFacts | None:
        """The table's row of system.tables (as found at start, or asked now; `fresh`: asked now); None: no such table."""
        if fresh or table not in self.facts:
            self.facts.pop(table, None)
            self._connection.repeating(f"engine check of {table}", lambda: self.refusal(table))
        return self.facts.get(table)

    def replacing(self, table: str) -> ReplacingColumns | None:
        """Where the table takes change rows' versions and deletes (None: it is no ReplacingMergeTree that can)."""
        facts = self.facts_of(table)
        return replacing_columns(facts) if facts is not None else None

    def refuse(self, table: str) -> None:
        """Refuse (ConfigurationError) a table this mode cannot load, asked now: a view created, or a setting
        changed, since the job started is caught before a label's first commit step."""
        why = self.refusal(table)
        if why:
            raise ConfigurationError(why)

    def refusal(self, table: str) -> str | None:
        """Why this commit mode cannot load `table` exactly once, its engine and views included; None when it can."""
        database = self._connection.database
        rows = list(self._connection.client().query(FACTS_QUERY, parameters={"db": database, "t": table}).named_results())
        if not rows:
            return None  # no such table: the job's own checks name it
        self.engines[table] = str(rows[0]["engine"])
        facts = self.facts[table] = TableFacts.from_row(rows[0])
        why = engine_refusal(facts, self.commit_mode)
        if why:
            return f"ClickHouse table {database}.{table}: {why}"
        # a table whose engine passed is no view (it writes nowhere), and the facts row names the views it feeds: no
        # second read of system.tables (this runs at every label's first commit step)
        entry = Entry(database, table, facts.engine, facts.engine_full, _feeds(rows[0]), None)
        if self.commit_mode == MOVE:
            if not entry.feeds:
                return None
            views = ", ".join(f"{db}.{name}" for db, name in entry.feeds)
            return (
                f"ClickHouse table {entry.qualified} feeds materialized view(s) {views}: commit_mode 'move' (the default) "
                "moves partitions into the table, which views never see, so they would silently miss every row the sink "
                "loads. Set the target option commit_mode = \"insert\" (an INSERT … SELECT from staging, which fires the "
                "views; the table and each view's table need a deduplication window), or load another table. "
                "See docs/clickhouse-views.md"
            )
        problems = self._insert_problems(entry)
        if not problems:
            return None
        return (
            f"ClickHouse table {entry.qualified} cannot be loaded exactly once with commit_mode 'insert': "
            + "; ".join(problems) + ". See docs/clickhouse-views.md"
        )

    def _insert_problems(self, entry: Entry) -> list[str]:
        """What keeps a repeated INSERT into `entry` from being deduplicated in the table and every view's table."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        tables, problems = self.deduplicating_tables(entry)
        why = (f"one INSERT in flight per commit running at once, commit_parallelism {self.commit_parallelism}; "
               "each commit checks its own partitions too")
        problems = [problem for table in tables if (problem := self.window_shortfall(table, self.commit_parallelism, why))] + problems
        columns = ", ".join(quote(name) for name in self.columns(entry.name))
        try:
            self._connection.client().query(f"SELECT {columns} FROM {self._connection.table(entry.name)} ORDER BY {columns} LIMIT 0")
        except DatabaseError as error:
            if getattr(error, "code", None) != _CANNOT_ORDER_BY:
                raise  # a lost connection or a failing server says nothing about the table: repeated, or stops loudly
            problems.append(f"its rows cannot be put in a total order, which repeatable INSERT blocks need ({error})")
        return problems

    def deduplicating_tables(self, entry: Entry) -> tuple[list[Entry], list[str]]:
        """The table and each table a materialized view it fires writes into (through views of views), whose
        deduplication windows a repeated INSERT relies on; and what an INSERT fires that cannot deduplicate."""
        tables, problems = [entry], []
        seen: set[tuple[str, str]] = set()
        pending = list(entry.feeds)
        while pending:
            key = pending.pop(0)
            if key in seen:
                continue
            seen.add(key)
            view = self.entry(*key)
            if view is None:
                continue
            if view.engine != "MaterializedView":
                problems.append(f"{view.qualified} ({view.engine}) fires on INSERT but cannot deduplicate a repeated one")
                continue
            destination = self.entry(*view.writes_to) if view.writes_to else None
            if destination is None:
                problems.append(f"the table materialized view {view.qualified} writes into was not found")
                continue
            if not destination.engine.endswith(_MOVABLE_ENGINE_SUFFIX):
                problems.append(
                    f"materialized view {view.qualified} writes into {destination.qualified} ({destination.engine}), "
                    "which cannot deduplicate a repeated INSERT"
                )
                continue
            tables.append(destination)
            pending.extend(destination.feeds)
        return tables, problems

    def window_shortfall(self, table: Entry, least: int, why: str) -> str | None:
        """Why `table`'s deduplication window is too small for `least` blocks (None: it is not), and how to raise it."""
        setting, window = self._dedup_window(table)
        if window >= least:
            return None
        return (
            f"{table.qualified}'s {setting} is {window}{' (no deduplication)' if not window else ''}, it must be at least "
            f"{least} ({why}): ALTER TABLE {quote(table.database)}.{quote(table.name)} MODIFY SETTING {setting} = "
            f"{max(least, SUGGESTED_WINDOW)}"
        )

    def _dedup_window(self, entry: Entry) -> tuple[str, int]:
        """The deduplication setting that governs the table, and its value (the table's own, else the server's)."""
        replicated = entry.engine.startswith(REPLICATED_PREFIXES)
        setting = "replicated_deduplication_window" if replicated else "non_replicated_deduplication_window"
        own = re.search(rf"\b{setting}\s*=\s*(\d+)", entry.engine_full)
        return setting, int(own.group(1)) if own else self._server_merge_tree_setting(setting)

    def _server_merge_tree_setting(self, name: str) -> int:
        rows = self._connection.client().query(
            "SELECT value FROM system.merge_tree_settings WHERE name = {n:String}", parameters={"n": name}
        ).result_rows
        return int(rows[0][0]) if rows else 0

    def deduplication_limit(self, tables: list[str]) -> ExpiryLimit | None:
        """For `doctor`: a commit retried after its tables took more newer blocks than their windows hold inserts twice."""
        counts, seconds = [], []
        for table in tables:
            entry = self.entry(self._connection.database, table)
            if entry is None:
                continue
            setting, window = self._dedup_window(entry)
            counts.append(window)
            if setting.startswith("replicated"):
                own = re.search(r"\breplicated_deduplication_window_seconds\s*=\s*(\d+)", entry.engine_full)
                seconds.append(int(own.group(1)) if own else self._server_merge_tree_setting("replicated_deduplication_window_seconds"))
        if not counts:
            return None
        return ExpiryLimit(
            "insert deduplication log (commit_mode insert)", float(min(seconds)) if seconds else None, min(counts),
            note="an INSERT commit retried after the table took more newer blocks than its deduplication window (or, "
                 "Replicated, newer inserts over replicated_deduplication_window_seconds) is inserted twice; raise the window",
            kind=ExpiryKind.DEDUP,
        )

    def entry(self, database: str, name: str) -> Entry | None:
        """The table or view as system.tables describes it (None: no such object)."""
        result = self._connection.client().query(
            "SELECT * FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": database, "t": name},
        )
        if not result.result_rows:
            return None
        row = dict(zip(result.column_names, result.result_rows[0], strict=True))
        writes_to = _view_destination(row) if row["engine"] == "MaterializedView" else None
        return Entry(database, name, row["engine"], row.get("engine_full") or "", _feeds(row), writes_to)

    def columns(self, table: str, defaults: bool = False) -> dict[str, str]:
        """The table's stored columns an INSERT sets (not MATERIALIZED, ALIAS or EPHEMERAL: computed, or never
        stored), with their types, in table order (none: no such table): the columns rows carry into it.
        `defaults`: a column with a DEFAULT expression is spelled `<type> DEFAULT` (`DEFAULTED`)."""
        rows = self._connection.repeating(f"column read of {table}", lambda: self._connection.client().query(
            "SELECT name, type, default_kind FROM system.columns WHERE database = {db:String} AND table = {t:String} "
            "AND default_kind IN ('', 'DEFAULT') ORDER BY position",
            parameters={"db": self._connection.database, "t": table},
        ).result_rows)
        return {name: kind + (DEFAULTED if defaults and default_kind == "DEFAULT" else "") for name, kind, default_kind in rows}


_IDENT = r"(?:`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)"
_VIEW_TO = re.compile(
    rf"CREATE MATERIALIZED VIEW\s+(?:IF NOT EXISTS\s+)?(?:{_IDENT}\.)?{_IDENT}\s+(?:ON CLUSTER\s+\S+\s+)?"
    rf"TO\s+(?:(?P<db>{_IDENT})\.)?(?P<table>{_IDENT})"
)


def _feeds(row: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(database, view) of each view an INSERT into the table of this system.tables row fires."""
    return tuple(zip(row.get("dependencies_database") or [], row.get("dependencies_table") or [], strict=True))


def _unquote(identifier: str) -> str:
    if identifier.startswith("`"):
        return re.sub(r"\\(.)", r"\1", identifier[1:-1])
    return identifier


def _view_destination(row: dict[str, Any]) -> tuple[str, str]:
    """Where a materialized view writes: system.tables says so on newer servers; else its `TO` clause, or its inner table."""
    if row.get("target_table"):
        return row.get("target_database") or row["database"], row["target_table"]
    found = _VIEW_TO.match(row.get("create_table_query") or "")
    if found:
        return _unquote(found.group("db")) if found.group("db") else row["database"], _unquote(found.group("table"))
    uuid = str(row.get("uuid") or "")
    inner = f".inner_id.{uuid}" if uuid.strip("0-") else f".inner.{row['name']}"
    return row["database"], inner
