"""The tables a `routing.topic_table` job loads, resolved once when it starts (`run` and `doctor` alike).

A whole operational database is hundreds of topics, one per table: listing every schema in job.toml would repeat
what the target already knows. So a table the regex derives from a topic the job reads, and that [tables] does not
list, is parsed with the columns of the target's own table (`Target.table_columns`, each type turned into Spark's by
the target's `ColumnRules.spark_type`); a listed table keeps its schema and select. A topic whose table the target
lacks, or holds a column the job cannot parse into, stops nothing: its messages become dead letters whose reason
names the topic, the table and why (frame.py), and the other tables load. Tables are resolved at start only: a topic
that appears later under the pattern is read, and its messages are dead letters until a restart resolves its table.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .errors import ConfigurationError
from .frame import resolve_tables
from .job_spec import JobSpec
from .targets import descriptor_for
from .targets.base import Target
from .targets.columns import ColumnRules, column_key


@dataclass(frozen=True)
class JobTables:
    """What the frame parses: table -> Spark DDL of its message fields; and the derived tables it cannot load."""

    tables: dict[str, str]
    unavailable: dict[str, str] = field(default_factory=dict)  # table -> why its topics' messages are dead letters
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # change events: table -> its key columns


def table_of(pattern: str, topic: str) -> str | None:
    """The table `routing.topic_table` derives from a topic: its first group over the whole name (None: no match)."""
    match = re.fullmatch(pattern, topic)
    return (match.group(1) or None) if match else None


def job_tables(spec: JobSpec, target: Target, existing: set[str] | None, topics: Iterable[str]) -> JobTables:
    """The job's tables: those of `resolve_tables` (listed, checked against `existing`, the target's tables, None:
    it cannot tell), and with `routing.topic_table` those derived from `topics`, the topics the job reads now."""
    tables = resolve_tables(spec, existing, target.refusal)
    if not spec.topic_table:
        return JobTables(tables, keys=_keys(spec, target, tables, {}))
    rules = descriptor_for(spec.target_url).columns
    derived, unavailable = {}, {}
    for table in sorted({name for topic in topics if (name := table_of(spec.topic_table, topic)) is not None}):
        if table in tables:
            continue
        why, columns = _unloadable(spec, target, existing, table), None
        if why is None:
            try:
                columns = target.table_columns(table)
            except ConfigurationError as error:  # StarRocks and Doris: the FE's answer for a table it lacks
                why = str(error)
        if why is None and columns is None:
            why = f"{descriptor_for(spec.target_url).product} cannot tell its columns: list it under [tables.{table}] with a schema"
        if why is None and columns is not None:
            ddl, why = _schema_from_columns(spec, rules, table, columns)
            if ddl is not None:
                derived[table] = ddl
        if why is not None:
            unavailable[table] = why
    keys = _keys(spec, target, tables, derived, unavailable)
    derived = {table: ddl for table, ddl in derived.items() if table not in unavailable}
    return JobTables(dict(sorted({**tables, **derived}.items())), unavailable, keys)


def _keys(spec: JobSpec, target: Target, listed: Mapping[str, str], derived: Mapping[str, str],
          unavailable: dict[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """With change events, each table's key: job.toml's `key`, else the target table's own. A listed table without
    one is a configuration mistake; a derived one joins `unavailable` (its messages become dead letters)."""
    if not spec.changes:
        return {}
    keys = {}
    for table in [*listed, *derived]:
        key = tuple(spec.table_keys.get(table) or ()) if spec.table_keys else ()
        key = key or target.table_key(table) or ()
        if key:
            keys[table] = key
        elif table in listed:
            raise ConfigurationError(f"table {table!r}: change events need its key and the target cannot tell it; give "
                                     f"tables.{table}.key = [\"<column>\", ...]")
        elif unavailable is not None:
            unavailable[table] = ("change events need its key and the target cannot tell it: list it under "
                                  f"[tables.{table}] with a schema and a key")
    return keys


def _unloadable(spec: JobSpec, target: Target, existing: set[str] | None, table: str) -> str | None:
    """Why a derived table cannot be loaded, as far as the target's list of tables tells (None: it can be)."""
    if table == spec.dead_letter_table:
        return "that is the dead-letter table"
    if existing is not None and table not in existing:
        return target.refusal(table) or (f"the target database {spec.database!r} has no such table the job can load (create it, "
                           "or list it under [tables] with a schema on a target that creates tables)")
    return None


def _schema_from_columns(spec: JobSpec, rules: ColumnRules, table: str,
                         columns: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(Spark DDL of the message fields, None) for a table's columns, less the metadata columns the job fills itself;
    or (None, why) when a column's type has no JSON form the job parses. A table without a metadata column the job
    writes is a configuration mistake (sink.metadata_columns), refused before any data moves."""
    metadata = {column_key(rules, name) for _, name, _ in spec.metadata()}
    missing = sorted(metadata - {column_key(rules, name) for name in columns})
    if missing:
        raise ConfigurationError(
            f"table {table!r} (routing.topic_table) has no column(s) {missing} that sink.metadata_columns writes; "
            "add them to the table, or set sink.metadata_columns to the fields every table has (false: none)")
    fields = []
    for name, spelling in columns.items():
        if column_key(rules, name) in metadata or (spec.changes and name.startswith("__")):  # the sink's own (changes.py)
            continue
        kind = rules.spark_type(spelling)
        if kind is None:
            return None, (f"its column {name!r} is {spelling}, which the job cannot fill from JSON: list the table "
                          f"under [tables.{table}] with a schema and a select")
        required = "" if rules.limits(spelling).nullable else " NOT NULL"
        fields.append(f"`{name.replace('`', '``')}` {kind}{required}")
    return ", ".join(fields), None
