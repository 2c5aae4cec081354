"""Change rows (streaming_sink/changes.py) into a ReplacingMergeTree table: which columns of the table take `__op`
and `__version`, the tables the job creates for them, and the columns it may add to those later.

ClickHouse facts relied on (in our words; ReplacingMergeTree reference page, clickhouse.com/docs, "ReplacingMergeTree
parameters" and "Query time de-duplication & FINAL"; docs/protocol.md, "ClickHouse: change tables"):

* `ReplacingMergeTree(ver, is_deleted)` keeps, among the rows of one sorting key (ORDER BY, not PRIMARY KEY), the one
  with the highest `ver` (UInt*, Date, DateTime or DateTime64); on a tie, the last inserted. `is_deleted` (UInt8, only
  with `ver`; since 23.2) marks that row a delete: `SELECT … FINAL` leaves the key out (checked on chdb 4.4 =
  ClickHouse 26.9, with no setting), and merges keep the delete row itself, so a later insert of a lower version
  stays hidden. Only `OPTIMIZE … FINAL CLEANUP` (experimental) removes it: an operator must not run it on these
  tables while a replay could still bring older versions.
* Rows of one key are replaced only within a partition: a partition key over a column a change can alter would leave
  the old row beside the new one, so the partition key may read key columns only (tables the job creates have none).
* `optimize_on_insert` (on by default) folds rows of equal key inside one inserted block as a merge would; a staging
  insert turns it off so prepare counts exactly the rows written (staging.py).

The job's tables carry the comment JOB_CREATED_COMMENT: that is how `add_columns` knows it may alter one.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ...changes import CHANGE_COLUMNS, OP_COLUMN, UPSERT, VERSION_COLUMN, is_change_schema, table_columns
from ..base import ConfigurationError
from ..encoding import EncodingError
from .engines import TableFacts

#: The ReplacingMergeTree columns of a change table the job creates. `__version` is the sink's own name in every change
#: row (changes.py), so no source column can hold it; `__is_deleted` sits in the same `__` namespace and, unlike
#: `__deleted` (which Debezium's ExtractNewRecordState adds when asked), is not a name a source stream brings.
CREATED_VERSION_COLUMN = "__version"
CREATED_DELETED_COLUMN = "__is_deleted"
#: Set on every table the job creates; `add_columns` alters only tables that carry it (CREATE … AS copies it to staging).
JOB_CREATED_COMMENT = "created by streaming-sink (target.create_tables); columns added upstream are added here"
_IDENTIFIER = re.compile(r"`((?:[^`\\]|\\.)*)`|([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class ReplacingColumns:
    """Where a ReplacingMergeTree table takes a change row's `__version` and `__op`, and its key."""

    version: str
    is_deleted: str
    key: tuple[str, ...]


def replacing_columns(facts: TableFacts) -> ReplacingColumns | None:
    """The version and is-deleted columns and the sorting key of a (Replicated/Shared) ReplacingMergeTree declared
    with both parameters; None for any other table."""
    if not facts.engine.endswith("ReplacingMergeTree"):
        return None
    found = re.match(r"\s*\w+\s*\((?P<args>[^)]*)\)", facts.engine_full)
    args = [a.strip() for a in found.group("args").split(",")] if found and found.group("args").strip() else []
    columns = [a for a in args if not a.startswith("'")]  # a Replicated table's Keeper path and replica come first
    key = sorting_key_columns(facts.sorting_key)
    if len(columns) != 2 or key is None:
        return None
    version, is_deleted = (_identifier(c) for c in columns)
    return ReplacingColumns(version, is_deleted, key) if version and is_deleted else None


def sorting_key_columns(sorting_key: str) -> tuple[str, ...] | None:
    """The columns of a sorting key made of plain columns (system.tables.sorting_key: `id, region`); None when it
    holds an expression, whose rows the sink could not tell apart by column values."""
    text = sorting_key.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    names = [_identifier(part.strip()) for part in text.split(",")] if text.strip() else []
    return tuple(n for n in names if n) if names and all(names) else None


def _identifier(text: str) -> str | None:
    found = _IDENTIFIER.fullmatch(text)
    if found is None:
        return None
    return re.sub(r"\\(.)", r"\1", found.group(1)) if found.group(1) is not None else found.group(2)


def change_refusal(facts: TableFacts | None, columns: Mapping[str, str], schema: pa.Schema) -> str | None:
    """Why rows of the change `schema` cannot be loaded into this table (one line, naming what to create); None: they can."""
    if facts is None:
        return None  # no such table: the job's own checks name it
    table = facts.name
    own = table_columns(schema.names)
    wanted = (f"create it (or a table of yours like it) ENGINE = ReplacingMergeTree({CREATED_VERSION_COLUMN}, "
              f"{CREATED_DELETED_COLUMN}) ORDER BY (<key>) with {CREATED_VERSION_COLUMN} UInt64 and "
              f"{CREATED_DELETED_COLUMN} UInt8 (target.create_tables does)")
    found = replacing_columns(facts)
    if found is None:
        return (f"ClickHouse table {table} takes change rows (upserts and deletes) but is {facts.engine_full or facts.engine}, "
                f"not a ReplacingMergeTree with a version and an is-deleted column ordered by plain columns: {wanted}")
    problems = []
    if columns.get(found.version) != "UInt64":
        problems.append(f"its version column {found.version} is {columns.get(found.version)}, not UInt64")
    if columns.get(found.is_deleted) != "UInt8":
        problems.append(f"its is-deleted column {found.is_deleted} is {columns.get(found.is_deleted)}, not UInt8")
    if found.version in own or found.is_deleted in own:
        problems.append(f"the rows carry a column of their own named {found.version} or {found.is_deleted}")
    missing = [name for name in found.key if name not in own]
    if missing:
        problems.append(f"its key column(s) {missing} are not among the rows' columns")
    moving = _columns_read(facts.partition_key, columns) - set(found.key)
    if moving:
        problems.append(f"its PARTITION BY reads {sorted(moving)}, which a change can alter, and rows of one key are "
                        "replaced only within a partition")
    if not problems:
        return None
    return f"ClickHouse table {table} cannot take change rows: " + "; ".join(problems) + f"; {wanted}"


def _columns_read(expression: str, columns: Mapping[str, str]) -> set[str]:
    """The table's columns an expression (a partition key) names."""
    return {name for quoted, plain in _IDENTIFIER.findall(expression) if (name := quoted or plain) in columns}


def table_rows(chunk: pa.Table, replacing: ReplacingColumns) -> pa.Table:
    """A chunk of change rows as the table's rows: `__op` into the is-deleted column (UInt8), `__version` into the
    version column (UInt64). A negative or missing version breaks the contract of changes.py and is refused."""
    if VERSION_COLUMN not in chunk.column_names:
        raise EncodingError(f"change rows carry {OP_COLUMN} but no {VERSION_COLUMN}: every change needs its version")
    try:
        version = pc.cast(chunk.column(VERSION_COLUMN), pa.uint64())
    except pa.ArrowInvalid:
        raise EncodingError(f"column {VERSION_COLUMN} holds a negative version; change versions are 0 or more") from None
    deleted = pc.cast(chunk.column(OP_COLUMN), pa.uint8())
    rows = chunk.drop_columns(list(CHANGE_COLUMNS))
    return rows.append_column(replacing.version, version).append_column(replacing.is_deleted, deleted)


def upsert_rows(chunk: pa.Table) -> pa.Table:
    """The upserts of a chunk of change rows (the deletes carry only their key)."""
    return chunk.filter(pc.equal(chunk.column(OP_COLUMN), UPSERT))


def created_columns(schema: pa.Schema, key: Sequence[str], type_of: Callable[[pa.DataType, bool], str]) -> list[tuple[str, str]]:
    """(name, ClickHouse type) of the table the job creates for rows of `schema`: for change rows, the rows' own
    columns (key columns not Nullable: ClickHouse sorts by no Nullable column by default) and the version and
    is-deleted columns."""
    if not is_change_schema(schema):
        return [(f.name, type_of(f.type, f.nullable)) for f in schema]
    own = [schema.field(name) for name in table_columns(schema.names)]
    names = {f.name for f in own}
    if not key:
        raise ConfigurationError("a change table needs its key to be created: create_table(table, schema, key=(...))")
    unknown = [name for name in key if name not in names]
    if unknown:
        raise ConfigurationError(f"key column(s) {unknown} are not among the change rows' columns {sorted(names)}")
    taken = {CREATED_VERSION_COLUMN, CREATED_DELETED_COLUMN} & names
    if taken:
        raise ConfigurationError(f"change rows carry column(s) {sorted(taken)}, which the sink's ReplacingMergeTree "
                                 "keeps for itself; rename them upstream or create the table yourself")
    return ([(f.name, type_of(f.type, f.nullable and f.name not in key)) for f in own]
            + [(CREATED_VERSION_COLUMN, "UInt64"), (CREATED_DELETED_COLUMN, "UInt8")])


def created_engine(schema: pa.Schema, key: Sequence[str], quote: Callable[[str], str]) -> str:
    """The engine clause of a table the job creates: MergeTree for appended rows; ReplacingMergeTree over the
    version and is-deleted columns for change rows, ordered by the key and never partitioned (a partition key a
    change could alter would keep a key's old row beside its new one)."""
    if not is_change_schema(schema):
        return "MergeTree ORDER BY tuple()"
    return (f"ReplacingMergeTree({quote(CREATED_VERSION_COLUMN)}, {quote(CREATED_DELETED_COLUMN)}) "
            f"ORDER BY ({', '.join(quote(name) for name in key)})")

